//! Helpers shared by the fuzz targets (`src/bin/*`) and the seed-corpus generator.
//!
//! Targets whose input is several byte strings (ZMQ multipart frames) read one fuzz input as
//! those strings joined by [`FRAME_SEP`]: a separator, unlike length prefixes, survives the
//! fuzzer's inserts and deletes, so mutated inputs stay meaningful.

use bytes::Bytes;

/// Separates the frames of a multipart message in one fuzz input.
pub const FRAME_SEP: &[u8] = b"|#|";

/// Splits a fuzz input into frames at every [`FRAME_SEP`].
pub fn split_frames(data: &[u8]) -> Vec<Bytes> {
    let mut frames = Vec::new();
    let mut rest = data;
    while let Some(at) = rest.windows(FRAME_SEP.len()).position(|w| w == FRAME_SEP) {
        frames.push(Bytes::copy_from_slice(&rest[..at]));
        rest = &rest[at + FRAME_SEP.len()..];
    }
    frames.push(Bytes::copy_from_slice(rest));
    frames
}

/// The inverse of [`split_frames`] (for frames that do not contain the separator).
pub fn join_frames(frames: &[Bytes]) -> Vec<u8> {
    frames.iter().map(|f| f.to_vec()).collect::<Vec<_>>().join(FRAME_SEP)
}

/// A reader that hands out its bytes in chunks of at most `chunk` bytes and fails with
/// `Interrupted` once, so framing code is fuzzed against short reads as sockets give them.
pub struct ChoppyReader<'a> {
    data: &'a [u8],
    chunk: usize,
    interrupted: bool,
}

impl<'a> ChoppyReader<'a> {
    /// Reads `data` `chunk` bytes at a time (at least one).
    pub fn new(data: &'a [u8], chunk: usize) -> Self {
        Self { data, chunk: chunk.max(1), interrupted: false }
    }
}

impl std::io::Read for ChoppyReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if !self.interrupted {
            self.interrupted = true;
            return Err(std::io::ErrorKind::Interrupted.into());
        }
        let n = buf.len().min(self.chunk).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

/// The kernel key the `jupyter_wire` target signs and verifies with (its seeds are signed
/// with it, so they pass the signature check as they are).
pub const WIRE_KEY: &[u8] = b"5f0b7a0e-fuzz-kernel-key";
