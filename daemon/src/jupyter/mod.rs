//! The Jupyter wire format, pure: no sockets, no clock of its own.
//!
//! - [`signer`]: the HMAC-SHA256 signature every ZMQ message carries.
//! - [`wire`]: ZMQ multipart frames <-> [`Message`], signature checked.
//! - [`ws`]: the WebSocket encodings the Kernel Gateway API speaks (JSON text,
//!   the legacy binary form for buffers, and `v1.kernel.websocket.jupyter.org`).
//!
//! Messages keep their four JSON parts as the raw bytes that were received, so a
//! message passed through unchanged is never re-serialised; only the parts the
//! daemon looks at (the header) are parsed.

pub mod message;
pub mod signer;
pub mod wire;
pub mod ws;

pub use message::{Channel, Header, Message};
pub use signer::Signer;

/// Why a message could not be used. Every variant is about bad input, never a bug.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The ZMQ frames had no `<IDS|MSG>` delimiter.
    #[error("no <IDS|MSG> delimiter in {0} frames")]
    NoDelimiter(usize),
    /// Fewer than signature + four parts after the delimiter.
    #[error("message too short: {0} frames after the delimiter, need at least 5")]
    TooShort(usize),
    /// The HMAC signature does not match.
    #[error("bad HMAC signature")]
    BadSignature,
    /// A part that must be a JSON object is not.
    #[error("{part} is not a JSON object: {reason}")]
    BadJson {
        /// Which part (`header`, `content`, the whole WebSocket message…).
        part: &'static str,
        /// The parser's complaint.
        reason: String,
    },
    /// A header lacks a field the protocol requires.
    #[error("header lacks `{0}`")]
    MissingField(&'static str),
    /// An unknown channel name.
    #[error("unknown channel `{0}`")]
    UnknownChannel(String),
    /// A binary WebSocket frame whose offsets do not describe it.
    #[error("malformed binary WebSocket message: {0}")]
    BadBinary(&'static str),
    /// A message larger than the cap.
    #[error("message of {size} bytes exceeds the {cap}-byte cap")]
    TooLarge {
        /// Size received.
        size: usize,
        /// The cap.
        cap: usize,
    },
}

impl WireError {
    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            WireError::BadSignature => "bad_signature",
            WireError::TooLarge { .. } => "too_large",
            WireError::UnknownChannel(_) => "unknown_channel",
            WireError::BadBinary(_) => "bad_binary",
            WireError::NoDelimiter(_) | WireError::TooShort(_) => "bad_frames",
            WireError::BadJson { .. } | WireError::MissingField(_) => "malformed_json",
        }
    }
}

/// Largest message the daemon accepts from a client (WebSocket or kernel-proxy),
/// all parts and buffers together. Jupyter has no limit; 256 MiB bounds the memory a
/// single peer can make us hold while still passing large widget buffers.
pub const MAX_CLIENT_MESSAGE_BYTES: usize = 256 * 1024 * 1024;
