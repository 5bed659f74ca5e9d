//! The ZMQ (ZMTP 3) frame decoder of every socket the daemon opens to a kernel or a
//! kernel-proxy client (daemon/vendor/zeromq's codec, with the maximum message size that
//! issue 29 added): bytes a notebook can write on its kernel's socket to the daemon.
//!
//! Input: the first byte picks the read size (1..=256 bytes a read, as a socket hands out
//! data); the rest is the byte stream, greeting first.
//!
//! Invariants: no message (all its frames) over the cap is ever returned; the buffer the
//! decoder grows never holds more than the cap and one read chunk past what it was given
//! (upstream reserved what a frame header claimed, 2^62 bytes from 9 bytes of input); after
//! an error the stream is over (the socket drops the peer), and decoding never panics.

use asynchronous_codec::Decoder;
use bytes::BytesMut;
use zeromq::__bench::{codec_with_options, Message};
use zeromq::SocketOptions;

/// Small, so the fuzzer reaches the cap with short inputs.
const CAP: usize = 4096;
/// The read chunk the decoder may reserve beyond a frame (SocketOptions' default maximum).
const CHUNK: usize = 64 * 1024;

fn main() {
    afl::fuzz!(|data: &[u8]| {
        let Some((&read, stream)) = data.split_first() else { return };
        let read = usize::from(read) + 1;
        let mut options = SocketOptions::default();
        options.max_message_size(CAP);
        let mut codec = codec_with_options(&options);
        let mut buf = BytesMut::new();
        'stream: for chunk in stream.chunks(read) {
            buf.extend_from_slice(chunk);
            loop {
                match codec.decode(&mut buf) {
                    Ok(Some(Message::Message(m))) => {
                        let size: usize = m.iter().map(|f| f.len()).sum();
                        assert!(size <= CAP, "a message of {size} bytes passed a cap of {CAP}");
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(e) => {
                        assert!(!e.to_string().is_empty());
                        break 'stream;
                    }
                }
                assert!(
                    buf.capacity() <= CAP + CHUNK + stream.len() + 64,
                    "the decoder reserved {} bytes for a {}-byte input",
                    buf.capacity(),
                    stream.len()
                );
            }
            assert!(
                buf.capacity() <= CAP + CHUNK + stream.len() + 64,
                "the decoder reserved {} bytes for a {}-byte input",
                buf.capacity(),
                stream.len()
            );
        }
    });
}
