//! One Jupyter message, its channel, and the header fields the daemon reads.

use std::time::SystemTime;

use bytes::Bytes;
use serde::Deserialize;

use super::WireError;

/// The five channels of a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Channel {
    /// Requests and replies (execute, complete, inspect, …).
    Shell,
    /// Like shell but served ahead of queued shell requests (interrupt, shutdown, debug).
    Control,
    /// `input_request` from the kernel, `input_reply` from the client.
    Stdin,
    /// Broadcast output: status, streams, display data, results, errors.
    Iopub,
    /// Heartbeat (only ever bytes echoed; never carries messages here).
    Hb,
}

impl Channel {
    /// The name used in the WebSocket `channel` key.
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Shell => "shell",
            Channel::Control => "control",
            Channel::Stdin => "stdin",
            Channel::Iopub => "iopub",
            Channel::Hb => "hb",
        }
    }

    /// Parses a channel name.
    pub fn parse(s: &str) -> Result<Self, WireError> {
        Ok(match s {
            "shell" => Channel::Shell,
            "control" => Channel::Control,
            "stdin" => Channel::Stdin,
            "iopub" => Channel::Iopub,
            "hb" => Channel::Hb,
            other => return Err(WireError::UnknownChannel(other.chars().take(64).collect())),
        })
    }
}

/// A message as four raw JSON parts plus binary buffers.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// `header` JSON object.
    pub header: Bytes,
    /// `parent_header` JSON object (`{}` when none).
    pub parent_header: Bytes,
    /// `metadata` JSON object.
    pub metadata: Bytes,
    /// `content` JSON object.
    pub content: Bytes,
    /// Extra binary buffers (widgets, arrays).
    pub buffers: Vec<Bytes>,
}

/// The header fields the daemon looks at.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Header {
    /// Unique id of the message.
    pub msg_id: String,
    /// e.g. `execute_request`.
    pub msg_type: String,
    /// The client session.
    #[serde(default)]
    pub session: String,
}

impl Message {
    /// Parses the header fields.
    pub fn header(&self) -> Result<Header, WireError> {
        parse_header(&self.header)
    }

    /// Parses `content` as JSON.
    pub fn content_json(&self) -> Result<serde_json::Value, WireError> {
        serde_json::from_slice(&self.content).map_err(|e| WireError::BadJson { part: "content", reason: e.to_string() })
    }

    /// Total size of the parts and buffers.
    pub fn size(&self) -> usize {
        self.header.len()
            + self.parent_header.len()
            + self.metadata.len()
            + self.content.len()
            + self.buffers.iter().map(Bytes::len).sum::<usize>()
    }

    /// A new message the daemon itself originates (a `status`, an error reply),
    /// in reply to `parent` (its raw header) when given. `msg_id` and `date` are
    /// passed in so this stays pure.
    pub fn new(
        msg_type: &str,
        session: &str,
        msg_id: &str,
        date: SystemTime,
        parent: Option<&Bytes>,
        content: &serde_json::Value,
    ) -> Self {
        let header = serde_json::json!({
            "msg_id": msg_id,
            "msg_type": msg_type,
            "session": session,
            "username": "notebookosd",
            "date": iso_date(date),
            "version": "5.3",
        });
        Self {
            header: Bytes::from(header.to_string()),
            parent_header: parent.cloned().unwrap_or_else(|| Bytes::from_static(b"{}")),
            metadata: Bytes::from_static(b"{}"),
            content: Bytes::from(content.to_string()),
            buffers: Vec::new(),
        }
    }
}

