//! Hostile or broken peers: each bad input is refused, logged, counted, and the node keeps working.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use raft_store::transport::frame;
use raft_store::{NodeTlsFiles, RaftStore, StoreConfig};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

fn free_addr() -> SocketAddr {
    raft_store::service::free_loopback_addr().expect("free port")
}

const MAX_FRAME: usize = 64 << 10;

async fn open_node(pki: &Path, data: &Path) -> RaftStore {
    let mut cfg = StoreConfig::new(1, data.to_path_buf(), free_addr(), NodeTlsFiles::in_dir(pki, 1).security());
    cfg.tick_interval = Duration::from_millis(20);
    cfg.max_frame_bytes = MAX_FRAME;
    let store = RaftStore::open(cfg).expect("open");
    store.create_group(1, &[1]).await.expect("create group");
    store
}

/// A TLS client presenting node `id`'s certificate from `pki`.
async fn tls_connect(
    pki: &Path,
    id: u64,
    server: SocketAddr,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let files = NodeTlsFiles::in_dir(pki, id);
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&files.ca_cert).expect("ca").flatten() {
        roots.add(c).expect("root");
    }
    let chain: Vec<_> = CertificateDer::pem_file_iter(&files.cert).expect("cert").flatten().collect();
    let key = PrivateKeyDer::from_pem_file(&files.key).expect("key");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .expect("client cert");
    let sock = TcpStream::connect(server).await?;
    let name = ServerName::try_from("node-1").expect("name");
    let mut s = tokio_rustls::TlsConnector::from(Arc::new(cfg)).connect(name, sock).await?;
    // The server's verdict on our certificate arrives after the handshake (TLS 1.3): flush and
    // let the caller observe the close.
    s.flush().await?;
    Ok(s)
}

