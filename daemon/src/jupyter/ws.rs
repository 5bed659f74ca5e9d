//! The WebSocket encodings of the Kernel Gateway API.
//!
//! - JSON text: `{"channel", "header", "parent_header", "metadata", "content", …}`.
//!   jupyter_server's gateway client omits `channel` on shell messages and sends
//!   `date` as a float; both are accepted (missing channel = shell; a non-string
//!   `date` is rewritten to ISO 8601, which is what ipykernel expects).
//! - Legacy binary (no subprotocol, used when a message has buffers):
//!   `u32 BE nbufs, u32 BE offsets[nbufs], JSON message, buffers…`.
//! - `v1.kernel.websocket.jupyter.org`: every frame binary,
//!   `u64 LE n, u64 LE offsets[n], channel, header, parent_header, metadata, content, buffers…`.

use std::time::SystemTime;

use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::Value;

use super::message::iso_date;
use super::{Channel, Message, WireError, MAX_CLIENT_MESSAGE_BYTES};

/// The binary subprotocol name clients offer in `Sec-WebSocket-Protocol`.
pub const V1_SUBPROTOCOL: &str = "v1.kernel.websocket.jupyter.org";

fn bad_json(part: &'static str, reason: impl ToString) -> WireError {
    WireError::BadJson { part, reason: reason.to_string() }
}

/// Most parts (JSON message or channel, header parts, buffers) one binary frame may
/// declare. The frame's offset table is read into memory before anything else is
/// checked: without this cap a 256 MiB legacy frame of 4-byte offsets would make ~64 Mi
/// offsets and part handles, about ten times the frame. Jupyter messages carry a few
/// buffers (widgets, arrays), never thousands.
pub const MAX_MESSAGE_PARTS: usize = 4096;

fn check_size(size: usize) -> Result<(), WireError> {
    if size > MAX_CLIENT_MESSAGE_BYTES {
        return Err(WireError::TooLarge { size, cap: MAX_CLIENT_MESSAGE_BYTES });
    }
    Ok(())
}

/// Largest `header` or `parent_header` a client message may carry, bytes. These two parts
/// are parsed into a JSON tree (about 17 times their size in memory) to be normalised; a
/// real header is a few hundred bytes.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// A client's JSON message, its parts left as raw JSON text: the fields it does not name
/// (`buffers`, `msg_id`…) are skipped without being built, so decoding costs about the
/// message's size again, not a JSON tree of it (~17 times; issue 29).
#[derive(Default)]
struct RawMessage<'a> {
    channel: Option<&'a RawValue>,
    header: Option<&'a RawValue>,
    parent_header: Option<&'a RawValue>,
    metadata: Option<&'a RawValue>,
    content: Option<&'a RawValue>,
}

/// Hand-written rather than derived: only a JSON object is a message (a derived struct also
/// takes an array), and a repeated key keeps its last value, as a JSON tree would.
impl<'de> serde::Deserialize<'de> for RawMessage<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = RawMessage<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut m = RawMessage::default();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    let slot = match key.as_ref() {
                        "channel" => &mut m.channel,
                        "header" => &mut m.header,
                        "parent_header" => &mut m.parent_header,
                        "metadata" => &mut m.metadata,
                        "content" => &mut m.content,
                        _ => {
                            // Checked, not skipped: a tree-based decoder refused what it refuses.
                            map.next_value::<Checked>()?;
                            continue;
                        }
                    };
                    *slot = Some(map.next_value()?);
                }
                Ok(m)
            }
        }
        d.deserialize_map(Visitor)
    }
}

/// A JSON value checked as a JSON tree would be (numbers in range, strings well escaped,
/// the same nesting limit) without building the tree: so the raw parts the daemon passes
/// on are exactly those a tree-based decoder accepted.
struct Checked;

impl<'de> serde::Deserialize<'de> for Checked {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(CheckedVisitor)
    }
}

struct CheckedVisitor;

impl<'de> serde::de::Visitor<'de> for CheckedVisitor {
    type Value = Checked;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_unit<E>(self) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_entry::<Checked, Checked>()?.is_some() {}
        Ok(Checked)
    }
}

