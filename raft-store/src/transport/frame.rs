//! The wire format between nodes: length-prefixed frames. Pure: no sockets here.
//!
//! ```text
//! frame   = len:u32be kind:u8 body          (len counts kind + body; len <= max_frame_bytes)
//! HELLO   = kind 1, body = "NBRS" version:u8 node_id:u64be   (first frame of a connection)
//! KEEPALIVE = kind 2, empty body                             (node liveness, hibernation)
//! RAFT    = kind 3, body = group_id:u64be eraftpb.Message    (protobuf, decoded only after TLS)
//! FORWARD = kind 4, body = request_id:u64be ForwardRequest   (postcard, decoded only after TLS)
//! ANSWER  = kind 5, body = request_id:u64be ForwardResponse  (postcard, decoded only after TLS)
//! ```
//! A framed protocol over one TLS stream keeps the dependency surface small (no HTTP/2 or codegen)
//! and lets us cap sizes before a single protobuf byte is parsed.

use bytes::{Buf, BufMut, Bytes, BytesMut};

const KIND_HELLO: u8 = 1;
const KIND_KEEPALIVE: u8 = 2;
const KIND_RAFT: u8 = 3;
const KIND_FORWARD: u8 = 4;
const KIND_ANSWER: u8 = 5;
const MAGIC: &[u8; 4] = b"NBRS";
const VERSION: u8 = 1;
/// Length prefix size.
pub const HEADER_LEN: usize = 4;
/// The length prefix of every HELLO: kind, magic, version, node id.
pub const HELLO_FRAME_LEN: usize = 1 + 4 + 1 + 8;

/// A decoded frame. The raft payload stays opaque bytes here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Identifies the sending node.
    Hello {
        /// The sender's node id.
        node_id: u64,
    },
    /// Nothing but "I am alive".
    Keepalive,
    /// A raft message for a group.
    Raft {
        /// Group id.
        group: u64,
        /// Protobuf-encoded `eraftpb::Message`.
        payload: Bytes,
    },
    /// A request forwarded to this node as a group's leader.
    Forward {
        /// Id chosen by the forwarding node; the answer carries it back.
        request_id: u64,
        /// Postcard-encoded request.
        payload: Bytes,
    },
    /// The answer to a forwarded request.
    Answer {
        /// The request's id.
        request_id: u64,
        /// Postcard-encoded answer.
        payload: Bytes,
    },
}

/// Why a frame was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// The declared length exceeds the cap.
    #[error("frame of {len} bytes exceeds the {max}-byte cap")]
    Oversized {
        /// Declared length.
        len: usize,
        /// Cap.
        max: usize,
    },
    /// The body does not parse.
    #[error("malformed frame: {0}")]
    Garbage(&'static str),
}

impl FrameError {
    /// Metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            FrameError::Oversized { .. } => "oversized",
            FrameError::Garbage(_) => "garbage",
        }
    }
}

/// Checks a length prefix against the cap.
pub fn check_len(len: u32, max: usize) -> Result<usize, FrameError> {
    let len = len as usize;
    if len > max {
        return Err(FrameError::Oversized { len, max });
    }
    if len == 0 {
        return Err(FrameError::Garbage("empty frame"));
    }
    Ok(len)
}

/// Decodes a frame body (everything after the length prefix).
pub fn decode(mut body: Bytes) -> Result<Frame, FrameError> {
    if body.is_empty() {
        return Err(FrameError::Garbage("empty frame"));
    }
    let kind = body.get_u8();
    match kind {
        KIND_HELLO => {
            if body.len() != 4 + 1 + 8 || &body[..4] != MAGIC {
                return Err(FrameError::Garbage("bad hello"));
            }
            body.advance(4);
            if body.get_u8() != VERSION {
                return Err(FrameError::Garbage("unsupported protocol version"));
            }
            Ok(Frame::Hello { node_id: body.get_u64() })
        }
        KIND_KEEPALIVE if body.is_empty() => Ok(Frame::Keepalive),
        KIND_RAFT => {
            if body.len() < 8 {
                return Err(FrameError::Garbage("raft frame shorter than its group id"));
            }
            let group = body.get_u64();
            Ok(Frame::Raft { group, payload: body })
        }
        KIND_FORWARD | KIND_ANSWER => {
            if body.len() < 8 {
                return Err(FrameError::Garbage("forwarding frame shorter than its request id"));
            }
            let request_id = body.get_u64();
            Ok(if kind == KIND_FORWARD {
                Frame::Forward { request_id, payload: body }
            } else {
                Frame::Answer { request_id, payload: body }
            })
        }
        _ => Err(FrameError::Garbage("unknown frame kind")),
    }
}

