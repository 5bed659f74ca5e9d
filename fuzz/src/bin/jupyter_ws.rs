//! The WebSocket encodings of the Kernel Gateway API (daemon/src/jupyter/ws.rs): what a
//! browser or jupyter_server sends on `/api/kernels/{id}/channels`, as JSON text, the legacy
//! binary framing (buffers) or `v1.kernel.websocket.jupyter.org`.
//!
//! Input: the first byte picks the decoder (0: JSON text, 1: legacy binary, 2: v1), the rest
//! is the frame.
//!
//! Invariants: whatever decodes is re-encoded by the daemon's own encoders (as it sends
//! messages to clients) into frames that decode to the same message again: v1 to exactly
//! the same parts; JSON text and legacy binary to the same channel, header, parts and
//! buffers (the first decode normalises the header, a second changes nothing).
//!
//! And the JSON decoder, which leaves `metadata` and `content` as raw text instead of
//! building a JSON tree of the message (issue 29), accepts exactly the messages a JSON
//! tree says are valid, with the same channel, ids and parts.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use notebookosd::jupyter::ws::{
    from_json_text, from_legacy_binary, from_v1_binary, to_json_text, to_legacy_binary, to_v1_binary, MAX_HEADER_BYTES,
};
use notebookosd::jupyter::{Channel, Message};
use serde_json::Value;

fn main() {
    let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    afl::fuzz!(|data: &[u8]| {
        let Some((&which, frame)) = data.split_first() else { return };
        match which % 3 {
            0 => {
                let Ok(text) = std::str::from_utf8(frame) else { return };
                check_against_tree(text, now);
                if let Ok((ch, msg)) = from_json_text(text, now) {
                    check_json_text(ch, &msg, now);
                    check_legacy(ch, &msg, now);
                }
            }
            1 => {
                if let Ok((ch, msg)) = from_legacy_binary(frame, now) {
                    check_json_text(ch, &msg, now);
                    check_legacy(ch, &msg, now);
                }
            }
            _ => {
                if let Ok((ch, msg)) = from_v1_binary(frame) {
                    let again = to_v1_binary(ch, &msg);
                    let back = from_v1_binary(&again).expect("the daemon's v1 frame decodes");
                    assert_eq!(back, (ch, msg.clone()), "v1 round trip changed the message");
                    // What a v1 client sends may reach a JSON client.
                    let text = to_json_text(ch, &msg).expect("decoded parts are JSON objects");
                    serde_json::from_str::<serde_json::Value>(&text).expect("to_json_text writes JSON");
                    let (ch2, msg2) = from_json_text(&text, now).expect("the daemon's JSON text decodes");
                    assert_eq!(ch2, ch);
                    assert_eq!(msg2.header().expect("header"), msg.header().expect("header"));
                }
            }
        }
    });
}

/// What a JSON tree of `text` says the decoder must do (the decoder before issue 29 worked
/// on that tree): accept a valid message with the same channel, ids and parts, refuse the
/// others. Headers over `MAX_HEADER_BYTES` are refused by the decoder alone; fuzz inputs
/// under that size are compared.
fn check_against_tree(text: &str, now: SystemTime) {
    if text.len() > MAX_HEADER_BYTES {
        return;
    }
    let decoded = from_json_text(text, now);
    let tree: Option<serde_json::Map<String, Value>> = match serde_json::from_str(text) {
        Ok(Value::Object(o)) => Some(o),
        _ => None,
    };
    let Some(tree) = tree else {
        assert!(decoded.is_err(), "accepted what is not a JSON object: {text:?}");
        return;
    };
    let object_or_null = |name: &str| matches!(tree.get(name), None | Some(Value::Null | Value::Object(_)));
    let channel = match tree.get("channel") {
        None | Some(Value::Null) => Some(Channel::Shell),
        Some(Value::String(s)) => Channel::parse(s).ok(),
        Some(_) => None,
    };
    let header = tree.get("header").and_then(Value::as_object);
    let ids = header.and_then(|h| Some((h.get("msg_id")?.as_str()?, h.get("msg_type")?.as_str()?)));
    let valid =
        channel.is_some() && ids.is_some() && ["parent_header", "metadata", "content"].into_iter().all(object_or_null);
    match decoded {
        Err(e) => assert!(!valid, "refused a valid message ({e}): {text:?}"),
        Ok((ch, msg)) => {
            assert!(valid, "accepted an invalid message: {text:?}");
            assert_eq!(Some(ch), channel);
            let h = msg.header().expect("decoded header");
            assert_eq!(ids, Some((h.msg_id.as_str(), h.msg_type.as_str())));
            for (name, part) in [("metadata", &msg.metadata), ("content", &msg.content)] {
                let want = match tree.get(name) {
                    None | Some(Value::Null) => Value::Object(Default::default()),
                    Some(v) => v.clone(),
                };
                assert_eq!(json(part), want, "{name} changed");
            }
        }
    }
}

/// JSON text out and back in: the same message (without buffers, which text cannot carry).
fn check_json_text(ch: Channel, msg: &Message, now: SystemTime) {
    let text = to_json_text(ch, msg).expect("a decoded message encodes");
    let (ch2, msg2) = from_json_text(&text, now).expect("the daemon's JSON text decodes");
    assert_eq!(ch2, ch);
    assert_eq!(json(&msg2.header), json(&msg.header), "header changed");
    assert_eq!(json(&msg2.parent_header), json(&msg.parent_header), "parent_header changed");
    assert_eq!(json(&msg2.metadata), json(&msg.metadata), "metadata changed");
    assert_eq!(json(&msg2.content), json(&msg.content), "content changed");
}

/// Legacy binary out and back in: the same message, buffers included.
fn check_legacy(ch: Channel, msg: &Message, now: SystemTime) {
    let frame = to_legacy_binary(ch, msg).expect("small messages encode");
    let (ch2, msg2) = from_legacy_binary(&frame, now).expect("the daemon's legacy frame decodes");
    assert_eq!(ch2, ch);
    assert_eq!(msg2.buffers, msg.buffers, "buffers changed");
    assert_eq!(json(&msg2.header), json(&msg.header), "header changed");
    assert_eq!(json(&msg2.content), json(&msg.content), "content changed");
}

fn json(b: &[u8]) -> serde_json::Value {
    serde_json::from_slice(b).expect("a decoded part is JSON")
}