/// `raw` checked as a JSON tree would be, and an object.
fn check_object(name: &'static str, raw: &RawValue) -> Result<(), WireError> {
    serde_json::from_str::<Checked>(raw.get()).map_err(|e| bad_json(name, e))?;
    if !is_object(raw) {
        return Err(bad_json(name, "not an object"));
    }
    Ok(())
}

/// Decodes a JSON text frame from a client. `now` fills a missing `date`.
pub fn from_json_text(text: &str, now: SystemTime) -> Result<(Channel, Message), WireError> {
    check_size(text.len())?;
    let raw: RawMessage<'_> = serde_json::from_str(text).map_err(|e| bad_json("message", e))?;
    from_raw(&raw, Vec::new(), now)
}

/// Whether `raw` is JSON `null` (a `RawValue` holds no surrounding whitespace).
fn is_null(raw: &RawValue) -> bool {
    raw.get() == "null"
}

/// Whether `raw` is a JSON object (its first character; serde already checked the syntax).
fn is_object(raw: &RawValue) -> bool {
    raw.get().starts_with('{')
}

/// Parses a header part (bounded by [`MAX_HEADER_BYTES`]) into its fields.
fn header_map(part: &'static str, raw: &RawValue) -> Result<serde_json::Map<String, Value>, WireError> {
    if raw.get().len() > MAX_HEADER_BYTES {
        return Err(bad_json(part, format!("larger than {MAX_HEADER_BYTES} bytes")));
    }
    match serde_json::from_str(raw.get()) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(bad_json(part, "not an object")),
        Err(e) => Err(bad_json(part, e)),
    }
}

fn from_raw(raw: &RawMessage<'_>, buffers: Vec<Bytes>, now: SystemTime) -> Result<(Channel, Message), WireError> {
    let channel = match raw.channel {
        None => Channel::Shell,
        Some(c) if is_null(c) => Channel::Shell,
        Some(c) => match serde_json::from_str::<String>(c.get()) {
            Ok(s) => Channel::parse(&s)?,
            Err(_) => return Err(bad_json("channel", "not a string")),
        },
    };
    let mut header = match raw.header {
        None => return Err(WireError::MissingField("header")),
        Some(h) if !is_object(h) => return Err(bad_json("header", "not an object")),
        Some(h) => header_map("header", h)?,
    };
    for required in ["msg_id", "msg_type"] {
        if !header.get(required).is_some_and(Value::is_string) {
            return Err(WireError::MissingField(if required == "msg_id" { "msg_id" } else { "msg_type" }));
        }
    }
    normalize_date(&mut header, now);
    // ipykernel treats a header without `version` as protocol 4 and fails to
    // adapt it; every current client speaks 5.x.
    header.entry("version").or_insert_with(|| Value::String("5.3".to_owned()));
    header.entry("session").or_insert_with(|| Value::String(String::new()));
    header.entry("username").or_insert_with(|| Value::String(String::new()));
    let parent_header = match raw.parent_header {
        None => Bytes::from_static(b"{}"),
        Some(p) if is_null(p) => Bytes::from_static(b"{}"),
        Some(p) if !is_object(p) => return Err(bad_json("parent_header", "not an object")),
        Some(p) => {
            let mut o = header_map("parent_header", p)?;
            if !o.is_empty() {
                normalize_date(&mut o, now);
            }
            Bytes::from(Value::Object(o).to_string())
        }
    };
    // Metadata and content go to the kernel as the client wrote them (valid JSON objects).
    let part = |name: &'static str, p: Option<&RawValue>| -> Result<Bytes, WireError> {
        match p {
            None => Ok(Bytes::from_static(b"{}")),
            Some(p) if is_null(p) => Ok(Bytes::from_static(b"{}")),
            Some(p) => check_object(name, p).map(|()| Bytes::copy_from_slice(p.get().as_bytes())),
        }
    };
    let metadata = part("metadata", raw.metadata)?;
    let content = part("content", raw.content)?;
    Ok((
        channel,
        Message { header: Bytes::from(Value::Object(header).to_string()), parent_header, metadata, content, buffers },
    ))
}

