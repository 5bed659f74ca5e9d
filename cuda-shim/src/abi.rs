//! The few driver ABI types and codes the shim itself needs.

/// `CUresult`.
pub type CUresult = u32;
/// `CUDA_SUCCESS`.
pub const SUCCESS: CUresult = 0;
/// `CUDA_ERROR_INVALID_VALUE`: also what a NULL output pointer gets.
pub const INVALID_VALUE: CUresult = 1;
/// `CUDA_ERROR_OUT_OF_MEMORY`: beyond the host's per-process memory limit.
pub const OUT_OF_MEMORY: CUresult = 2;
/// `CUDA_ERROR_NOT_INITIALIZED`: the real driver could not be loaded.
pub const NOT_INITIALIZED: CUresult = 3;
/// `CUDA_ERROR_INVALID_DEVICE`.
pub const INVALID_DEVICE: CUresult = 101;
/// `CUDA_ERROR_NOT_FOUND`: the real driver lacks this entry point.
pub const NOT_FOUND: CUresult = 500;
/// `CUDA_ERROR_NOT_PERMITTED`: the host refused this process a lease.
pub const NOT_PERMITTED: CUresult = 800;
/// `CUDA_ERROR_UNKNOWN`: a hook failed internally (a caught panic, a lost host).
pub const UNKNOWN: CUresult = 999;

/// `CUipcEventHandle` / `CUipcMemHandle`, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Ipc64 {
    /// Opaque bytes.
    pub reserved: [i8; 64],
}

/// `CUmemLocation`, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemLocation {
    /// `CUmemLocationType`.
    pub kind: u32,
    /// Device ordinal or NUMA node.
    pub id: i32,
}
