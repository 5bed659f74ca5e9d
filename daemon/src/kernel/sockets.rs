//! The options every ZMQ socket of the daemon (and of `nbos kernel-proxy`) is opened with.
//!
//! zeromq 0.7's decoder reserved as much memory as a frame header claimed before it checked
//! anything: one frame from a notebook (`b"\x02" + (1 << 62).to_bytes(8, "big")` on the
//! kernel's own socket to the daemon) aborted the daemon and every kernel with it (issue
//! 29). Our copy of the crate (`daemon/vendor/zeromq`) takes a maximum message size, as
//! libzmq's `ZMQ_MAXMSGSIZE`; a peer that announces more is disconnected before any
//! memory is reserved, and `recv` returns the error that [`is_oversized`] recognises.

use zeromq::SocketOptions;

/// `kernel.max_message_bytes`'s default.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = crate::config::DEFAULT_KERNEL_MAX_MESSAGE_BYTES as usize;

/// The message size cap of a kernel's sockets (`kernel.max_message_bytes`); its default is
/// [`DEFAULT_MAX_MESSAGE_BYTES`], never 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageCap(pub usize);

impl Default for MessageCap {
    fn default() -> Self {
        Self(DEFAULT_MAX_MESSAGE_BYTES)
    }
}

/// Socket options with a message size cap of `max_message_bytes`.
pub fn options(max_message_bytes: usize) -> SocketOptions {
    let mut opts = SocketOptions::default();
    opts.max_message_size(max_message_bytes);
    opts
}

/// Whether `err` (from a socket's `recv`) is a peer that broke the protocol: a message over
/// the cap, or bytes that are no ZMTP. A lost connection is not.
pub fn is_protocol_violation(err: &zeromq::ZmqError) -> bool {
    use zeromq::CodecError;
    matches!(
        err,
        zeromq::ZmqError::Codec(
            CodecError::Decode(_) | CodecError::Command(_) | CodecError::Greeting(_) | CodecError::Mechanism(_)
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use zeromq::{DealerSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

    const CAP: usize = 1 << 20;
    const WAIT: Duration = Duration::from_secs(10);

    /// The daemon's side of a kernel socket (a DEALER): a message over the cap is an error
    /// that says so, not an allocation of what the peer claimed.
    #[tokio::test]
    async fn a_message_over_the_cap_is_a_protocol_violation() {
        let mut kernel = RouterSocket::new();
        let endpoint = kernel.bind("tcp://127.0.0.1:0").await.expect("bind").to_string();
        let mut daemon = DealerSocket::with_options(options(CAP));
        daemon.connect(&endpoint).await.expect("connect");
        daemon.send(ZmqMessage::from("hello")).await.expect("send");
        let hello = tokio::time::timeout(WAIT, kernel.recv()).await.expect("in time").expect("hello");
        let mut big = ZmqMessage::from(hello.get(0).expect("peer id").clone());
        big.push_back(vec![7u8; 2 * CAP].into());
        kernel.send(big).await.expect("send");
        let got = tokio::time::timeout(WAIT, daemon.recv()).await.expect("an answer");
        let Err(err) = got else { panic!("a 2 MiB message passed a 1 MiB cap") };
        assert!(is_protocol_violation(&err), "{err}");
        assert!(err.to_string().contains("max_message_size"), "{err}");
    }

    /// A listening socket (the kernel proxy's ROUTERs): the peer over the cap is dropped and
    /// the socket goes on serving the others.
    #[tokio::test]
    async fn a_peer_over_the_cap_is_dropped_and_the_others_are_served() {
        let mut router = RouterSocket::with_options(options(CAP));
        let endpoint = router.bind("tcp://127.0.0.1:0").await.expect("bind").to_string();
        let mut events = router.monitor();
        // The router's recv drops the big peer (and says so on the monitor) and goes on waiting.
        let received = tokio::spawn(async move { router.recv().await });
        let mut big = DealerSocket::new();
        big.connect(&endpoint).await.expect("connect");
        big.send(ZmqMessage::from(vec![7u8; 2 * CAP])).await.expect("send");
        let dropped = async {
            while let Some(event) = futures_util::StreamExt::next(&mut events).await {
                if matches!(event, zeromq::SocketEvent::Disconnected(_)) {
                    return;
                }
            }
        };
        tokio::time::timeout(WAIT, dropped).await.expect("the peer over the cap was not dropped");
        let mut small = DealerSocket::new();
        small.connect(&endpoint).await.expect("connect");
        small.send(ZmqMessage::from("hello")).await.expect("send");
        let got = tokio::time::timeout(WAIT, received).await.expect("an answer").expect("task").expect("a message");
        assert_eq!(got.get(1).map(|b| b.to_vec()), Some(b"hello".to_vec()), "the first message is the small one");
    }
}