/// A float (seconds since the epoch) or missing `date` becomes an ISO 8601 string.
fn normalize_date(header: &mut serde_json::Map<String, Value>, now: SystemTime) {
    let date = match header.get("date") {
        Some(Value::String(_)) => return,
        Some(Value::Number(n)) => n
            .as_f64()
            .filter(|s| s.is_finite() && *s >= 0.0 && *s < 1e11)
            .map_or(now, |s| SystemTime::UNIX_EPOCH + std::time::Duration::from_secs_f64(s)),
        _ => now,
    };
    header.insert("date".to_owned(), Value::String(iso_date(date)));
}

/// Decodes a legacy binary frame (a JSON message followed by its buffers).
pub fn from_legacy_binary(data: &[u8], now: SystemTime) -> Result<(Channel, Message), WireError> {
    check_size(data.len())?;
    let word = |i: usize| -> Result<usize, WireError> {
        let b = data.get(4 * i..4 * i + 4).ok_or(WireError::BadBinary("truncated offset table"))?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let nbufs = word(0)?;
    if nbufs == 0 || nbufs > data.len() / 4 {
        return Err(WireError::BadBinary("impossible part count"));
    }
    if nbufs > MAX_MESSAGE_PARTS {
        return Err(WireError::BadBinary("more parts than a message may have (MAX_MESSAGE_PARTS)"));
    }
    let mut offsets = Vec::with_capacity(nbufs + 1);
    for i in 0..nbufs {
        offsets.push(word(i + 1)?);
    }
    offsets.push(data.len());
    let mut parts = Vec::with_capacity(nbufs);
    for w in offsets.windows(2) {
        let (start, end) = (w[0], w[1]);
        if start > end || end > data.len() || start < 4 * (nbufs + 1) {
            return Err(WireError::BadBinary("offsets out of order or out of range"));
        }
        parts.push(Bytes::copy_from_slice(&data[start..end]));
    }
    let mut parts = parts.into_iter();
    let json = parts.next().ok_or(WireError::BadBinary("no JSON part"))?;
    let raw: RawMessage<'_> = serde_json::from_slice(&json).map_err(|e| bad_json("message", e))?;
    from_raw(&raw, parts.collect(), now)
}

/// Decodes a `v1.kernel.websocket.jupyter.org` frame. The parts are kept as sent.
pub fn from_v1_binary(data: &[u8]) -> Result<(Channel, Message), WireError> {
    check_size(data.len())?;
    let word = |i: usize| -> Result<usize, WireError> {
        let b = data.get(8 * i..8 * i + 8).ok_or(WireError::BadBinary("truncated offset table"))?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        usize::try_from(u64::from_le_bytes(a)).map_err(|_| WireError::BadBinary("offset overflows"))
    };
    let n = word(0)?;
    // channel + 4 JSON parts need 6 offsets.
    if n < 6 || n > data.len() / 8 {
        return Err(WireError::BadBinary("impossible offset count"));
    }
    if n > MAX_MESSAGE_PARTS + 1 {
        return Err(WireError::BadBinary("more parts than a message may have (MAX_MESSAGE_PARTS)"));
    }
    let mut offsets = Vec::with_capacity(n);
    for i in 0..n {
        offsets.push(word(i + 1)?);
    }
    let mut parts = Vec::with_capacity(n - 1);
    for w in offsets.windows(2) {
        let (start, end) = (w[0], w[1]);
        if start > end || end > data.len() || start < 8 * (n + 1) {
            return Err(WireError::BadBinary("offsets out of order or out of range"));
        }
        parts.push(Bytes::copy_from_slice(&data[start..end]));
    }
    let mut parts = parts.into_iter();
    let channel_raw = parts.next().ok_or(WireError::BadBinary("no channel"))?;
    let channel =
        Channel::parse(std::str::from_utf8(&channel_raw).map_err(|_| WireError::BadBinary("channel not UTF-8"))?)?;
    let (Some(header), Some(parent_header), Some(metadata), Some(content)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(WireError::BadBinary("fewer than four message parts"));
    };
    let msg = Message { header, parent_header, metadata, content, buffers: parts.collect() };
    // The header is parsed into a tree (here and wherever the daemon reads its fields).
    if msg.header.len() > MAX_HEADER_BYTES {
        return Err(bad_json("header", format!("larger than {MAX_HEADER_BYTES} bytes")));
    }
    msg.header()?;
    // The other parts are checked without building a tree of them.
    for (name, p) in [("parent_header", &msg.parent_header), ("metadata", &msg.metadata), ("content", &msg.content)] {
        let v: &RawValue = serde_json::from_slice(p).map_err(|e| bad_json(name, e))?;
        check_object(name, v)?;
    }
    Ok((channel, msg))
}

/// The JSON object a client receives, without buffers: the raw parts are spliced
/// in, so nothing the kernel sent is re-serialised.
pub fn to_json_text(channel: Channel, msg: &Message) -> Result<String, WireError> {
    let h = msg.header()?;
    let esc = |s: &str| Value::String(s.to_owned()).to_string();
    let utf8 = |part: &'static str, b: &Bytes| -> Result<String, WireError> {
        std::str::from_utf8(b).map(str::to_owned).map_err(|e| bad_json(part, e))
    };
    Ok(format!(
        r#"{{"channel":"{}","msg_id":{},"msg_type":{},"header":{},"parent_header":{},"metadata":{},"content":{},"buffers":[]}}"#,
        channel.as_str(),
        esc(&h.msg_id),
        esc(&h.msg_type),
        utf8("header", &msg.header)?,
        utf8("parent_header", &msg.parent_header)?,
        utf8("metadata", &msg.metadata)?,
        utf8("content", &msg.content)?,
    ))
}

