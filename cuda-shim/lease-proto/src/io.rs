//! Blocking frame I/O over any `Read`/`Write` (the shim's socket; the daemon's threads).

use std::io::{Read, Write};

use crate::codec::{decode_body, encode, DecodeError};
use crate::message::Message;
use crate::MAX_BODY;

/// Why a message could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The socket failed or closed mid-frame.
    #[error("reading a lease frame: {0}")]
    Io(#[from] std::io::Error),
    /// The peer closed the connection between frames.
    #[error("peer closed the lease connection")]
    Closed,
    /// The bytes are not a valid frame.
    #[error("invalid lease frame: {0}")]
    Decode(#[from] DecodeError),
}

/// Reads one message. The body is read into a stack buffer capped at [`MAX_BODY`];
/// an oversized length prefix is refused before reading the body.
pub fn read_message(r: &mut impl Read) -> Result<Message, ReadError> {
    let mut prefix = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut prefix[got..]) {
            Ok(0) if got == 0 => return Err(ReadError::Closed),
            Ok(0) => return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let len = u32::from_le_bytes(prefix) as usize;
    if len > MAX_BODY {
        return Err(DecodeError::TooLarge(len).into());
    }
    let mut body = [0u8; MAX_BODY];
    r.read_exact(&mut body[..len])?;
    Ok(decode_body(&body[..len])?)
}

/// Writes one message as a single `write_all` (one frame per syscall in practice).
pub fn write_message(w: &mut impl Write, m: &Message) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(64);
    encode(m, &mut buf);
    w.write_all(&buf)
}