/// How the daemon answers a request it cannot pass to a kernel, as a kernel answers a
/// failed one: the `error` content (`ename`, `evalue`, `traceback`) for IOPub, and the
/// `<x>_reply` with `status: error` (a cell's with `execution_count`). `msg_id` and `date`
/// are passed in so this stays pure.
pub fn error_reply(
    request: &Message,
    ename: &str,
    evalue: &str,
    msg_id: &str,
    date: SystemTime,
) -> Result<(serde_json::Value, Message), WireError> {
    let h = request.header()?;
    let error = serde_json::json!({ "ename": ename, "evalue": evalue, "traceback": [format!("{ename}: {evalue}")] });
    let mut content = error.clone();
    content["status"] = "error".into();
    if h.msg_type == "execute_request" {
        content["execution_count"] = 0.into();
    }
    let reply_type = format!("{}_reply", h.msg_type.strip_suffix("_request").unwrap_or(&h.msg_type));
    let reply = Message::new(&reply_type, &h.session, msg_id, date, Some(&request.header), &content);
    Ok((error, reply))
}

/// Parses raw header bytes into the fields the daemon needs.
pub fn parse_header(raw: &[u8]) -> Result<Header, WireError> {
    let v: serde_json::Value =
        serde_json::from_slice(raw).map_err(|e| WireError::BadJson { part: "header", reason: e.to_string() })?;
    let obj = v.as_object().ok_or(WireError::BadJson { part: "header", reason: "not an object".into() })?;
    let field = |name: &'static str| {
        obj.get(name).and_then(serde_json::Value::as_str).map(str::to_owned).ok_or(WireError::MissingField(name))
    };
    Ok(Header {
        msg_id: field("msg_id")?,
        msg_type: field("msg_type")?,
        session: obj.get("session").and_then(serde_json::Value::as_str).unwrap_or("").to_owned(),
    })
}

/// A time in the form Jupyter uses for `date` and Kernel Gateway for
/// `last_activity`: `%Y-%m-%dT%H:%M:%S.%fZ` (UTC, microseconds).
pub fn iso_date(t: SystemTime) -> String {
    humantime::format_rfc3339_micros(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn an_error_reply_answers_its_request_as_a_kernel_would() {
        let cell = Message::new("execute_request", "s1", "c1", UNIX_EPOCH, None, &serde_json::json!({}));
        let (error, reply) = error_reply(&cell, "DeadKernel", "gone", "r1", UNIX_EPOCH).expect("reply");
        assert_eq!(error["traceback"][0], "DeadKernel: gone");
        let h = reply.header().expect("header");
        assert_eq!((h.msg_type.as_str(), h.session.as_str()), ("execute_reply", "s1"));
        let c = reply.content_json().expect("content");
        assert_eq!(
            (c["status"].as_str(), c["ename"].as_str(), c["execution_count"].as_u64()),
            (Some("error"), Some("DeadKernel"), Some(0))
        );
        assert_eq!(parse_header(&reply.parent_header).expect("parent").msg_id, "c1");

        let info = Message::new("kernel_info_request", "s1", "k1", UNIX_EPOCH, None, &serde_json::json!({}));
        let (_, reply) = error_reply(&info, "DeadKernel", "gone", "r2", UNIX_EPOCH).expect("reply");
        assert_eq!(reply.header().expect("header").msg_type, "kernel_info_reply");
        assert!(reply.content_json().expect("content").get("execution_count").is_none());
    }

    #[test]
    fn iso_date_has_microseconds_and_z() {
        let t = UNIX_EPOCH + Duration::from_micros(1_700_000_000_123_456);
        assert_eq!(iso_date(t), "2023-11-14T22:13:20.123456Z");
    }

    #[test]
    fn header_needs_id_and_type() {
        assert!(parse_header(br#"{"msg_id":"a","msg_type":"x"}"#).is_ok());
        assert!(matches!(parse_header(br#"{"msg_id":"a"}"#), Err(WireError::MissingField("msg_type"))));
        assert!(matches!(parse_header(b"[1]"), Err(WireError::BadJson { .. })));
        assert!(matches!(parse_header(b"{"), Err(WireError::BadJson { .. })));
    }

    #[test]
    fn channel_names_round_trip() {
        for c in [Channel::Shell, Channel::Control, Channel::Stdin, Channel::Iopub, Channel::Hb] {
            assert_eq!(Channel::parse(c.as_str()).expect("known"), c);
        }
        assert!(Channel::parse("nope").is_err());
    }
}
