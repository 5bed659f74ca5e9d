//! The lease protocol (cuda-shim/lease-proto): the daemon decodes what a kernel process's
//! shim sends over the lease socket (any local user's process can connect), the shim decodes
//! the daemon's replies. Both read through `read_message`; `decode` is the buffer form.
//!
//! Invariants: a frame that decodes re-encodes to exactly the bytes consumed (the encoding
//! is canonical, so nothing is accepted that the peer could not have sent), `read_message`
//! agrees with `decode` whatever the read sizes, and every message the encoder writes decodes
//! (to itself when its fields are within the caps).

use nbos_fuzz::ChoppyReader;
use nbos_lease_proto::{
    decode, encode, read_message, GpuUuid, Message, ReadError, MAX_BODY, MAX_GPUS, MAX_PATH, MAX_TEXT,
};

fn main() {
    afl::fuzz!(|data: &[u8]| {
        check_decode(data);
        check_encode(data);
    });
}

/// Bytes from a peer: frame after frame from the front of `data`.
fn check_decode(data: &[u8]) {
    let chunk = data.first().map_or(1, |b| usize::from(*b % 16) + 1);
    let mut reader = ChoppyReader::new(data, chunk);
    let mut rest = data;
    loop {
        let decoded = decode(rest);
        let read = read_message(&mut reader);
        match decoded {
            Ok(Some((m, used))) => {
                assert!(used <= rest.len() && used <= 4 + MAX_BODY, "consumed {used} of {}", rest.len());
                let mut again = Vec::new();
                encode(&m, &mut again);
                assert_eq!(again, &rest[..used], "{m:?} does not re-encode to the bytes it came from");
                match read {
                    Ok(r) => assert_eq!(r, m, "read_message and decode disagree"),
                    Err(e) => panic!("decode accepted {m:?}, read_message refused: {e}"),
                }
                rest = &rest[used..];
            }
            Ok(None) => {
                // Incomplete: the blocking reader must not make up a message.
                assert!(!matches!(read, Ok(_)), "read_message decoded an incomplete frame: {read:?}");
                return;
            }
            Err(e) => {
                assert!(!e.to_string().is_empty());
                assert!(matches!(read, Err(ReadError::Decode(_))), "decode refused ({e}), read_message: {read:?}");
                return;
            }
        }
    }
}

/// Messages built from the input: what the encoder writes always decodes.
fn check_encode(data: &[u8]) {
    let Some((&tag, rest)) = data.split_first() else { return };
    let mut f = Fields { b: rest };
    let m = match tag % 9 {
        0 => Message::Register { kernel_id: f.text(2), replica: f.u32(), pid: f.u32() },
        1 => Message::Registered {
            device_count: f.u32(),
            activity_interval_ms: f.u32(),
            memory_limit_bytes: f.u64(),
            host_pid: f.u32(),
            driver_path: f.text(8),
        },
        2 => Message::Request { gpus: f.u32() },
        3 => Message::Grant { lease: f.u64(), gpus: f.gpus() },
        4 => Message::Revoke { lease: f.u64() },
        5 => Message::Released { lease: f.u64() },
        6 => Message::Activity { calls: f.u64(), waits: f.u64() },
        7 => Message::Refused { reason: f.text(2) },
        _ => Message::GpusNotVisible { lease: f.u64(), gpus: f.gpus() },
    };
    let mut frame = Vec::new();
    encode(&m, &mut frame);
    let (back, used) = match decode(&frame) {
        Ok(Some(d)) => d,
        other => panic!("encoded {m:?} does not decode: {other:?}"),
    };
    assert_eq!(used, frame.len());
    match (&m, &back) {
        (Message::Register { kernel_id: a, .. }, Message::Register { kernel_id: b, .. })
        | (Message::Refused { reason: a }, Message::Refused { reason: b })
            if a.len() > MAX_TEXT =>
        {
            assert!(a.starts_with(b.as_str()) && b.len() <= MAX_TEXT, "text cut wrongly");
        }
        (Message::Registered { driver_path: a, .. }, Message::Registered { driver_path: b, .. })
            if a.len() > MAX_PATH =>
        {
            assert!(a.starts_with(b.as_str()) && b.len() <= MAX_PATH, "path cut wrongly");
        }
        (Message::Grant { gpus: a, .. }, Message::Grant { gpus: b, .. })
        | (Message::GpusNotVisible { gpus: a, .. }, Message::GpusNotVisible { gpus: b, .. })
            if a.len() > MAX_GPUS =>
        {
            assert_eq!(&a[..MAX_GPUS], &b[..], "GPU list cut wrongly");
        }
        _ => assert_eq!(back, m),
    }
}

/// Takes message fields from the front of the input (zeros once it runs out).
struct Fields<'a> {
    b: &'a [u8],
}

impl Fields<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut a = [0; N];
        let n = N.min(self.b.len());
        a[..n].copy_from_slice(&self.b[..n]);
        self.b = &self.b[n..];
        a
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }

    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }

    /// A length byte times `scale` (so past the cap is reachable), then that many bytes as text.
    fn text(&mut self, scale: usize) -> String {
        let [n] = self.take::<1>();
        let n = (usize::from(n) * scale).min(self.b.len());
        let (s, rest) = self.b.split_at(n);
        self.b = rest;
        String::from_utf8_lossy(s).into_owned()
    }

    fn gpus(&mut self) -> Vec<GpuUuid> {
        let [n] = self.take::<1>();
        (0..n).map(|_| self.take::<16>()).collect()
    }
}
