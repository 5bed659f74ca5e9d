//! `run_cell` for the tests: runs code in a kernel over its channels WebSocket (the JSON
//! encoding) to its `execute_reply` and `idle`, through the same [`CellReader`] as
//! [`crate::cell_client::CellClient`], and sums up what the cell produced.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use notebookosd::jupyter::Channel;
use tokio_tungstenite::tungstenite::Message as WsFrame;

use crate::cell_reader::{CellReader, CellRun};

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

impl From<CellRun> for CellOutcome {
    fn from(run: CellRun) -> Self {
        let error = run.errors.last().map(|e| format!("{}: {}", e["ename"], e["evalue"]));
        let status = run.reply["status"].as_str().unwrap_or_default().to_owned();
        Self { status, result: run.result, error, stdout: run.output }
    }
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
    let sent = std::time::Instant::now();
    tx.send(WsFrame::Text(req.to_string().into())).await.expect("send the cell");
    let mut reader = CellReader::new(sent);
    let deadline = tokio::time::Instant::now() + CELL_TIMEOUT;
    while !reader.done() {
        let frame = tokio::time::timeout_at(deadline, rx.next())
            .await
            .expect("the cell's reply in time")
            .expect("the WebSocket open")
            .expect("a frame");
        let WsFrame::Text(t) = frame else { continue };
        let mut v: serde_json::Value = serde_json::from_str(t.as_str()).expect("JSON message");
        if v["parent_header"]["msg_id"] != msg_id.as_str() {
            continue;
        }
        let msg_type = v["msg_type"].as_str().unwrap_or_default().to_owned();
        reader.absorb(json_channel(&v, &msg_type), &msg_type, v["content"].take(), v["metadata"].take());
    }
    reader.finish().into()
}

/// A JSON message's channel: its `channel` field, or (the daemon may leave it out) the one
/// its type travels on (replies on shell, the rest of a cell's messages on IOPub).
fn json_channel(v: &serde_json::Value, msg_type: &str) -> Channel {
    match v["channel"].as_str() {
        Some("shell") => Channel::Shell,
        Some("control") => Channel::Control,
        Some("stdin") => Channel::Stdin,
        Some("iopub") => Channel::Iopub,
        _ if msg_type.ends_with("_reply") => Channel::Shell,
        _ => Channel::Iopub,
    }
}
