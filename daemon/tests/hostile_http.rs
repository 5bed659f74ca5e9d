//! Hostile HTTP and WebSocket clients (issue 29): each attack reproduced against a real
//! daemon, next to a legitimate client that must still be served.
//!
//! - a WebSocket message over `limits.websocket_max_message_bytes` (16 MB, over the
//!   default) closes its socket with 1009 and a reason naming the key; a large message
//!   under the cap still reaches the kernel;
//! - half-sent requests are closed after `http.header_read_timeout`;
//! - a body that stops arriving is closed after `http.idle_timeout`;
//! - connections over `http.max_connections_per_source` and `http.max_connections` are
//!   closed at accept and counted, while other sources are served;
//! - TLS connections that never handshake count against the caps and are closed.
//!
//! Waits are bounded by [`WAIT`] only so that a regression fails instead of hanging;
//! nothing asserts how long anything took.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use nbos_test_support::{daemon::wait_for_endpoint, http, run_cell, start_daemon, Daemon, DaemonConfig, TOKEN};
use notebookosd::config::HttpTlsConfig;
use notebookosd::link::client::GatewayClient;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message as WsFrame;

const NOTEBOOKOSD: &str = env!("CARGO_BIN_EXE_notebookosd");

/// Upper bound on any one wait (a hang fails the test instead of hanging it).
const WAIT: Duration = Duration::from_secs(60);

/// What each half-sent request carries: a request line and 60 KB of one header, never ended.
fn half_request() -> Vec<u8> {
    let mut r = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: ".to_vec();
    r.extend(std::iter::repeat_n(b'a', 60_000));
    r
}

fn refusals(url: &str, reason: &str) -> f64 {
    let (_, text) = http("GET", &format!("{url}/metrics"), None, None);
    let prefix = format!("notebookos_refused_total{{reason=\"{reason}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|v| v.trim().parse().ok()).unwrap_or(0.0)
}

fn addr_of(url: &str) -> SocketAddr {
    url.rsplit("//").next().and_then(|a| a.parse().ok()).expect("an ip:port URL")
}

/// A TCP connection to `to` from loopback address `from` (127.0.0.0/8 is all this host's).
async fn connect_from(from: [u8; 4], to: SocketAddr) -> TcpStream {
    let s = TcpSocket::new_v4().expect("socket");
    s.bind(SocketAddr::from((from, 0))).expect("bind a loopback source");
    s.connect(to).await.expect("connect")
}

/// Reads until the server closes the connection; panics if it stays open past [`WAIT`].
async fn closed_by_server<S: AsyncRead + Unpin>(s: &mut S, what: &str) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match tokio::time::timeout(WAIT, s.read(&mut buf)).await {
            Err(_) => panic!("{what}: the server kept the connection open"),
            // EOF, or a reset (the server closed with our bytes unread).
            Ok(Ok(0) | Err(_)) => return,
            Ok(Ok(_)) => continue,
        }
    }
}

/// `GET /healthz` on `s` (plain or TLS); the status line.
async fn healthz<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) -> String {
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.expect("write");
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut out)).await.expect("answered in time").expect("read");
    String::from_utf8_lossy(&out).lines().next().unwrap_or_default().to_owned()
}

async fn healthz_from(from: [u8; 4], to: SocketAddr) -> String {
    healthz(&mut connect_from(from, to).await).await
}

