//! The one `run_cell`: runs code in a kernel over its channels WebSocket (the JSON
//! encoding) to its `execute_reply` and `idle`, and collects what the cell produced.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message as WsFrame;

/// How long a cell may take before [`run_cell`] fails the test.
pub const CELL_TIMEOUT: Duration = Duration::from_secs(120);

/// What one cell produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CellOutcome {
    /// `execute_reply`'s `content.status` (`ok`, `error`, `aborted`).
    pub status: String,
    /// The `execute_result`'s `text/plain`.
    pub result: Option<String>,
    /// An `error` message as `ename: evalue` (both JSON-quoted).
    pub error: Option<String>,
    /// The cell's `stream` output (stdout and stderr) in order.
    pub stdout: String,
}

impl CellOutcome {
    /// The error if the cell raised one, else its result's text (empty if none).
    pub fn value(&self) -> String {
        self.error.clone().or_else(|| self.result.clone()).unwrap_or_default()
    }
}

/// The `ws://…/api/kernels/{kernel}/channels?token=…` URL of a kernel on the daemon at `url`.
pub fn channels_url(url: &str, token: &str, kernel: &str) -> String {
    format!("{}/api/kernels/{kernel}/channels?token={token}", url.replacen("http", "ws", 1))
}

/// Connects to `kernel`'s channels on the daemon at `url` (plain HTTP) and runs `code`.
pub async fn run_cell(url: &str, token: &str, kernel: &str, code: &str) -> CellOutcome {
    let (socket, _) = tokio_tungstenite::connect_async(channels_url(url, token, kernel)).await.expect("websocket");
    let (mut tx, mut rx) = socket.split();
    run_cell_on(&mut tx, &mut rx, code).await
}

/// Runs `code` over an open channels WebSocket (JSON encoding), split into `tx` and `rx`.
pub async fn run_cell_on<Tx, Rx>(tx: &mut Tx, rx: &mut Rx, code: &str) -> CellOutcome
where
    Tx: futures_util::Sink<WsFrame> + Unpin,
    Tx::Error: std::fmt::Debug,
    Rx: futures_util::Stream<Item = Result<WsFrame, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    let msg_id = uuid::Uuid::new_v4().to_string();
    let req = serde_json::json!({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "session": "s", "version": "5.3"},
        "parent_header": {}, "metadata": {}, "content": {"code": code, "silent": false},
    });
    tx.send(WsFrame::Text(req.to_string().into())).await.expect("send the cell");
    let mut out = CellOutcome::default();
    let (mut replied, mut idle) = (false, false);
    let deadline = tokio::time::Instant::now() + CELL_TIMEOUT;
    while !replied || !idle {
        let frame = tokio::time::timeout_at(deadline, rx.next())
            .await
            .expect("the cell's reply in time")
            .expect("the WebSocket open")
            .expect("a frame");
        let WsFrame::Text(t) = frame else { continue };
        let v: serde_json::Value = serde_json::from_str(t.as_str()).expect("JSON message");
        if v["parent_header"]["msg_id"] != msg_id.as_str() {
            continue;
        }
        match v["msg_type"].as_str() {
            Some("execute_result") => out.result = v["content"]["data"]["text/plain"].as_str().map(str::to_owned),
            Some("error") => out.error = Some(format!("{}: {}", v["content"]["ename"], v["content"]["evalue"])),
            Some("stream") => out.stdout.push_str(v["content"]["text"].as_str().unwrap_or("")),
            Some("status") => idle |= v["content"]["execution_state"] == "idle",
            Some("execute_reply") => {
                replied = true;
                v["content"]["status"].as_str().unwrap_or_default().clone_into(&mut out.status);
            }
            _ => {}
        }
    }
    out
}
