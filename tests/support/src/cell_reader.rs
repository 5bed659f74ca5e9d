//! The one walk of a cell's messages: what a cell produced ([`CellRun`]), folded from its
//! replies and IOPub messages as they arrive, until its `execute_reply` and its `idle`
//! status are both in. Both clients read through it: [`crate::cell::run_cell`] (JSON
//! WebSocket encoding) and [`crate::cell_client::CellClient`] (v1 binary encoding).

use std::time::{Duration, Instant};

use notebookosd::jupyter::Channel;

/// What a cell produced, as the client saw it.
#[derive(Debug, Clone, Default)]
pub struct CellRun {
    /// The reply's content.
    pub reply: serde_json::Value,
    /// The reply's metadata.
    pub reply_metadata: serde_json::Value,
    /// stdout text.
    pub stdout: String,
    /// stderr text.
    pub stderr: String,
    /// Every `stream` text (stdout and stderr) in the order it arrived.
    pub output: String,
    /// The `execute_result`'s `text/plain`.
    pub result: Option<String>,
    /// IOPub `error` contents.
    pub errors: Vec<serde_json::Value>,
    /// Sent → first IOPub of the cell (its executor started it).
    pub started_after: Option<Duration>,
    /// When [`crate::cell_client::CellClient::run`] sent the request, µs since the Unix epoch.
    pub sent_unix_us: u64,
    /// When the last stdout text arrived.
    pub last_stdout_at: Option<Instant>,
}

/// Folds one cell's messages (those whose parent is the cell's request) into a [`CellRun`].
#[derive(Debug)]
pub struct CellReader {
    sent: Instant,
    run: CellRun,
    replied: bool,
    idle: bool,
}

impl CellReader {
    /// A reader for a cell whose request was sent at `sent`.
    pub fn new(sent: Instant) -> Self {
        Self { sent, run: CellRun::default(), replied: false, idle: false }
    }

    /// Takes one message of the cell: its channel, `msg_type`, content and metadata.
    pub fn absorb(
        &mut self,
        channel: Channel,
        msg_type: &str,
        content: serde_json::Value,
        metadata: serde_json::Value,
    ) {
        let run = &mut self.run;
        if channel == Channel::Iopub && run.started_after.is_none() {
            run.started_after = Some(self.sent.elapsed());
        }
        match (channel, msg_type) {
            (Channel::Shell, "execute_reply") => {
                self.replied = true;
                run.reply = content;
                run.reply_metadata = metadata;
            }
            (Channel::Iopub, "status") => {
                self.idle |= content.get("execution_state").and_then(|s| s.as_str()) == Some("idle");
            }
            (Channel::Iopub, "stream") => {
                let text = content.get("text").and_then(|t| t.as_str()).unwrap_or_default();
                run.output.push_str(text);
                if content.get("name").and_then(|n| n.as_str()) == Some("stderr") {
                    run.stderr.push_str(text);
                } else {
                    run.stdout.push_str(text);
                    run.last_stdout_at = Some(Instant::now());
                }
            }
            (Channel::Iopub, "execute_result") => {
                run.result = content.pointer("/data/text~1plain").and_then(|t| t.as_str()).map(str::to_owned);
            }
            (Channel::Iopub, "error") => run.errors.push(content),
            _ => {}
        }
    }

    /// Whether the cell's reply and its `idle` status have both arrived.
    pub fn done(&self) -> bool {
        self.replied && self.idle
    }

    /// What the cell produced.
    pub fn finish(self) -> CellRun {
        self.run
    }
}
