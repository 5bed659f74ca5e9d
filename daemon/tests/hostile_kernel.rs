//! A hostile notebook against its own daemon (issue 29): code in a cell writes to the
//! kernel's sockets to the daemon directly. Before the fix, one ZMQ frame header claiming
//! 2^62 bytes aborted notebookosd ("memory allocation of 4611686018427453449 bytes
//! failed") and every kernel of the host died with it. Now that kernel is cut off and
//! killed, the kill is counted, and the daemon and its other kernels go on.

use std::process::Stdio;
use std::time::{Duration, Instant};

use nbos_test_support::{http, run_cell, start_daemon, TOKEN};

/// Writes a frame header announcing 2^62 bytes on every TCP connection of the kernel
/// process (its sockets to the daemon), as any notebook user can.
const ATTACK: &str = r#"
import os, socket
hit = 0
for name in os.listdir('/proc/self/fd'):
    try:
        s = socket.socket(fileno=os.dup(int(name)))
    except (OSError, ValueError):
        continue
    try:
        if s.family == socket.AF_INET and s.type == socket.SOCK_STREAM:
            s.getpeername()
            s.send(b"\x02" + (1 << 62).to_bytes(8, "big"))
            hit += 1
    except OSError:
        pass
    finally:
        s.close()
hit
"#;

fn create_kernel(url: &str) -> (String, u32) {
    let (status, body) = http("POST", &format!("{url}/api/kernels"), Some(TOKEN), Some(r#"{"name":"python3"}"#));
    assert_eq!(status, 201, "{body}");
    let model: serde_json::Value = serde_json::from_str(&body).expect("model");
    let id = model["id"].as_str().expect("id").to_owned();
    let pid = model["pids"][0].as_u64().and_then(|p| u32::try_from(p).ok()).expect("pid");
    (id, pid)
}

/// Sends `code` to run in `kernel` and returns once the kernel has started it (its `busy`
/// status), without waiting for a reply (a kernel that the daemon kills never sends one).
async fn start_cell(url: &str, kernel: &str, code: &str) {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message as WsFrame;
    let ws = format!("{}/api/kernels/{kernel}/channels?token={TOKEN}", url.replacen("http", "ws", 1));
    let (mut socket, _) = tokio_tungstenite::connect_async(ws).await.expect("websocket");
    let msg_id = uuid::Uuid::new_v4().to_string();
    let req = serde_json::json!({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "session": "s", "version": "5.3"},
        "parent_header": {}, "metadata": {}, "content": {"code": code, "silent": false},
    });
    socket.send(WsFrame::Text(req.to_string().into())).await.expect("send");
    let started = async {
        while let Some(Ok(frame)) = socket.next().await {
            let WsFrame::Text(t) = frame else { continue };
            let v: serde_json::Value = serde_json::from_str(t.as_str()).expect("json");
            if v["parent_header"]["msg_id"] == msg_id.as_str() && v["content"]["execution_state"] == "busy" {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), started).await.expect("the kernel started the cell");
}

fn metric(url: &str, line_prefix: &str) -> f64 {
    let (status, text) = http("GET", &format!("{url}/metrics"), Some(TOKEN), None);
    assert_eq!(status, 200);
    text.lines()
        .find(|l| l.starts_with(line_prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_that_sends_a_giant_frame_header_to_its_daemon_kills_its_kernel_not_the_daemon() {
    let mut d = start_daemon(&[], Stdio::inherit(), |c| c.config.kernel.prewarm_max = 0);
    let url = d.url.clone();
    let (hostile, hostile_pid) = create_kernel(&url);
    let (neighbour, _) = create_kernel(&url);
    assert_eq!(run_cell(&url, TOKEN, &neighbour, "x = 41\nx + 1").await.value(), "42");

    start_cell(&url, &hostile, ATTACK).await;

    // The hostile kernel's process is killed (the daemon may start a new one for it).
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::path::Path::new(&format!("/proc/{hostile_pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{hostile_pid}/stat")).unwrap_or_default().contains(") Z ")
    {
        assert!(d.child.try_wait().expect("wait").is_none(), "the daemon died");
        assert!(Instant::now() < deadline, "the kernel that broke the protocol was not killed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(d.child.try_wait().expect("wait").is_none(), "the daemon died");
    let (status, _) = http("GET", &format!("{url}/api/kernels"), Some(TOKEN), None);
    assert_eq!(status, 200, "the daemon answers");
    // The neighbour kept its state and runs cells.
    assert_eq!(run_cell(&url, TOKEN, &neighbour, "x + 2").await.value(), "43");
    let violations = metric(&url, r#"notebookos_messages_dropped_total{source="kernel",reason="protocol_violation"}"#);
    assert!(violations >= 1.0, "the violation is not counted");
}
