//! Attacks on the HTTP API's authentication, each next to the legitimate path:
//! a channels WebSocket without credentials (no capability access by kernel id), a
//! client certificate from another CA (refused in the TLS handshake), a plaintext
//! listener on a non-loopback address (refused at startup). Every refusal is counted
//! in `notebookos_http_auth_refusals_total{reason}`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nbos_test_support::{bins::python, daemon::wait_for_endpoint, DaemonConfig, TOKEN};
use notebookosd::link::client::GatewayClient;
use notebookosd::link::tls::client_config;
use notebookosd::pki::Pki;

const NOTEBOOKOSD: &str = env!("CARGO_BIN_EXE_notebookosd");

/// A daemon child process (SIGTERM and reaped on drop) with HTTPS and a client CA.
struct TlsDaemon {
    child: std::process::Child,
    url: String,
    pki: Pki,
    dir: tempfile::TempDir,
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
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("tmp");
        let pki = Pki::at(&dir.path().join("pki"));
        pki.init().expect("pki init");
        let node = pki.issue_node(1, &["localhost".into()], &["127.0.0.1".parse().expect("ip")]).expect("node cert");
        pki.issue_client("jupyter").expect("client cert");
        let token = dir.path().join("token");
        std::fs::write(&token, format!("{TOKEN}\n")).expect("token");
        let mut c = DaemonConfig::new(dir.path());
        c.tokens(&token, None).python(&python()).https(&node.cert, &node.key, &pki.ca_cert());
        let config = c.write(&dir.path().join("c.toml")).expect("config");
        let child = Command::new(NOTEBOOKOSD)
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        let mut d = TlsDaemon { child, url: String::new(), pki, dir };
        d.url = wait_for_endpoint(&d.dir.path().join("run"));
        d
    }

    fn client_files(&self, name: &str) -> (PathBuf, PathBuf) {
        let dir = self.dir.path().join("pki");
        (dir.join(format!("client-{name}.pem")), dir.join(format!("client-{name}.key")))
    }

    fn tls(&self, identity: Option<(&Path, &Path)>) -> Arc<rustls::ClientConfig> {
        client_config(&self.pki.ca_cert(), identity).expect("client config")
    }

    /// `GET path` over HTTPS; the status code.
    fn get(&self, path: &str, token: Option<&str>) -> u16 {
        let agent = ureq::AgentBuilder::new().tls_config(self.tls(None)).build();
        let mut req = agent.get(&format!("{}{path}", self.url));
        if let Some(t) = token {
            req = req.set("Authorization", &format!("token {t}"));
        }
        match req.call() {
            Ok(r) => r.status(),
            Err(ureq::Error::Status(code, _)) => code,
            Err(e) => panic!("GET {path}: {e}"),
        }
    }

    fn metric(&self, name: &str) -> f64 {
        let agent = ureq::AgentBuilder::new().tls_config(self.tls(None)).build();
        let text = agent.get(&format!("{}/metrics", self.url)).call().expect("metrics").into_string().expect("text");
        text.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse().ok()).unwrap_or(0.0)
    }

    fn create_kernel(&self) -> String {
        let agent = ureq::AgentBuilder::new().tls_config(self.tls(None)).timeout(Duration::from_secs(120)).build();
        let model: serde_json::Value = agent
            .post(&format!("{}/api/kernels", self.url))
            .set("Authorization", &format!("token {TOKEN}"))
            .send_json(serde_json::json!({ "name": "python3" }))
            .expect("create kernel")
            .into_json()
            .expect("model");
        model["id"].as_str().expect("id").to_owned()
    }
}

