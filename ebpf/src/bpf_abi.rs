//! Rust mirrors of the structs in `bpf/observer.h`, byte for byte.

/// Length of a task's `comm` in the kernel.
pub(crate) const COMM_LEN: usize = 16;

/// `struct nbos_activity`: the value of the `activity` map, per thread group id.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RawActivity {
    pub launches: u64,
    pub copies: u64,
    pub copy_bytes: u64,
    pub memsets: u64,
    pub memset_bytes: u64,
    pub syncs: u64,
    pub driver_ioctls: u64,
    pub first_ns: u64,
    pub last_ns: u64,
    pub comm: [u8; COMM_LEN],
}

// SAFETY: `RawActivity` is `repr(C)`, made only of integers with no padding (9 x u64 then
// 16 bytes), so every bit pattern the kernel writes is a valid value.
unsafe impl aya::Pod for RawActivity {}

/// `struct nbos_exit_event`, as read from the `exits` ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RawExitEvent {
    pub tgid: u32,
    pub exit_code: i32,
    pub exit_ns: u64,
    pub had_activity: u32,
    pub pad: u32,
    pub activity: RawActivity,
}

impl RawExitEvent {
    /// Decodes a ring buffer record; `None` when it is shorter than the struct (a kernel/user
    /// mismatch, which the caller logs).
    pub(crate) fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < std::mem::size_of::<Self>() {
            return None;
        }
        // SAFETY: the length was checked above; `RawExitEvent` is `repr(C)` plain integers, valid
        // for any bit pattern, and `read_unaligned` makes no alignment assumption about the
        // ring buffer's memory, which only the BPF program writes and which we copy out here.
        Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<Self>()) })
    }
}

/// The process name from a NUL-padded `comm`.
pub(crate) fn comm_to_string(comm: &[u8; COMM_LEN]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_c_header() {
        assert_eq!(std::mem::size_of::<RawActivity>(), 9 * 8 + 16);
        assert_eq!(std::mem::size_of::<RawExitEvent>(), 4 + 4 + 8 + 4 + 4 + 88);
    }

    #[test]
    fn short_ring_buffer_record_is_rejected() {
        assert!(RawExitEvent::from_bytes(&[0u8; 10]).is_none());
        let mut bytes = vec![0u8; std::mem::size_of::<RawExitEvent>()];
        bytes[0] = 42;
        assert_eq!(RawExitEvent::from_bytes(&bytes).map(|e| e.tgid), Some(42));
    }

    #[test]
    fn comm_stops_at_nul() {
        let mut c = [0u8; COMM_LEN];
        c[..6].copy_from_slice(b"python");
        assert_eq!(comm_to_string(&c), "python");
        assert_eq!(comm_to_string(&[b'x'; COMM_LEN]), "x".repeat(16));
    }
}
