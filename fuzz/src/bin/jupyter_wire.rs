//! The Jupyter ZMQ wire format (daemon/src/jupyter/wire.rs + signer.rs): frames from a
//! kernel process or a kernel-proxy client, `[ids…, <IDS|MSG>, hmac, header, parent,
//! metadata, content, buffers…]`, signature checked with the kernel's key.
//!
//! Input: the frames joined by `|#|`; the first byte's low bit says whether the harness
//! re-signs the message with the key (so the fuzzer gets past the signature to the header
//! parsing) or leaves the signature as the fuzzer wrote it.
//!
//! Invariants: an accepted message carries the right signature of its four parts; the same
//! frames are refused with another key, and after any one byte of a signed part is changed;
//! an accepted message serialises back to the frames it came from and parses again to
//! itself; the daemon's own error reply to it is a message that parses.

use std::time::UNIX_EPOCH;

use bytes::Bytes;
use nbos_fuzz::{split_frames, WIRE_KEY};
use notebookosd::jupyter::message::error_reply;
use notebookosd::jupyter::wire::{parse, serialize, DELIMITER};
use notebookosd::jupyter::{Signer, WireError};

fn main() {
    let signer = Signer::new(WIRE_KEY);
    let other = Signer::new(b"another kernel's key");
    let unsigned = Signer::new(b"");
    afl::fuzz!(|data: &[u8]| {
        let Some((&mode, rest)) = data.split_first() else { return };
        let mut frames = split_frames(rest);
        let delim = frames.iter().position(|f| f.as_ref() == DELIMITER);
        if mode & 1 == 1 {
            if let Some(d) = delim.filter(|d| frames.len() >= d + 6) {
                let parts = [&frames[d + 2][..], &frames[d + 3][..], &frames[d + 4][..], &frames[d + 5][..]];
                frames[d + 1] = Bytes::from(signer.sign(parts));
            }
        }
        // A message without signing parses whenever its framing and header do.
        let unsigned_result = parse(frames.clone(), &unsigned);
        let result = parse(frames.clone(), &signer);
        let (ids, msg) = match result {
            Ok(ok) => ok,
            Err(e) => {
                assert!(!e.to_string().is_empty() && !e.kind().is_empty());
                if !matches!(e, WireError::BadSignature) {
                    assert_eq!(
                        unsigned_result.map_err(|u| u.kind()).err(),
                        Some(e.kind()),
                        "refused for {e} with a key, but not the same way without"
                    );
                }
                return;
            }
        };
        assert!(unsigned_result.is_ok(), "accepted with a key, refused without");
        let d = delim.expect("parsed, so it has a delimiter");
        let parts = [&msg.header[..], &msg.parent_header[..], &msg.metadata[..], &msg.content[..]];
        assert!(
            frames[d + 1].eq_ignore_ascii_case(signer.sign(parts).as_bytes()),
            "accepted a message whose signature is not its HMAC"
        );
        assert!(matches!(parse(frames.clone(), &other), Err(WireError::BadSignature)), "accepted with another key");

        // Any changed byte of a signed part is caught.
        let part = d + 2 + usize::from(mode >> 1) % 4;
        if !frames[part].is_empty() {
            let mut tampered = frames.clone();
            let mut bytes = tampered[part].to_vec();
            let at = usize::from(mode) % bytes.len();
            bytes[at] ^= 1 | (mode & 0xfe);
            tampered[part] = Bytes::from(bytes);
            assert!(matches!(parse(tampered, &signer), Err(WireError::BadSignature)), "accepted a tampered part");
        }

        let out = serialize(&ids, &msg, &signer);
        assert_eq!(out.len(), frames.len());
        for (i, (a, b)) in out.iter().zip(&frames).enumerate() {
            if i == d + 1 {
                assert!(a.eq_ignore_ascii_case(b), "signature differs");
            } else {
                assert_eq!(a, b, "frame {i} differs after a round trip");
            }
        }
        let (ids2, msg2) = parse(out, &signer).expect("what the daemon serialises parses");
        assert_eq!((ids2, msg2), (ids, msg.clone()));

        let header = msg.header().expect("parse checked the header");
        let (_, reply) = error_reply(&msg, "FuzzError", "x", "reply-id", UNIX_EPOCH).expect("header parses");
        let reply_header = reply.header().expect("the daemon's reply has a header");
        assert_eq!(reply_header.session, header.session);
        assert_eq!(reply.parent_header, msg.header);
        assert!(reply.content_json().is_ok());
        let _ = msg.content_json();
    });
}
