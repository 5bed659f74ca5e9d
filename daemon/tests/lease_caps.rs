//! The lease socket is world-writable: connections beyond its caps (in total, per peer
//! uid) are refused at once and counted, the ones within keep being served, and a slot
//! comes back when its connection ends.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nbos_lease_proto::{read_message, write_message, Message};
use notebookosd::gpu::control::GpuControl;
use notebookosd::lease::metrics::LeaseMetrics;
use notebookosd::lease::table::Policy;
use notebookosd::lease::{ConnectionLimits, LeaseServer, LeaseServerConfig, RegisteredProcess};

/// Upper bound on waiting for the server (a hang fails the test instead of hanging it).
const WAIT: Duration = Duration::from_secs(30);
const KERNEL: &str = "k-caps";

struct Host {
    _dir: tempfile::TempDir,
    server: LeaseServer,
    metrics: LeaseMetrics,
}

/// A lease server (no GPUs) with `limits`, where this test process is a kernel process.
fn host(limits: ConnectionLimits) -> Host {
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics = LeaseMetrics::default();
    let cfg = LeaseServerConfig {
        socket: dir.path().join("lease.sock"),
        policy: Policy { idle_grace: Duration::from_secs(60), idle_release: Duration::from_secs(600) },
        activity_interval: Duration::from_millis(100),
        memory_limit_bytes: 0,
        driver_path: PathBuf::from("/nonexistent/libcuda.so.1"),
    };
    let control = GpuControl::new(None, metrics.clone());
    let server =
        LeaseServer::start_with_limits(cfg, Vec::new(), control, metrics.clone(), limits).expect("lease server");
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    server.register_process(RegisteredProcess {
        kernel_id: KERNEL.into(),
        replica: 0,
        pid: std::process::id(),
        uid,
        gpus: 0,
    });
    Host { _dir: dir, server, metrics }
}

impl Host {
    fn connect(&self) -> UnixStream {
        let s = UnixStream::connect(self.server.socket()).expect("connect");
        s.set_read_timeout(Some(WAIT)).expect("read timeout");
        s
    }

    /// A connection that completed the shim's handshake, or the reason it was refused.
    fn register(&self) -> Result<UnixStream, String> {
        let mut s = self.connect();
        let reg = Message::Register { kernel_id: KERNEL.into(), replica: 0, pid: std::process::id() };
        // A refused connection may be closed before Register is written (EPIPE); its
        // `Refused` frame is still there to read.
        let _ = write_message(&mut s, &reg);
        match read_message(&mut s) {
            Ok(Message::Registered { .. }) => Ok(s),
            Ok(Message::Refused { reason }) => Err(reason),
            Ok(other) => panic!("expected Registered or Refused, got {other:?}"),
            Err(e) => Err(format!("connection ended: {e}")),
        }
    }

    /// The metrics as Prometheus renders them (what an operator scrapes).
    fn exposition(&self) -> String {
        let mut registry = prometheus_client::registry::Registry::default();
        self.metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode metrics");
        text
    }

    /// Waits until a new connection completes the handshake again (a slot was given back).
    fn register_again(&self) -> UnixStream {
        let deadline = Instant::now() + WAIT;
        loop {
            match self.register() {
                Ok(s) => return s,
                // Still over the cap: the slot is given back when the server's thread
                // for the closed connection ends.
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                Err(reason) => panic!("no slot came back: {reason}"),
            }
        }
    }
}

/// A connection over a cap gets `Refused` (the reason names the cap) and is closed.
fn assert_refused_and_closed(mut s: UnixStream, want: &str) {
    match read_message(&mut s) {
        Ok(Message::Refused { reason }) => assert!(reason.contains(want), "{reason}"),
        other => panic!("expected Refused, got {other:?}"),
    }
    let mut rest = [0u8; 16];
    match s.read(&mut rest) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("expected the server to close the connection, got {other:?}"),
    }
}

#[test]
fn connections_over_the_per_uid_cap_are_refused_until_one_closes() {
    let host = host(ConnectionLimits { total: 100, per_uid: 3 });
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let served = host.register().expect("a shim's handshake within the cap");
    let idle = [host.connect(), host.connect()];

    assert_refused_and_closed(host.connect(), &format!("too many lease connections from uid {uid} (limit 3)"));
    // Connections are accepted in order: the three before it are all counted now.
    let text = host.exposition();
    assert!(text.contains("notebookos_lease_connections_refused_total{reason=\"per_uid\"} 1"), "{text}");
    assert!(!text.contains("reason=\"total\"} 1"), "{text}");
    assert!(text.contains("notebookos_lease_connections 3"), "{text}");
    // The connections within the cap are left open.
    served.set_nonblocking(true).expect("nonblocking");
    let mut buf = [0u8; 16];
    let open = (&served).read(&mut buf);
    assert!(matches!(&open, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock), "{open:?}");

    drop(served);
    let again = host.register_again();
    drop((again, idle));
    let deadline = Instant::now() + WAIT;
    while host.metrics.connections.get() != 0 {
        assert!(Instant::now() < deadline, "connections still counted: {}", host.metrics.connections.get());
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn connections_over_the_total_cap_are_refused_until_one_closes() {
    let host = host(ConnectionLimits { total: 2, per_uid: 10 });
    let served = host.register().expect("a shim's handshake within the cap");
    let _idle = host.connect();

    assert_refused_and_closed(host.connect(), "too many lease connections (limit 2)");
    let text = host.exposition();
    assert!(text.contains("notebookos_lease_connections_refused_total{reason=\"total\"} 1"), "{text}");
    assert!(!text.contains("reason=\"per_uid\"} 1"), "{text}");
    assert!(text.contains("notebookos_lease_connections 2"), "{text}");

    drop(served);
    let _again = host.register_again();
}
