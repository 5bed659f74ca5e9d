//! The lease protocol between the CUDA shim (inside a kernel process) and the host
//! daemon, over one Unix stream socket per host.
//!
//! A frame is `len: u32 LE` followed by `len` bytes of body: `version: u8`, `tag: u8`,
//! then the message's fields (integers little-endian, text and lists prefixed by a
//! `u16` count). Every size has a named cap, checked before anything is allocated, so a
//! peer cannot make either side allocate more than [`MAX_BODY`] bytes per frame.
//!
//! Conversation: the shim sends [`Message::Register`] on connect; the host answers
//! [`Message::Registered`], which names the real driver library the shim loads (or
//! [`Message::Refused`] and closes). The shim sends
//! [`Message::Request`] when a gated call finds no lease; the host answers
//! [`Message::Grant`] when GPUs are bound. The host sends [`Message::Revoke`]; the shim
//! stops submissions, synchronises and answers [`Message::Released`]. While bound the
//! shim reports [`Message::Activity`] periodically. A grant naming a GPU the process's
//! driver does not list is reported back as [`Message::GpusNotVisible`].

#![deny(missing_docs)]

mod codec;
mod io;
mod message;

pub use codec::{decode, decode_body, encode, DecodeError};
pub use io::{read_message, write_message, ReadError};
pub use message::{GpuUuid, Message};

/// Protocol version carried in every frame (2: `Registered` names the driver library; 3:
/// and the process's host pid).
pub const VERSION: u8 = 3;
/// Largest frame body accepted (bytes after the length prefix).
pub const MAX_BODY: usize = 4096;
/// Most GPUs one grant may name (more than any host has).
pub const MAX_GPUS: usize = 64;
/// Longest text field (kernel id, refusal reason), bytes.
pub const MAX_TEXT: usize = 256;
/// Longest path field (the driver library's), bytes.
pub const MAX_PATH: usize = 1024;