/// The legacy binary frame for a message with buffers.
pub fn to_legacy_binary(channel: Channel, msg: &Message) -> Result<Vec<u8>, WireError> {
    let json = to_json_text(channel, &Message { buffers: Vec::new(), ..msg.clone() })?;
    let nbufs = 1 + msg.buffers.len();
    let mut offsets = Vec::with_capacity(nbufs);
    let mut at = 4 * (nbufs + 1);
    offsets.push(at);
    at += json.len();
    for b in &msg.buffers[..msg.buffers.len().saturating_sub(1)] {
        offsets.push(at);
        at += b.len();
    }
    if !msg.buffers.is_empty() {
        offsets.push(at);
    }
    let mut out = Vec::with_capacity(at + msg.buffers.last().map_or(0, Bytes::len));
    let to_u32 = |x: usize| u32::try_from(x).map_err(|_| WireError::TooLarge { size: x, cap: u32::MAX as usize });
    out.extend_from_slice(&to_u32(nbufs)?.to_be_bytes());
    for o in offsets {
        out.extend_from_slice(&to_u32(o)?.to_be_bytes());
    }
    out.extend_from_slice(json.as_bytes());
    for b in &msg.buffers {
        out.extend_from_slice(b);
    }
    Ok(out)
}

/// The `v1.kernel.websocket.jupyter.org` frame.
pub fn to_v1_binary(channel: Channel, msg: &Message) -> Vec<u8> {
    let chan = channel.as_str().as_bytes();
    let mut parts: Vec<&[u8]> = vec![chan, &msg.header, &msg.parent_header, &msg.metadata, &msg.content];
    parts.extend(msg.buffers.iter().map(|b| b.as_ref()));
    let n = parts.len() + 1;
    let mut offsets = Vec::with_capacity(n);
    let mut at = 8 * (n + 1);
    offsets.push(at);
    for p in &parts {
        at += p.len();
        offsets.push(at);
    }
    let mut out = Vec::with_capacity(at);
    out.extend_from_slice(&(n as u64).to_le_bytes());
    for o in offsets {
        out.extend_from_slice(&(o as u64).to_le_bytes());
    }
    for p in parts {
        out.extend_from_slice(p);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: std::time::Duration = std::time::Duration::from_secs(1_700_000_000);

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + NOW
    }

    #[test]
    fn missing_channel_is_shell_and_float_date_becomes_iso() {
        let text = r#"{"header":{"msg_id":"a","msg_type":"execute_request","date":1700000001.5,"session":"s"},
                      "parent_header":{},"metadata":{},"content":{"code":"1"}}"#;
        let (ch, msg) = from_json_text(text, now()).expect("ok");
        assert_eq!(ch, Channel::Shell);
        let h: Value = serde_json::from_slice(&msg.header).expect("json");
        assert_eq!(h["date"], "2023-11-14T22:13:21.500000Z");
        assert_eq!(h["version"], "5.3", "a missing version is filled in");
        assert_eq!(msg.header().expect("hdr").msg_type, "execute_request");
    }

    /// Found by fuzz/ (jupyter_ws, kept as fuzz/corpus/jupyter_ws/crash-float-roundtrip): the
    /// parts are re-serialised, and a number must reach the kernel as the client wrote it.
    #[test]
    fn numbers_pass_through_unchanged() {
        let literal = "111110000001100001111111110000911111111.5";
        let text = format!(
            r#"{{"header":{{"msg_id":"m1","msg_type":"comm_msg","x":{literal}}},"content":{{"value":{literal}}}}}"#
        );
        let exact: f64 = literal.parse().expect("f64");
        let (_, msg) = from_json_text(&text, now()).expect("ok");
        let header: Value = serde_json::from_slice(&msg.header).expect("json");
        assert_eq!(header["x"].as_f64(), Some(exact));
        assert_eq!(msg.content_json().expect("content")["value"].as_f64(), Some(exact));
        let (_, again) = from_json_text(&to_json_text(Channel::Shell, &msg).expect("enc"), now()).expect("ok");
        assert_eq!(again.header, msg.header, "a second pass changes nothing");
    }

    #[test]
    fn malformed_json_messages_are_errors() {
        for bad in [
            "not json",
            "[]",
            r#"{"channel":"shell"}"#,
            r#"{"header":{"msg_id":"a"}}"#,
            r#"{"channel":"bogus","header":{"msg_id":"a","msg_type":"x"}}"#,
            r#"{"header":{"msg_id":"a","msg_type":"x"},"content":[1]}"#,
        ] {
            assert!(from_json_text(bad, now()).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn json_text_out_has_channel_ids_and_raw_parts() {
        let (_, msg) = from_json_text(
            r#"{"channel":"iopub","header":{"msg_id":"m","msg_type":"stream","date":"2020-01-01T00:00:00Z"},"content":{"text":"hi"}}"#,
            now(),
        )
        .expect("ok");
        let out: Value = serde_json::from_str(&to_json_text(Channel::Iopub, &msg).expect("enc")).expect("json");
        assert_eq!(out["channel"], "iopub");
        assert_eq!(out["msg_id"], "m");
        assert_eq!(out["msg_type"], "stream");
        assert_eq!(out["content"]["text"], "hi");
        assert_eq!(out["header"]["date"], "2020-01-01T00:00:00Z");
    }

    #[test]
    fn v1_round_trip_with_buffers() {
        let (_, mut msg) =
            from_json_text(r#"{"header":{"msg_id":"m","msg_type":"comm_msg"},"content":{}}"#, now()).expect("ok");
        msg.buffers = vec![Bytes::from_static(b"abc"), Bytes::from_static(b"")];
        let frame = to_v1_binary(Channel::Control, &msg);
        let (ch, back) = from_v1_binary(&frame).expect("decodes");
        assert_eq!(ch, Channel::Control);
        assert_eq!(back, msg);
    }

    #[test]
    fn legacy_binary_round_trip_with_buffers() {
        let (_, mut msg) =
            from_json_text(r#"{"header":{"msg_id":"m","msg_type":"comm_msg","date":"x"},"content":{}}"#, now())
                .expect("ok");
        msg.buffers = vec![Bytes::from_static(b"abc"), Bytes::from_static(b"defg")];
        let frame = to_legacy_binary(Channel::Shell, &msg).expect("enc");
        let (ch, back) = from_legacy_binary(&frame, now()).expect("decodes");
        assert_eq!(ch, Channel::Shell);
        assert_eq!(back.buffers, msg.buffers);
        assert_eq!(back.header().expect("h").msg_id, "m");
    }

    #[test]
    fn truncated_binary_frames_are_errors() {
        let (_, msg) = from_json_text(r#"{"header":{"msg_id":"m","msg_type":"x"}}"#, now()).expect("ok");
        let frame = to_v1_binary(Channel::Shell, &msg);
        for cut in [0, 7, 8, 30, frame.len() - 1] {
            assert!(from_v1_binary(&frame[..cut]).is_err(), "cut at {cut}");
        }
        assert!(from_legacy_binary(&[0, 0, 0, 9], now()).is_err());
        assert!(from_legacy_binary(&[], now()).is_err());
    }

    /// Issue 29: metadata and content pass as the client wrote them (no JSON tree of the
    /// message is built), and are refused exactly where a JSON tree would refuse them.
    #[test]
    fn parts_pass_as_written_and_are_checked_as_a_tree_would_be() {
        let text = r#"{"header":{"msg_id":"m","msg_type":"comm_msg"},"metadata":{ "b" : [1, 2] },
                       "content":{"data":{"x":"\u00e9"},"n":1.5e3},"buffers":[],"extra":{"ignored":[[]]}}"#;
        let (_, msg) = from_json_text(text, now()).expect("ok");
        assert_eq!(&msg.metadata[..], br#"{ "b" : [1, 2] }"#);
        assert_eq!(&msg.content[..], br#"{"data":{"x":"\u00e9"},"n":1.5e3}"#);
        for bad in [
            r#"{"header":{"msg_id":"a","msg_type":"x"},"content":{"n":1e400}}"#,
            r#"{"header":{"msg_id":"a","msg_type":"x"},"metadata":{"s":"\ud800"}}"#,
            r#"{"header":{"msg_id":"a","msg_type":"x"},"buffers":[1e400]}"#,
            r#"[null,{"msg_id":"a","msg_type":"x"}]"#,
        ] {
            assert!(from_json_text(bad, now()).is_err(), "{bad} should be refused");
        }
        // A repeated key keeps its last value, as in a JSON tree.
        let twice = r#"{"header":{"msg_id":"a"},"header":{"msg_id":"b","msg_type":"x"}}"#;
        assert_eq!(from_json_text(twice, now()).expect("ok").1.header().expect("h").msg_id, "b");
        // A header is parsed into a tree: its size is bounded.
        let huge = format!(r#"{{"header":{{"msg_id":"a","msg_type":"x","pad":"{}"}}}}"#, "x".repeat(MAX_HEADER_BYTES));
        assert!(from_json_text(&huge, now()).expect_err("refused").to_string().contains("larger than"));
    }

    /// A frame that is all offset table: each declared part costs far more in memory than
    /// its 4 (or 8) bytes on the wire, so the count is refused before anything is allocated.
    #[test]
    fn frames_declaring_more_parts_than_a_message_has_are_refused() {
        let parts = MAX_MESSAGE_PARTS + 1;
        let mut legacy = Vec::with_capacity(4 * (parts + 1));
        legacy.extend_from_slice(&u32::try_from(parts).expect("small").to_be_bytes());
        let table_end = u32::try_from(4 * (parts + 1)).expect("small");
        for _ in 0..parts {
            legacy.extend_from_slice(&table_end.to_be_bytes());
        }
        let err = from_legacy_binary(&legacy, now()).expect_err("refused");
        assert_eq!(err.kind(), "bad_binary");
        assert!(err.to_string().contains("MAX_MESSAGE_PARTS"), "{err}");

        let n = MAX_MESSAGE_PARTS + 2;
        let mut v1 = Vec::with_capacity(8 * (n + 1));
        v1.extend_from_slice(&(n as u64).to_le_bytes());
        for _ in 0..n {
            v1.extend_from_slice(&(8 * (n as u64 + 1)).to_le_bytes());
        }
        assert!(from_v1_binary(&v1).expect_err("refused").to_string().contains("MAX_MESSAGE_PARTS"));

        // A message with many (empty) buffers within the cap still decodes.
        let (_, mut msg) = from_json_text(r#"{"header":{"msg_id":"m","msg_type":"comm_msg"}}"#, now()).expect("ok");
        msg.buffers = vec![Bytes::new(); MAX_MESSAGE_PARTS - 1];
        let frame = to_legacy_binary(Channel::Shell, &msg).expect("enc");
        assert_eq!(from_legacy_binary(&frame, now()).expect("decodes").1.buffers.len(), MAX_MESSAGE_PARTS - 1);
    }
}
