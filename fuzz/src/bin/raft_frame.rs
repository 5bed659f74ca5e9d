//! The raft transport's framing (raft-store/src/transport/frame.rs), as a node reads a stream
//! from a peer: length prefix, cap check, body decode. On a TLS cluster the HELLO is the
//! first frame after the handshake; on a loopback plaintext cluster anyone local can send
//! these bytes. FORWARD/ANSWER bodies (postcard, forward/wire.rs) are decoded too: that is
//! post-authentication input. Raft payloads (protobuf 2.28, RUSTSEC-2024-0437) are not
//! decoded here.
//!
//! Invariants: a length over the cap or zero is refused before the body is read; a body that
//! decodes re-encodes to exactly itself; forwarded payloads that decode re-encode stably.

use bytes::Bytes;
use raft_store::transport::frame::{self, Frame, FrameError, HEADER_LEN};

/// A small cap so the oversized path is reached (nodes default to 16 MiB).
const MAX_FRAME: usize = 4096;

fn main() {
    afl::fuzz!(|data: &[u8]| {
        let mut rest = data;
        while rest.len() >= HEADER_LEN {
            let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]);
            let len = match frame::check_len(len, MAX_FRAME) {
                Ok(n) => n,
                Err(e) => {
                    assert!(len == 0 || len as usize > MAX_FRAME, "{len} refused: {e}");
                    assert!(matches!(e, FrameError::Oversized { .. } | FrameError::Garbage(_)));
                    return;
                }
            };
            assert!(len > 0 && len <= MAX_FRAME);
            let Some(body) = rest.get(HEADER_LEN..HEADER_LEN + len) else { return };
            rest = &rest[HEADER_LEN + len..];
            let Ok(f) = frame::decode(Bytes::copy_from_slice(body)) else { continue };
            let again = match &f {
                Frame::Hello { node_id } => frame::hello(*node_id),
                Frame::Keepalive => frame::keepalive(),
                Frame::Raft { group, payload } => frame::raft(*group, payload, MAX_FRAME).expect("decoded, so fits"),
                Frame::Forward { request_id, payload } => {
                    frame::forward(*request_id, payload, MAX_FRAME).expect("decoded, so fits")
                }
                Frame::Answer { request_id, payload } => {
                    frame::answer(*request_id, payload, MAX_FRAME).expect("decoded, so fits")
                }
            };
            assert_eq!(&again[HEADER_LEN..], body, "{f:?} does not re-encode to its body");
            assert_eq!(u32::from_be_bytes([again[0], again[1], again[2], again[3]]) as usize, len);
            match f {
                Frame::Forward { payload, .. } => {
                    if let Err(e) = raft_store::fuzz_forward_payload(&payload, false) {
                        panic!("forwarded request: {e}");
                    }
                }
                Frame::Answer { payload, .. } => {
                    if let Err(e) = raft_store::fuzz_forward_payload(&payload, true) {
                        panic!("forwarded answer: {e}");
                    }
                }
                _ => {}
            }
        }
    });
}
