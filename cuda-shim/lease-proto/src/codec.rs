//! Encoding and decoding of frames, from and to byte slices (no I/O).

use crate::message::{GpuUuid, Message};
use crate::{MAX_BODY, MAX_GPUS, MAX_PATH, MAX_TEXT, VERSION};

/// Why bytes are not a valid frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The length prefix exceeds [`MAX_BODY`].
    #[error("frame body of {0} bytes exceeds the cap of {MAX_BODY}")]
    TooLarge(usize),
    /// The body is shorter than a version and a tag.
    #[error("frame body of {0} bytes is too short")]
    TooShort(usize),
    /// A version this side does not speak.
    #[error("unsupported protocol version {0} (this side speaks {VERSION})")]
    Version(u8),
    /// An unknown message tag.
    #[error("unknown message tag {0}")]
    Tag(u8),
    /// A field runs past the end of the body.
    #[error("message truncated while reading {0}")]
    Truncated(&'static str),
    /// Bytes left after the last field.
    #[error("{0} bytes after the end of the message")]
    Trailing(usize),
    /// A list or text longer than its cap.
    #[error("{field} has {len} entries, cap {cap}")]
    Cap {
        /// Which field.
        field: &'static str,
        /// Its announced length.
        len: usize,
        /// The cap.
        cap: usize,
    },
    /// Text that is not UTF-8.
    #[error("{0} is not UTF-8")]
    Utf8(&'static str),
}

/// Appends the frame of `m` to `out`.
///
/// Panics never; text longer than [`MAX_TEXT`] (a path: [`MAX_PATH`]) is cut at a character
/// boundary and more than [`MAX_GPUS`] GPUs are cut to the cap, so every encoded frame decodes.
/// A sender that must not send a cut path checks its length first.
pub fn encode(m: &Message, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    out.push(VERSION);
    out.push(m.tag());
    match m {
        Message::Register { kernel_id, replica, pid } => {
            text(out, kernel_id);
            out.extend_from_slice(&replica.to_le_bytes());
            out.extend_from_slice(&pid.to_le_bytes());
        }
        Message::Registered { device_count, activity_interval_ms, memory_limit_bytes, host_pid, driver_path } => {
            out.extend_from_slice(&device_count.to_le_bytes());
            out.extend_from_slice(&activity_interval_ms.to_le_bytes());
            out.extend_from_slice(&memory_limit_bytes.to_le_bytes());
            out.extend_from_slice(&host_pid.to_le_bytes());
            text_capped(out, driver_path, MAX_PATH);
        }
        Message::Request { gpus } => out.extend_from_slice(&gpus.to_le_bytes()),
        Message::Grant { lease, gpus } | Message::GpusNotVisible { lease, gpus } => {
            out.extend_from_slice(&lease.to_le_bytes());
            let n = gpus.len().min(MAX_GPUS);
            out.extend_from_slice(&(n as u16).to_le_bytes());
            for g in &gpus[..n] {
                out.extend_from_slice(g);
            }
        }
        Message::Revoke { lease } | Message::Released { lease } => out.extend_from_slice(&lease.to_le_bytes()),
        Message::Activity { calls, waits } => {
            out.extend_from_slice(&calls.to_le_bytes());
            out.extend_from_slice(&waits.to_le_bytes());
        }
        Message::Refused { reason } => text(out, reason),
    }
    let body = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&body.to_le_bytes());
}

fn text(out: &mut Vec<u8>, s: &str) {
    text_capped(out, s, MAX_TEXT);
}

fn text_capped(out: &mut Vec<u8>, s: &str, cap: usize) {
    let mut end = s.len().min(cap);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&(end as u16).to_le_bytes());
    out.extend_from_slice(&s.as_bytes()[..end]);
}

/// Decodes one frame from the front of `buf`: `Ok(None)` when more bytes are needed,
/// else the message and the bytes consumed.
pub fn decode(buf: &[u8]) -> Result<Option<(Message, usize)>, DecodeError> {
    let Some(prefix) = buf.get(..4) else { return Ok(None) };
    let len = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
    if len > MAX_BODY {
        return Err(DecodeError::TooLarge(len));
    }
    let Some(body) = buf.get(4..4 + len) else { return Ok(None) };
    Ok(Some((decode_body(body)?, 4 + len)))
}

/// Decodes a frame body (after the length prefix).
pub fn decode_body(body: &[u8]) -> Result<Message, DecodeError> {
    if body.len() < 2 {
        return Err(DecodeError::TooShort(body.len()));
    }
    if body[0] != VERSION {
        return Err(DecodeError::Version(body[0]));
    }
    let mut r = Reader { b: &body[2..] };
    let m = match body[1] {
        1 => Message::Register { kernel_id: r.text("kernel_id")?, replica: r.u32("replica")?, pid: r.u32("pid")? },
        2 => Message::Registered {
            device_count: r.u32("device_count")?,
            activity_interval_ms: r.u32("activity_interval_ms")?,
            memory_limit_bytes: r.u64("memory_limit_bytes")?,
            host_pid: r.u32("host_pid")?,
            driver_path: r.text_capped("driver_path", MAX_PATH)?,
        },
        3 => Message::Request { gpus: r.u32("gpus")? },
        4 => {
            let lease = r.u64("lease")?;
            Message::Grant { lease, gpus: r.gpus()? }
        }
        5 => Message::Revoke { lease: r.u64("lease")? },
        6 => Message::Released { lease: r.u64("lease")? },
        7 => Message::Activity { calls: r.u64("calls")?, waits: r.u64("waits")? },
        8 => Message::Refused { reason: r.text("reason")? },
        9 => {
            let lease = r.u64("lease")?;
            Message::GpusNotVisible { lease, gpus: r.gpus()? }
        }
        t => return Err(DecodeError::Tag(t)),
    };
    if !r.b.is_empty() {
        return Err(DecodeError::Trailing(r.b.len()));
    }
    Ok(m)
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.b.len() < n {
            return Err(DecodeError::Truncated(field));
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }

    fn u16(&mut self, f: &'static str) -> Result<u16, DecodeError> {
        let b = self.take(2, f)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, f: &'static str) -> Result<u32, DecodeError> {
        let b = self.take(4, f)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, f: &'static str) -> Result<u64, DecodeError> {
        let b = self.take(8, f)?;
        let mut a = [0; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// A list of GPU UUIDs (a `u16` count, capped at [`MAX_GPUS`] before anything is allocated).
    fn gpus(&mut self) -> Result<Vec<GpuUuid>, DecodeError> {
        let n = self.u16("gpus")? as usize;
        if n > MAX_GPUS {
            return Err(DecodeError::Cap { field: "gpus", len: n, cap: MAX_GPUS });
        }
        let mut gpus = Vec::with_capacity(n);
        for _ in 0..n {
            let g: GpuUuid = self.take(16, "gpu uuid")?.try_into().map_err(|_| DecodeError::Truncated("gpu uuid"))?;
            gpus.push(g);
        }
        Ok(gpus)
    }

    fn text(&mut self, f: &'static str) -> Result<String, DecodeError> {
        self.text_capped(f, MAX_TEXT)
    }

    fn text_capped(&mut self, f: &'static str, cap: usize) -> Result<String, DecodeError> {
        let n = self.u16(f)? as usize;
        if n > cap {
            return Err(DecodeError::Cap { field: f, len: n, cap });
        }
        let b = self.take(n, f)?;
        std::str::from_utf8(b).map(str::to_owned).map_err(|_| DecodeError::Utf8(f))
    }
}