fn with_header(kind: u8, body_len: usize) -> BytesMut {
    let mut b = BytesMut::with_capacity(HEADER_LEN + 1 + body_len);
    b.put_u32(u32::try_from(1 + body_len).unwrap_or(u32::MAX));
    b.put_u8(kind);
    b
}

/// Encodes a HELLO frame.
pub fn hello(node_id: u64) -> Bytes {
    let mut b = with_header(KIND_HELLO, HELLO_FRAME_LEN - 1);
    b.put_slice(MAGIC);
    b.put_u8(VERSION);
    b.put_u64(node_id);
    b.freeze()
}

/// Encodes a KEEPALIVE frame.
pub fn keepalive() -> Bytes {
    with_header(KIND_KEEPALIVE, 0).freeze()
}

/// Encodes a RAFT frame; `None` when it would exceed `max` bytes.
pub fn raft(group: u64, payload: &[u8], max: usize) -> Option<Bytes> {
    if 1 + 8 + payload.len() > max {
        return None;
    }
    let mut b = with_header(KIND_RAFT, 8 + payload.len());
    b.put_u64(group);
    b.put_slice(payload);
    Some(b.freeze())
}

fn with_id(kind: u8, id: u64, payload: &[u8], max: usize) -> Option<Bytes> {
    if 1 + 8 + payload.len() > max {
        return None;
    }
    let mut b = with_header(kind, 8 + payload.len());
    b.put_u64(id);
    b.put_slice(payload);
    Some(b.freeze())
}

/// Encodes a FORWARD frame; `None` when it would exceed `max` bytes.
pub fn forward(request_id: u64, payload: &[u8], max: usize) -> Option<Bytes> {
    with_id(KIND_FORWARD, request_id, payload, max)
}

/// Encodes an ANSWER frame; `None` when it would exceed `max` bytes.
pub fn answer(request_id: u64, payload: &[u8], max: usize) -> Option<Bytes> {
    with_id(KIND_ANSWER, request_id, payload, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(frame: Bytes) -> Bytes {
        frame.slice(HEADER_LEN..)
    }

    #[test]
    fn round_trips() {
        assert_eq!(decode(body(hello(7))), Ok(Frame::Hello { node_id: 7 }));
        assert_eq!(decode(body(keepalive())), Ok(Frame::Keepalive));
        let f = raft(9, b"abc", 1024).expect("fits");
        assert_eq!(decode(body(f)), Ok(Frame::Raft { group: 9, payload: Bytes::from_static(b"abc") }));
        let f = forward(5, b"req", 1024).expect("fits");
        assert_eq!(decode(body(f)), Ok(Frame::Forward { request_id: 5, payload: Bytes::from_static(b"req") }));
        let f = answer(5, b"ans", 1024).expect("fits");
        assert_eq!(decode(body(f)), Ok(Frame::Answer { request_id: 5, payload: Bytes::from_static(b"ans") }));
        assert!(forward(1, &[0u8; 5000], 4096).is_none());
    }

    #[test]
    fn rejects_bad_input() {
        assert_eq!(check_len(5000, 4096).map_err(|e| e.reason()), Err("oversized"));
        assert_eq!(check_len(0, 4096).map_err(|e| e.reason()), Err("garbage"));
        assert!(raft(1, &[0u8; 5000], 4096).is_none());
        for junk in [
            &b"\x09"[..],
            b"\x01NBRS",
            b"\x01XXXX\x01\0\0\0\0\0\0\0\x01",
            b"\x03\0\0",
            b"\x02x",
            b"\x04\0",
            b"\x05\0\0\0",
        ] {
            assert!(decode(Bytes::copy_from_slice(junk)).is_err(), "{junk:?} must be refused");
        }
        let mut wrong_version = body(hello(1)).to_vec();
        wrong_version[5] = 99;
        assert!(decode(Bytes::from(wrong_version)).is_err());
    }
}
