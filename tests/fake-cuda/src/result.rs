//! The `CUresult` codes the test double returns (values from `cuda.h`).

/// A CUDA driver result code.
pub type CUresult = u32;

/// `CUDA_SUCCESS`.
pub const SUCCESS: CUresult = 0;
/// `CUDA_ERROR_INVALID_VALUE`.
pub const INVALID_VALUE: CUresult = 1;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const OUT_OF_MEMORY: CUresult = 2;
/// `CUDA_ERROR_NOT_INITIALIZED`.
pub const NOT_INITIALIZED: CUresult = 3;
/// `CUDA_ERROR_NO_DEVICE`.
pub const NO_DEVICE: CUresult = 100;
/// `CUDA_ERROR_INVALID_DEVICE`.
pub const INVALID_DEVICE: CUresult = 101;
/// `CUDA_ERROR_INVALID_CONTEXT`.
pub const INVALID_CONTEXT: CUresult = 201;
/// `CUDA_ERROR_OPERATING_SYSTEM`.
pub const OPERATING_SYSTEM: CUresult = 304;
/// `CUDA_ERROR_INVALID_HANDLE`.
pub const INVALID_HANDLE: CUresult = 400;
/// `CUDA_ERROR_ILLEGAL_STATE`.
pub const ILLEGAL_STATE: CUresult = 401;
/// `CUDA_ERROR_NOT_FOUND`.
pub const NOT_FOUND: CUresult = 500;
/// `CUDA_ERROR_ILLEGAL_ADDRESS`.
pub const ILLEGAL_ADDRESS: CUresult = 700;
/// `CUDA_ERROR_NOT_PERMITTED`.
pub const NOT_PERMITTED: CUresult = 800;
/// `CUDA_ERROR_NOT_SUPPORTED`.
pub const NOT_SUPPORTED: CUresult = 801;
/// `CUDA_ERROR_TIMEOUT`.
pub const TIMEOUT: CUresult = 909;
/// `CUDA_ERROR_UNKNOWN` (also what a caught panic becomes).
pub const UNKNOWN: CUresult = 999;

/// The `cuda.h` name of a code, for `cuGetErrorName`.
pub fn name(code: CUresult) -> &'static core::ffi::CStr {
    match code {
        SUCCESS => c"CUDA_SUCCESS",
        INVALID_VALUE => c"CUDA_ERROR_INVALID_VALUE",
        OUT_OF_MEMORY => c"CUDA_ERROR_OUT_OF_MEMORY",
        NOT_INITIALIZED => c"CUDA_ERROR_NOT_INITIALIZED",
        NO_DEVICE => c"CUDA_ERROR_NO_DEVICE",
        INVALID_DEVICE => c"CUDA_ERROR_INVALID_DEVICE",
        INVALID_CONTEXT => c"CUDA_ERROR_INVALID_CONTEXT",
        OPERATING_SYSTEM => c"CUDA_ERROR_OPERATING_SYSTEM",
        INVALID_HANDLE => c"CUDA_ERROR_INVALID_HANDLE",
        ILLEGAL_STATE => c"CUDA_ERROR_ILLEGAL_STATE",
        NOT_FOUND => c"CUDA_ERROR_NOT_FOUND",
        ILLEGAL_ADDRESS => c"CUDA_ERROR_ILLEGAL_ADDRESS",
        NOT_PERMITTED => c"CUDA_ERROR_NOT_PERMITTED",
        NOT_SUPPORTED => c"CUDA_ERROR_NOT_SUPPORTED",
        TIMEOUT => c"CUDA_ERROR_TIMEOUT",
        _ => c"CUDA_ERROR_UNKNOWN",
    }
}