fn status_of(err: &anyhow::Error) -> Option<u16> {
    use tokio_tungstenite::tungstenite::Error as WsError;
    err.chain().find_map(|e| match e.downcast_ref::<WsError>() {
        Some(WsError::Http(r)) => Some(r.status().as_u16()),
        _ => None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channels_websocket_needs_a_token_or_a_client_certificate() {
    let d = tokio::task::spawn_blocking(TlsDaemon::start).await.expect("join");
    let id = {
        let d = &d;
        tokio::task::block_in_place(|| d.create_kernel())
    };
    let refused = "notebookos_http_auth_refusals_total{reason=\"no_credential\"}";
    let before = tokio::task::block_in_place(|| d.metric(refused));

    // Attack: no token, no certificate, for an existing kernel id -> 401, counted.
    let anonymous = GatewayClient::new(&d.url, None).with_tls(d.tls(None));
    let err = anonymous.connect_channels(&id, false).await.expect_err("must be refused");
    assert_eq!(status_of(&err), Some(401), "{err:#}");
    assert_eq!(tokio::task::block_in_place(|| d.metric(refused)) - before, 1.0);
    // And REST without a credential likewise.
    assert_eq!(tokio::task::block_in_place(|| d.get("/api/kernels", None)), 401);

    // Legitimate: the token (JupyterLab's path) ...
    let with_token = GatewayClient::new(&d.url, Some(TOKEN.to_owned())).with_tls(d.tls(None));
    with_token.connect_channels(&id, false).await.expect("the token opens the channels");
    // ... or a client certificate of the client CA and no token (jupyter_server's GatewayKernelClient).
    let (cert, key) = d.client_files("jupyter");
    let with_cert = GatewayClient::new(&d.url, None).with_tls(d.tls(Some((&cert, &key))));
    with_cert.connect_channels(&id, false).await.expect("the client certificate opens the channels");
    assert_eq!(tokio::task::block_in_place(|| d.get("/healthz", None)), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_from_another_ca_is_refused_in_the_handshake() {
    let d = tokio::task::spawn_blocking(TlsDaemon::start).await.expect("join");
    let other_dir = tempfile::tempdir().expect("tmp");
    let other = Pki::at(other_dir.path());
    other.init().expect("other CA");
    let foreign = other.issue_client("mallory").expect("foreign cert");
    let refused = "notebookos_http_auth_refusals_total{reason=\"tls_handshake\"}";
    let before = tokio::task::block_in_place(|| d.metric(refused));

    // The daemon's CA as trust root (the attacker knows it), the foreign CA's certificate as identity.
    let config = client_config(&d.pki.ca_cert(), Some((&foreign.cert, &foreign.key))).expect("config");
    let agent = ureq::AgentBuilder::new().tls_config(config.clone()).build();
    let err = agent.get(&format!("{}/api/kernels", d.url)).call().expect_err("refused");
    assert!(matches!(err, ureq::Error::Transport(_)), "a TLS failure, not an HTTP answer: {err}");
    let ws = GatewayClient::new(&d.url, Some(TOKEN.to_owned())).with_tls(config);
    let id = uuid_like();
    let err = ws.connect_channels(&id, false).await.expect_err("refused");
    assert_eq!(status_of(&err), None, "refused before HTTP: {err:#}");
    // The refusal is counted once the server side has seen the alert (both attempts).
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::task::block_in_place(|| d.metric(refused)) - before < 2.0 {
        assert!(Instant::now() < deadline, "handshake refusals not counted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Legitimate: the same request with the right CA's client certificate.
    let (cert, key) = d.client_files("jupyter");
    let agent = ureq::AgentBuilder::new().tls_config(d.tls(Some((&cert, &key)))).build();
    let code =
        tokio::task::block_in_place(|| agent.get(&format!("{}/api/kernels", d.url)).call().map(|r| r.status()).ok());
    assert_eq!(code, Some(200));
}

fn uuid_like() -> String {
    "0b6c4a83-2a36-4f7e-9d3c-6f2b7f0b9a11".to_owned()
}

#[test]
fn plaintext_on_a_non_loopback_address_is_refused_at_startup() {
    let dir = tempfile::tempdir().expect("tmp");
    let token = dir.path().join("token");
    std::fs::write(&token, format!("{TOKEN}\n")).expect("token");
    let config = |http_keys: &str| {
        let mut c = DaemonConfig::new(dir.path());
        c.tokens(&token, None).listen(SocketAddr::from(([0, 0, 0, 0], 0)));
        c.overlay(&format!("[http]\n{http_keys}")).expect("[http] keys");
        c.write(&dir.path().join("c.toml")).expect("config")
    };
    let out = Command::new(NOTEBOOKOSD).arg("--config").arg(config("")).output().expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("http.tls") && stderr.contains("allow_plaintext"), "{stderr}");
    // Legitimate: behind a TLS-terminating proxy, said so explicitly.
    let out = Command::new(NOTEBOOKOSD)
        .arg("--config")
        .arg(config("allow_plaintext = true\n"))
        .arg("--check-config")
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn nbos_pki_makes_a_ca_and_node_and_client_certificates() {
    use std::os::unix::fs::PermissionsExt;
    let nbos_bin = nbos_test_support::bins::nbos();
    let dir = tempfile::tempdir().expect("tmp");
    let pki = dir.path().join("pki");
    let nbos = |args: &[&str]| Command::new(&nbos_bin).args(args).output().expect("nbos");
    let d = pki.to_str().expect("utf8");
    assert!(nbos(&["pki", "init", "--dir", d]).status.success());
    let again = nbos(&["pki", "init", "--dir", d]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already holds a CA"));
    let out = nbos(&["pki", "issue", "--dir", d, "node", "3", "--ip", "127.0.0.1", "--dns", "h3.example"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(nbos(&["pki", "issue", "--dir", d, "client", "operator"]).status.success());
    let bad = nbos(&["pki", "issue", "--dir", d, "client", "../evil"]);
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("client name"));
    for (file, mode) in [("ca.key", 0o600), ("node-3.key", 0o600), ("client-operator.key", 0o600), ("ca.pem", 0o644)] {
        let m = std::fs::metadata(pki.join(file)).expect(file).permissions().mode() & 0o777;
        assert_eq!(m, mode, "{file}");
    }
    // The node certificate names node-3 and chains to the CA (what raft peers and hosts check).
    let cert = notebookosd::link::tls::load_certs(&pki.join("node-3.pem")).expect("cert").remove(0);
    assert!(notebookosd::link::tls::cert_names_node(&cert, 3));
    assert!(notebookosd::link::tls::chains_to(&cert, &pki.join("ca.pem")).expect("verify"));
}