async fn wait_count(store: &RaftStore, reason: &str, at_least: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.metrics().rejected_count(reason) < at_least {
        assert!(Instant::now() < deadline, "rejection '{reason}' not counted:\n{}", store.metrics_text());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn raft_msg(from: u64, to: u64) -> Vec<u8> {
    let mut m = Message::default();
    m.set_msg_type(MessageType::MsgHeartbeat);
    m.from = from;
    m.to = to;
    m.term = 1;
    m.write_to_bytes().expect("encode")
}

async fn send_after_hello(pki: &Path, store: &RaftStore, hello_id: u64, bytes: &[u8]) {
    let addr = store.config().listen;
    let mut s = tls_connect(pki, 2, addr).await.expect("authenticated connection");
    s.write_all(&frame::hello(hello_id)).await.expect("hello");
    s.write_all(bytes).await.expect("write");
    s.flush().await.expect("flush");
    let _ = s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_frames_and_peers_are_refused_counted_and_harmless() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = dir.path().join("pki");
    let rogue = dir.path().join("rogue");
    raft_store::generate_cluster_pki(&pki, &[1, 2]).expect("pki");
    raft_store::generate_cluster_pki(&rogue, &[2]).expect("rogue pki");
    let store = open_node(&pki, &dir.path().join("data")).await;

    // A peer whose certificate comes from another CA never gets past the handshake.
    let _ = tls_connect(&rogue, 2, store.config().listen).await;
    wait_count(&store, "tls", 1).await;
    // Plain TCP garbage where TLS is expected is a failed handshake too.
    let mut raw = TcpStream::connect(store.config().listen).await.expect("connect");
    raw.write_all(b"GET / HTTP/1.1\r\n\r\n").await.expect("write");
    wait_count(&store, "tls", 2).await;

    // A valid certificate for node 2 that claims to be node 3.
    send_after_hello(&pki, &store, 3, &[]).await;
    wait_count(&store, "identity", 1).await;

    // Garbage frame kind.
    send_after_hello(&pki, &store, 2, &[0, 0, 0, 2, 9, 9]).await;
    wait_count(&store, "garbage", 1).await;
    // A raft frame whose payload is not protobuf.
    let junk = frame::raft(1, &[0xff; 32], MAX_FRAME).expect("frame");
    send_after_hello(&pki, &store, 2, &junk).await;
    wait_count(&store, "garbage", 2).await;
    // Truncated: the header promises more than arrives before the peer hangs up.
    let full = frame::raft(1, &raft_msg(2, 1), MAX_FRAME).expect("frame");
    send_after_hello(&pki, &store, 2, &full[..full.len() - 3]).await;
    wait_count(&store, "truncated", 1).await;
    // Oversized: refused from the length prefix alone.
    let huge = u32::try_from(MAX_FRAME + 1).expect("fits").to_be_bytes();
    send_after_hello(&pki, &store, 2, &huge).await;
    wait_count(&store, "oversized", 1).await;
    // A message for a group this node does not host.
    let unknown = frame::raft(999, &raft_msg(2, 1), MAX_FRAME).expect("frame");
    send_after_hello(&pki, &store, 2, &unknown).await;
    wait_count(&store, "unknown_group", 1).await;
    // A message that claims to come from another node than the authenticated one.
    let spoofed = frame::raft(1, &raft_msg(3, 1), MAX_FRAME).expect("frame");
    send_after_hello(&pki, &store, 2, &spoofed).await;
    wait_count(&store, "wrong_sender", 1).await;

    // The node is unharmed.
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.status(1).await.expect("status").role != "leader" {
        assert!(Instant::now() < deadline, "no leader");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    store.kv(1).put("still", "works").await.expect("put after attacks");
    assert_eq!(store.kv(1).get("still").await.expect("get").map(|k| k.value), Some(b"works".to_vec()));
    let text = store.metrics_text();
    assert!(text.contains("notebookos_raft_transport_rejected_total{reason=\"oversized\"} 1"), "{text}");
}

#[tokio::test]
async fn bad_configuration_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = NodeTlsFiles::in_dir(&dir.path().join("nope"), 1).security();
    let err = RaftStore::open(StoreConfig::new(1, dir.path().join("d"), free_addr(), missing)).expect_err("no certs");
    assert!(err.to_string().contains("nope"), "error names the missing file: {err}");
    let zero = StoreConfig::new(0, dir.path().join("d"), free_addr(), raft_store::TransportSecurity::Plaintext);
    assert!(matches!(RaftStore::open(zero), Err(raft_store::Error::Config(_))));
    let json = r#"{"node_id":1,"data_dir":"/tmp/x","listen":"127.0.0.1:1","security":{"mode":"plaintext"},"bogus":1}"#;
    assert!(serde_json::from_str::<StoreConfig>(json).is_err(), "unknown fields are refused");
    // Plaintext only when the configuration says so: no `security` section is an error, not a default.
    let json = r#"{"node_id":1,"data_dir":"/tmp/x","listen":"127.0.0.1:1"}"#;
    let err = serde_json::from_str::<StoreConfig>(json).expect_err("security must be explicit");
    assert!(err.to_string().contains("security"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_api_refuses_bad_requests_and_keeps_serving() {
    use raft_store::service::{NodeClient, NodeServiceConfig, Request, MAX_REQUEST_BYTES};
    use tokio::io::{AsyncBufReadExt, BufReader};

    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = StoreConfig::new(1, dir.path().join("d"), free_addr(), raft_store::TransportSecurity::Plaintext);
    store.tick_interval = Duration::from_millis(20);
    let client_listen = free_addr();
    let cfg = NodeServiceConfig { store, client_listen, bootstrap_groups: vec![1], bootstrap_voters: vec![1] };
    let node = tokio::spawn(raft_store::service::run_node(cfg));
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut client = loop {
        if let Ok(c) = NodeClient::connect(client_listen).await {
            break c;
        }
        assert!(Instant::now() < deadline, "node service did not start");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };

    async fn raw(addr: SocketAddr, bytes: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(bytes).await.expect("write");
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).await.expect("read");
        line
    }
    let garbage = raw(client_listen, b"{not json\n").await;
    assert!(garbage.contains("bad_request") && garbage.contains("cannot parse"), "{garbage}");
    let unknown = raw(client_listen, b"{\"op\":\"explode\"}\n").await;
    assert!(unknown.contains("bad_request"), "{unknown}");
    let bad_txn =
        raw(client_listen, b"{\"op\":\"txn\",\"group\":1,\"compares\":[{\"is\":\"bigger\",\"key\":\"k\"}]}\n").await;
    assert!(bad_txn.contains("bad_request") && bad_txn.contains("bigger"), "{bad_txn}");
    let mut long = vec![b'x'; MAX_REQUEST_BYTES + 10];
    long.push(b'\n');
    let too_long = raw(client_listen, &long).await;
    assert!(too_long.contains("bad_request") && too_long.contains("longer than"), "{too_long}");
    let r = client
        .call(&Request::Put { group: 7, key: "k".into(), value: "v".into() }, Duration::from_secs(5))
        .await
        .expect("answer");
    assert_eq!(r.error_kind(), Some("group_not_found"));

    // Still serving: a put on the bootstrap group goes through once it has a leader.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = client
            .call(&Request::Put { group: 1, key: "k".into(), value: "v".into() }, Duration::from_secs(5))
            .await
            .expect("answer");
        if r.ok {
            break;
        }
        assert_eq!(r.error_kind(), Some("not_leader"), "{r:?}");
        assert!(Instant::now() < deadline, "no leader");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A transaction through the client API: the compare fails the second time.
    for expect in [true, false] {
        let txn = Request::Txn {
            group: 1,
            compares: vec![raft_store::service::TxnCompare::Absent { key: "t".into() }],
            success: vec![raft_store::service::TxnStep::Put { key: "t".into(), value: "1".into(), lease: None }],
            failure: vec![],
        };
        let r = client.call(&txn, Duration::from_secs(5)).await.expect("answer");
        assert!(r.ok, "{r:?}");
        assert_eq!(r.result["succeeded"].as_bool(), Some(expect), "{r:?}");
    }
    node.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_connections_are_capped_and_their_hello_size_checked() {
    use raft_store::transport::MAX_PENDING_HANDSHAKES;
    // Plaintext: nothing authenticates a peer before its HELLO, so the HELLO's size and the number
    // of connections still saying nothing are what bound memory.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = StoreConfig::new(1, dir.path().join("d"), free_addr(), raft_store::TransportSecurity::Plaintext);
    cfg.tick_interval = Duration::from_millis(20);
    let store = RaftStore::open(cfg).expect("open");
    store.create_group(1, &[1]).await.expect("create group");
    let addr = store.config().listen;

    // A first frame claiming a megabyte is refused from its length prefix.
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(&(1u32 << 20).to_be_bytes()).await.expect("write");
    wait_count(&store, "oversized", 1).await;

    // Connections that never say HELLO: beyond the cap they are closed on accept.
    let mut idle = Vec::new();
    for _ in 0..MAX_PENDING_HANDSHAKES + 8 {
        idle.push(TcpStream::connect(addr).await.expect("connect"));
    }
    wait_count(&store, "handshake_limit", 1).await;
    drop(idle);

    // Once they are gone, a well-behaved peer is served again.
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.metrics().rejected_count("unknown_group") == 0 {
        assert!(Instant::now() < deadline, "a peer is not served after the flood:\n{}", store.metrics_text());
        // Until the flood's connections are noticed closed, this one may be refused: try again.
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let _ = s.write_all(&frame::hello(2)).await;
        let _ = s.write_all(&frame::raft(999, &raft_msg(2, 1), MAX_FRAME).expect("frame")).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.status(1).await.expect("status").role != "leader" {
        assert!(Instant::now() < deadline, "no leader");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    store.kv(1).put("still", "works").await.expect("put after the flood");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_requests_are_refused_before_decoding_unless_authenticated_and_within_the_cap() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = dir.path().join("pki");
    let rogue = dir.path().join("rogue");
    raft_store::generate_cluster_pki(&pki, &[1, 2]).expect("pki");
    raft_store::generate_cluster_pki(&rogue, &[2]).expect("rogue pki");
    let store = open_node(&pki, &dir.path().join("data")).await;
    let addr = store.config().listen;
    let forward = frame::forward(1, &[0xff; 64], MAX_FRAME).expect("frame");

    // A peer with a certificate from another CA never gets to send its forwarded request.
    if let Ok(mut s) = tls_connect(&rogue, 2, addr).await {
        let _ = s.write_all(&frame::hello(2)).await;
        let _ = s.write_all(&forward).await;
        let _ = s.flush().await;
    }
    wait_count(&store, "tls", 1).await;
    // Nor does one that speaks no TLS at all.
    let mut raw = TcpStream::connect(addr).await.expect("connect");
    let _ = raw.write_all(&frame::hello(2)).await;
    let _ = raw.write_all(&forward).await;
    wait_count(&store, "tls", 2).await;
    // Authenticated, but a forwarded request in place of the HELLO: refused from its length prefix.
    let mut s = tls_connect(&pki, 2, addr).await.expect("authenticated connection");
    s.write_all(&forward).await.expect("write");
    s.flush().await.expect("flush");
    wait_count(&store, "oversized", 1).await;
    // After the HELLO: a forwarded request over the cap is refused from its length prefix alone.
    let mut huge = u32::try_from(MAX_FRAME + 1).expect("fits").to_be_bytes().to_vec();
    huge.push(4); // the FORWARD kind: never looked at
    send_after_hello(&pki, &store, 2, &huge).await;
    wait_count(&store, "oversized", 2).await;
    // After the HELLO and within the cap: a body that is not a request is refused, not served.
    send_after_hello(&pki, &store, 2, &forward).await;
    wait_count(&store, "garbage", 1).await;
    let bad_answer = frame::answer(1, &[0xff; 16], MAX_FRAME).expect("frame");
    send_after_hello(&pki, &store, 2, &bad_answer).await;
    wait_count(&store, "garbage", 2).await;
    // A forwarding frame too short for its request id.
    send_after_hello(&pki, &store, 2, &[0, 0, 0, 3, 4, 0, 0]).await;
    wait_count(&store, "garbage", 3).await;

    let text = store.metrics_text();
    assert!(!text.contains("notebookos_raft_forward_served_requests_total{"), "nothing was served:\n{text}");
    // The node is unharmed.
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.status(1).await.expect("status").role != "leader" {
        assert!(Instant::now() < deadline, "no leader");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    store.kv(1).put("still", "works").await.expect("put after attacks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_peer_cannot_forward_before_its_hello() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = StoreConfig::new(1, dir.path().join("d"), free_addr(), raft_store::TransportSecurity::Plaintext);
    cfg.tick_interval = Duration::from_millis(20);
    let store = RaftStore::open(cfg).expect("open");
    let addr = store.config().listen;
    // A short forwarding frame that fits a HELLO's size: refused as "not a HELLO".
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(&frame::forward(1, &[1, 2], MAX_FRAME).expect("frame")).await.expect("write");
    wait_count(&store, "garbage", 1).await;
    // A longer one: refused from its length prefix.
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(&frame::forward(1, &[0; 100], MAX_FRAME).expect("frame")).await.expect("write");
    wait_count(&store, "oversized", 1).await;
    assert!(!store.metrics_text().contains("notebookos_raft_forward_served_requests_total{"));
}