/// Retries `GET /healthz` from `from` until it is served (slots come back as the server
/// notices closed connections).
async fn served_again(from: [u8; 4], to: SocketAddr) {
    tokio::time::timeout(WAIT, async {
        loop {
            let s = TcpSocket::new_v4().expect("socket");
            s.bind(SocketAddr::from((from, 0))).expect("bind");
            if let Ok(mut c) = s.connect(to).await {
                let mut out = Vec::new();
                let asked = c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
                if asked.is_ok() && c.read_to_end(&mut out).await.is_ok() && out.starts_with(b"HTTP/1.1 200") {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the source is served again once its connections closed");
}

fn start(http_keys: &str) -> Daemon {
    start_daemon(&[], Stdio::null(), |c| {
        c.overlay(&format!("[http]\n{http_keys}")).expect("[http] keys");
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_websocket_message_closes_its_socket_and_the_kernel_serves_others() {
    // Default limits: the 16 MB message is over the default cap (the attack of issue 29
    // was a 16 MB frame against the old 256 MiB default).
    let d = start("");
    let url = d.url.clone();
    let u = url.clone();
    let kernel = tokio::task::spawn_blocking(move || {
        let (code, body) = http("POST", &format!("{u}/api/kernels"), Some(TOKEN), Some(r#"{"name":"python3"}"#));
        assert_eq!(code, 201, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).expect("json")["id"].as_str().expect("id").to_owned()
    })
    .await
    .expect("join");
    let client = GatewayClient::new(&url, Some(TOKEN.to_owned()));
    let attacker = client.connect_channels(&kernel, false).await.expect("attacker's socket");
    let bystander = client.connect_channels(&kernel, false).await.expect("another client's socket");

    let before = tokio::task::block_in_place(|| refusals(&url, "websocket_message_too_large"));
    let (mut tx, mut rx) = attacker.split();
    let big = format!("{{\"content\":{{\"pad\":[{}0]}}}}", "0,".repeat(8_000_000));
    // The server may close before it has read the whole message: the send can fail.
    let _ = tx.send(WsFrame::Text(big.into())).await;
    let close = loop {
        match tokio::time::timeout(WAIT, rx.next()).await.expect("closed in time") {
            Some(Ok(WsFrame::Close(frame))) => break frame.expect("a close frame with a reason"),
            Some(Ok(_)) => continue,
            other => panic!("expected a close frame, got {other:?}"),
        }
    };
    assert_eq!(close.code, CloseCode::Size);
    assert!(close.reason.contains("limits.websocket_max_message_bytes"), "{}", close.reason);
    assert_eq!(tokio::task::block_in_place(|| refusals(&url, "websocket_message_too_large")) - before, 1.0);

    // The daemon keeps serving: the other socket, new ones, and a large message under the cap.
    drop(bystander);
    assert_eq!(run_cell(&url, TOKEN, &kernel, "1 + 1").await.value(), "2");
    let n = 4 << 20;
    let code = format!("len('{}')", "x".repeat(n));
    assert_eq!(
        run_cell(&url, TOKEN, &kernel, &code).await.value(),
        n.to_string(),
        "a 4 MiB cell reaches the kernel whole"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_requests_are_closed_after_the_header_timeout() {
    let d = start("header_read_timeout = \"1s\"\n");
    let to = addr_of(&d.url);
    let before = tokio::task::block_in_place(|| refusals(&d.url, "http_header_timeout"));
    let mut held = Vec::new();
    for _ in 0..20 {
        let mut c = connect_from([127, 0, 0, 2], to).await;
        c.write_all(&half_request()).await.expect("send part of a head");
        held.push(c);
    }
    for (i, c) in held.iter_mut().enumerate() {
        closed_by_server(c, &format!("half-sent request {i}")).await;
    }
    let timed_out = tokio::task::block_in_place(|| refusals(&d.url, "http_header_timeout")) - before;
    assert!(timed_out >= 20.0, "{timed_out} header timeouts counted");
    assert!(healthz_from([127, 0, 0, 2], to).await.starts_with("HTTP/1.1 200"), "a whole request is still served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stops_arriving_is_closed_after_the_idle_timeout() {
    let d = start("idle_timeout = \"1s\"\n");
    let before = tokio::task::block_in_place(|| refusals(&d.url, "http_idle_timeout"));
    let mut c = connect_from([127, 0, 0, 2], addr_of(&d.url)).await;
    let head = format!(
        "POST /api/kernels HTTP/1.1\r\nHost: x\r\nAuthorization: token {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"name\":"
    );
    c.write_all(head.as_bytes()).await.expect("send the head and part of the body");
    closed_by_server(&mut c, "a stalled body").await;
    assert_eq!(tokio::task::block_in_place(|| refusals(&d.url, "http_idle_timeout")) - before, 1.0);
    let (code, _) = tokio::task::block_in_place(|| http("GET", &format!("{}/api/kernels", d.url), Some(TOKEN), None));
    assert_eq!(code, 200, "other clients are served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_caps_are_refused_while_other_sources_are_served() {
    // A long header timeout: what closes the connections below is the caps. A fresh daemon
    // has no other connection open (and no refusal counted) until the metrics are read.
    let d = start("header_read_timeout = \"10m\"\nmax_connections = 12\nmax_connections_per_source = 8\n");
    let to = addr_of(&d.url);

    // Eight half-sent requests from one source fill its cap: a ninth is closed at accept.
    let mut attacker = Vec::new();
    for _ in 0..8 {
        let mut c = connect_from([127, 0, 0, 2], to).await;
        c.write_all(&half_request()).await.expect("send part of a head");
        attacker.push(c);
    }
    let mut ninth = connect_from([127, 0, 0, 2], to).await;
    closed_by_server(&mut ninth, "a ninth connection from one source").await;

    // Four more from a second source fill the host's cap: a third source is closed at accept.
    let mut second = Vec::new();
    for _ in 0..4 {
        let mut c = connect_from([127, 0, 0, 3], to).await;
        c.write_all(&half_request()).await.expect("send part of a head");
        second.push(c);
    }
    let mut over = connect_from([127, 0, 0, 4], to).await;
    closed_by_server(&mut over, "a connection over http.max_connections").await;

    // Once the second source lets go, other sources are served while the first is still capped.
    drop(second);
    served_again([127, 0, 0, 1], to).await;
    let mut still = connect_from([127, 0, 0, 2], to).await;
    closed_by_server(&mut still, "the capped source, again").await;
    let (per_source, total) = tokio::task::block_in_place(|| {
        (refusals(&d.url, "http_connections_per_source"), refusals(&d.url, "http_connections"))
    });
    assert_eq!(per_source, 2.0, "the ninth and the last connection of the capped source");
    assert!(total >= 1.0, "{total}");

    // The attacker gives up: its places come back.
    drop(attacker);
    served_again([127, 0, 0, 2], to).await;
}

/// A daemon with HTTPS (its own PKI), `http_keys` added to `[http]`.
struct TlsDaemon {
    child: std::process::Child,
    url: String,
    ca: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for TlsDaemon {
    fn drop(&mut self) {
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill(2) on our own unreaped child.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let _ = self.child.wait();
    }
}

impl TlsDaemon {
    fn start(http_keys: &str) -> Self {
        let dir = tempfile::tempdir().expect("tmp");
        let pki = notebookosd::pki::Pki::at(&dir.path().join("pki"));
        pki.init().expect("pki init");
        let node = pki.issue_node(1, &["localhost".into()], &["127.0.0.1".parse().expect("ip")]).expect("node cert");
        let token = dir.path().join("token");
        std::fs::write(&token, format!("{TOKEN}\n")).expect("token");
        let mut c = DaemonConfig::new(dir.path());
        c.tokens(&token, None).config.http.tls =
            Some(HttpTlsConfig { cert: node.cert, key: node.key, client_ca: None });
        c.overlay(&format!("[http]\n{http_keys}")).expect("[http] keys");
        let config = c.write(&dir.path().join("c.toml")).expect("config");
        let child =
            Command::new(NOTEBOOKOSD).arg("--config").arg(&config).stdout(Stdio::null()).stderr(Stdio::null()).spawn();
        let mut d = TlsDaemon { child: child.expect("spawn"), url: String::new(), ca: pki.ca_cert(), _dir: dir };
        d.url = wait_for_endpoint(&d._dir.path().join("run"));
        d
    }

    fn connector(&self) -> tokio_rustls::TlsConnector {
        let config = notebookosd::link::tls::client_config(&self.ca, None).expect("client config");
        tokio_rustls::TlsConnector::from(config)
    }

    /// `notebookos_refused_total{reason}` over HTTPS.
    async fn refusals(&self, reason: &str) -> f64 {
        let tcp = connect_from([127, 0, 0, 1], addr_of(&self.url.replacen("https", "http", 1))).await;
        let name = rustls::pki_types::ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
        let mut tls = self.connector().connect(name, tcp).await.expect("handshake");
        tls.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.expect("write");
        let mut out = Vec::new();
        tokio::time::timeout(WAIT, tls.read_to_end(&mut out)).await.expect("in time").expect("read");
        let prefix = format!("notebookos_refused_total{{reason=\"{reason}\"}} ");
        String::from_utf8_lossy(&out)
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_connections_that_never_handshake_are_capped_and_closed() {
    let d = tokio::task::spawn_blocking(|| {
        TlsDaemon::start("header_read_timeout = \"1s\"\nmax_connections_per_source = 4\nmax_connections = 64\n")
    })
    .await
    .expect("join");
    let to = addr_of(&d.url.replacen("https", "http", 1));
    let before = d.refusals("http_connections_per_source").await;
    // Four connections that send nothing hold their source's places…
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(connect_from([127, 0, 0, 2], to).await);
    }
    // …so a fifth is closed at accept,
    let mut fifth = connect_from([127, 0, 0, 2], to).await;
    closed_by_server(&mut fifth, "a fifth connection from one source").await;
    assert_eq!(d.refusals("http_connections_per_source").await - before, 1.0);
    // and the silent ones are closed once their handshake time is over.
    for (i, c) in silent.iter_mut().enumerate() {
        closed_by_server(c, &format!("silent TLS connection {i}")).await;
    }
    // The source is served again, over a real handshake.
    let name = rustls::pki_types::ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
    let served = tokio::time::timeout(WAIT, async {
        loop {
            let tcp = connect_from([127, 0, 0, 2], to).await;
            if let Ok(mut tls) = d.connector().connect(name.clone(), tcp).await {
                return healthz(&mut tls).await;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("a handshaking client from the same source is served");
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");
}
