//! A client on one gateway's channels (the Jupyter v1 binary WebSocket protocol, through the
//! daemon's own [`GatewayClient`]): sends cells and reads each to its reply and `idle`
//! (through the shared [`CellReader`]), with the times the benches report. The cluster
//! tests and `nbos bench`/`nbos replay` use it.

use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use futures_util::{SinkExt, StreamExt};
use notebookosd::jupyter::{ws, Channel, Message};
use notebookosd::link::client::{ChannelsSocket, GatewayClient};
use tokio_tungstenite::tungstenite::Message as WsFrame;

use crate::cell_reader::CellReader;
pub use crate::cell_reader::CellRun;

/// A client on one gateway's channels.
pub struct CellClient {
    socket: ChannelsSocket,
}

impl CellClient {
    /// Opens `id`'s channels on `gateway`.
    pub async fn connect(gateway: &GatewayClient, id: &str) -> anyhow::Result<Self> {
        Ok(Self { socket: gateway.connect_channels(id, true).await? })
    }

    /// Sends a cell, returns its msg id and the time it was sent.
    pub async fn send(&mut self, code: &str) -> anyhow::Result<(String, Instant)> {
        let msg = Message::new(
            "execute_request",
            "nbos-bench",
            &uuid::Uuid::new_v4().to_string(),
            SystemTime::now(),
            None,
            &serde_json::json!({ "code": code, "silent": false, "store_history": true, "allow_stdin": false }),
        );
        let id = msg.header()?.msg_id;
        let t = Instant::now();
        self.socket.send(WsFrame::Binary(ws::to_v1_binary(Channel::Shell, &msg).into())).await?;
        Ok((id, t))
    }

    /// Reads until the cell's reply and its `idle` status have arrived.
    pub async fn wait(&mut self, id: &str, sent: Instant, timeout: Duration) -> anyhow::Result<CellRun> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut reader = CellReader::new(sent);
        while !reader.done() {
            let frame = tokio::time::timeout_at(deadline, self.socket.next())
                .await
                .with_context(|| format!("cell {id}: no reply within {timeout:?}"))?
                .context("the gateway closed the WebSocket")??;
            let WsFrame::Binary(b) = frame else { continue };
            let (ch, m) = ws::from_v1_binary(&b)?;
            let parent: serde_json::Value = serde_json::from_slice(&m.parent_header).unwrap_or_default();
            if parent.get("msg_id").and_then(|v| v.as_str()) != Some(id) {
                continue;
            }
            let metadata = serde_json::from_slice(&m.metadata).unwrap_or_default();
            reader.absorb(ch, &m.header()?.msg_type, m.content_json().unwrap_or_default(), metadata);
        }
        Ok(reader.finish())
    }

    /// Reads until a `stderr` stream message of cell `id` arrives; returns its text
    /// (the cell's other messages read meanwhile are dropped).
    pub async fn next_stderr(&mut self, id: &str, timeout: Duration) -> anyhow::Result<String> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let frame = tokio::time::timeout_at(deadline, self.socket.next())
                .await
                .with_context(|| format!("cell {id}: no stderr within {timeout:?}"))?
                .context("the gateway closed the WebSocket")??;
            let WsFrame::Binary(b) = frame else { continue };
            let (ch, m) = ws::from_v1_binary(&b)?;
            let parent: serde_json::Value = serde_json::from_slice(&m.parent_header).unwrap_or_default();
            if ch != Channel::Iopub || parent.get("msg_id").and_then(|v| v.as_str()) != Some(id) {
                continue;
            }
            let content = m.content_json().unwrap_or_default();
            if m.header()?.msg_type == "stream" && content.get("name").and_then(|n| n.as_str()) == Some("stderr") {
                return Ok(content.get("text").and_then(|t| t.as_str()).unwrap_or_default().to_owned());
            }
        }
    }

    /// Runs a cell to its end.
    pub async fn run(&mut self, code: &str, timeout: Duration) -> anyhow::Result<CellRun> {
        let sent = SystemTime::now();
        let (id, t) = self.send(code).await?;
        let mut run = self.wait(&id, t, timeout).await?;
        run.sent_unix_us = sent.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64);
        Ok(run)
    }
}

/// `metadata.nbos_election.revision` of an executed reply.
pub fn executed_revision(run: &CellRun) -> Option<u64> {
    run.reply_metadata.get("nbos_election")?.get("revision")?.as_u64()
}
