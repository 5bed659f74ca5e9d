//! `cuGetProcAddress` of the test double: base name (+ per-thread-stream flag) to one
//! of this library's own exports.

use std::ffi::c_void;
use std::sync::OnceLock;

use crate::alloc_variants::*;
use crate::api::*;
use crate::checkpoint::*;

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
pub const PER_THREAD_DEFAULT_STREAM: u64 = 2;

macro_rules! table {
    ($($f:ident),* $(,)?) => {
        vec![$((stringify!($f), $f as *const () as usize)),*]
    };
}

fn exports() -> &'static [(&'static str, usize)] {
    static T: OnceLock<Vec<(&'static str, usize)>> = OnceLock::new();
    T.get_or_init(|| {
        table![
            cuInit,
            cuDriverGetVersion,
            cuDeviceGetCount,
            cuDeviceGet,
            cuDeviceGetName,
            cuDeviceGetUuid,
            cuDeviceGetUuid_v2,
            cuDeviceTotalMem_v2,
            cuDeviceGetAttribute,
            cuDevicePrimaryCtxRetain,
            cuDevicePrimaryCtxRelease_v2,
            cuCtxCreate_v2,
            cuCtxDestroy_v2,
            cuCtxSetCurrent,
            cuCtxGetCurrent,
            cuCtxPushCurrent_v2,
            cuCtxPopCurrent_v2,
            cuCtxGetDevice,
            cuCtxSynchronize,
            cuMemAlloc_v2,
            cuMemFree_v2,
            cuMemGetInfo_v2,
            cuMemAllocPitch_v2,
            cuDeviceGetDefaultMemPool,
            cuMemAllocManaged,
            cuMemAllocAsync,
            cuMemAllocAsync_ptsz,
            cuMemAllocFromPoolAsync,
            cuMemAllocFromPoolAsync_ptsz,
            cuMemFreeAsync,
            cuMemFreeAsync_ptsz,
            cuMemCreate,
            cuMemRelease,
            cuMemcpyHtoD_v2,
            cuMemcpyHtoD_v2_ptds,
            cuMemcpyHtoDAsync_v2,
            cuMemcpyHtoDAsync_v2_ptsz,
            cuMemcpyDtoH_v2,
            cuMemcpyDtoH_v2_ptds,
            cuMemcpyDtoHAsync_v2,
            cuMemcpyDtoD_v2,
            cuMemsetD8_v2,
            cuMemsetD32_v2,
            cuModuleLoadData,
            cuModuleUnload,
            cuModuleGetFunction,
            cuLaunchKernel,
            cuLaunchKernel_ptsz,
            cuLaunchKernelEx,
            cuLaunchKernelEx_ptsz,
            cuGraphLaunch,
            cuStreamCreate,
            cuStreamDestroy_v2,
            cuStreamSynchronize,
            cuEventCreate,
            cuEventRecord,
            cuEventSynchronize,
            cuEventElapsedTime,
            cuEventDestroy_v2,
            cuGetErrorName,
            cuGetErrorString,
            cuGetProcAddress,
            cuGetProcAddress_v2,
            cuCheckpointProcessLock,
            cuCheckpointProcessCheckpoint,
            cuCheckpointProcessRestore,
            cuCheckpointProcessUnlock,
            cuCheckpointProcessGetState,
            cuCheckpointProcessGetRestoreThreadId,
        ]
    })
}

fn lookup(name: &str) -> Option<*mut c_void> {
    exports().iter().find(|(n, _)| *n == name).map(|(_, p)| *p as *mut c_void)
}

/// Resolves a base name (`cuMemAlloc`) the way the driver does: the per-thread-stream
/// variant when asked for, then the newest ABI version this library has.
pub fn resolve(name: &[u8], _cuda_version: i32, flags: u64) -> Option<*mut c_void> {
    let name = std::str::from_utf8(name).ok()?;
    let mut candidates = Vec::new();
    if flags & PER_THREAD_DEFAULT_STREAM != 0 {
        for v in ["_v2", ""] {
            candidates.push(format!("{name}{v}_ptds"));
            candidates.push(format!("{name}{v}_ptsz"));
        }
    }
    for v in ["_v2", ""] {
        candidates.push(format!("{name}{v}"));
    }
    candidates.iter().find_map(|c| lookup(c))
}
