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

    /// `CUDA_MEMCPY2D` and `CUDA_MEMCPY3D` as cuda.h lays them out on 64-bit hosts (pointers,
    /// `size_t` and `CUdeviceptr` are 8 bytes; the `CUmemorytype` enums are 4 and padded).
    #[repr(C)]
    struct CudaMemcpy2D {
        src_x_in_bytes: usize,
        src_y: usize,
        src_memory_type: u32,
        src_host: *const u8,
        src_device: u64,
        src_array: *mut u8,
        src_pitch: usize,
        dst_x_in_bytes: usize,
        dst_y: usize,
        dst_memory_type: u32,
        dst_host: *mut u8,
        dst_device: u64,
        dst_array: *mut u8,
        dst_pitch: usize,
        width_in_bytes: usize,
        height: usize,
    }

    #[repr(C)]
    struct CudaMemcpy3D {
        src_x_in_bytes: usize,
        src_y: usize,
        src_z: usize,
        src_lod: usize,
        src_memory_type: u32,
        src_host: *const u8,
        src_device: u64,
        src_array: *mut u8,
        reserved0: *mut u8,
        src_pitch: usize,
        src_height: usize,
        dst_x_in_bytes: usize,
        dst_y: usize,
        dst_z: usize,
        dst_lod: usize,
        dst_memory_type: u32,
        dst_host: *mut u8,
        dst_device: u64,
        dst_array: *mut u8,
        reserved1: *mut u8,
        dst_pitch: usize,
        dst_height: usize,
        width_in_bytes: usize,
        height: usize,
        depth: usize,
    }

    /// The value of `#define NAME value` in the BPF source.
    fn bpf_define(name: &str) -> usize {
        let src = include_str!("../bpf/observer.bpf.c");
        let prefix = format!("#define {name} ");
        let line =
            src.lines().find_map(|l| l.strip_prefix(prefix.as_str())).unwrap_or_else(|| panic!("{name} missing"));
        line.trim().parse().unwrap_or_else(|e| panic!("{name} = {line:?}: {e}"))
    }

    #[cfg(target_pointer_width = "64")]
    #[test]
    fn bpf_struct_offsets_match_cuda_h() {
        use std::mem::{offset_of, size_of};
        assert_eq!(size_of::<CudaMemcpy2D>(), 128);
        assert_eq!(size_of::<CudaMemcpy3D>(), 200);
        assert_eq!(bpf_define("MEMCPY2D_WIDTH_IN_BYTES"), offset_of!(CudaMemcpy2D, width_in_bytes));
        assert_eq!(bpf_define("MEMCPY2D_HEIGHT"), offset_of!(CudaMemcpy2D, height));
        assert_eq!(bpf_define("MEMCPY3D_WIDTH_IN_BYTES"), offset_of!(CudaMemcpy3D, width_in_bytes));
        assert_eq!(bpf_define("MEMCPY3D_HEIGHT"), offset_of!(CudaMemcpy3D, height));
        assert_eq!(bpf_define("MEMCPY3D_DEPTH"), offset_of!(CudaMemcpy3D, depth));
    }

    #[test]
    fn comm_stops_at_nul() {
        let mut c = [0u8; COMM_LEN];
        c[..6].copy_from_slice(b"python");
        assert_eq!(comm_to_string(&c), "python");
        assert_eq!(comm_to_string(&[b'x'; COMM_LEN]), "x".repeat(16));
    }
}
