//! GPU UUIDs as the driver's 16 bytes and back.

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (or bare hex) to the 16 UUID bytes.
pub fn uuid_bytes(uuid: &str) -> Option<[u8; 16]> {
    let hex: String = uuid.trim_start_matches("GPU-").chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The 16 UUID bytes as `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (the inverse of [`uuid_bytes`]).
pub fn uuid_string(b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("GPU-{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

#[cfg(test)]
mod tests {
    use super::{uuid_bytes, uuid_string};

    #[test]
    fn uuid_strings_parse_to_driver_bytes() {
        let b = uuid_bytes("GPU-fa4e0000-0000-4000-8000-000000000003").expect("parse");
        assert_eq!(uuid_string(&b), "GPU-fa4e0000-0000-4000-8000-000000000003");
        assert_eq!(b[0..2], [0xfa, 0x4e]);
        assert_eq!(b[15], 3);
        assert!(uuid_bytes("GPU-nothex").is_none());
        assert!(uuid_bytes("GPU-fa4e0000-0000-4000-8000-0000000000zz").is_none());
    }
}
