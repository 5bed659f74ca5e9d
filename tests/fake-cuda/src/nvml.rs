//! A small NVML subset of the test double, enough for an NVML-based inventory
//! (`nvml-wrapper` loaded from this library's path) to list the simulated GPUs.

#![expect(clippy::missing_safety_doc, reason = "the NVML API contract applies to every export")]

use std::ffi::{c_char, c_uint, c_void};

use crate::config::{config, uuid_string};

/// `NVML_SUCCESS`.
pub const NVML_SUCCESS: c_uint = 0;
/// `NVML_ERROR_INVALID_ARGUMENT`.
pub const NVML_ERROR_INVALID_ARGUMENT: c_uint = 2;
/// `NVML_ERROR_INSUFFICIENT_SIZE`.
pub const NVML_ERROR_INSUFFICIENT_SIZE: c_uint = 7;
/// `NVML_ERROR_UNKNOWN`.
pub const NVML_ERROR_UNKNOWN: c_uint = 999;

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmlMemory {
    /// Total bytes.
    pub total: u64,
    /// Free bytes.
    pub free: u64,
    /// Used bytes.
    pub used: u64,
}

fn guarded(f: impl FnOnce() -> c_uint) -> c_uint {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(NVML_ERROR_UNKNOWN)
}

/// A device handle is its index + 1 (never NULL).
fn gpu(h: *mut c_void) -> Option<&'static crate::config::FakeGpu> {
    (h as usize).checked_sub(1).and_then(|i| config().gpus.get(i))
}

fn write_str(s: &str, buf: *mut c_char, len: c_uint) -> c_uint {
    if buf.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if s.len() + 1 > len as usize {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller provides `len` writable bytes; we write s.len() + 1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
        *buf.add(s.len()) = 0;
    }
    NVML_SUCCESS
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> c_uint {
    NVML_SUCCESS
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> c_uint {
    NVML_SUCCESS
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> c_uint {
    NVML_SUCCESS
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(_code: c_uint) -> *const c_char {
    c"fake-cuda (test double) NVML error".as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(buf: *mut c_char, len: c_uint) -> c_uint {
    guarded(|| write_str("fake-cuda-test-double", buf, len))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> c_uint {
    guarded(|| {
        if count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-null output pointer.
        unsafe { count.write(config().gpus.len() as c_uint) };
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, dev: *mut *mut c_void) -> c_uint {
    guarded(|| {
        if dev.is_null() || index as usize >= config().gpus.len() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-null output pointer.
        unsafe { dev.write((index as usize + 1) as *mut c_void) };
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(dev: *mut c_void, buf: *mut c_char, len: c_uint) -> c_uint {
    guarded(|| match gpu(dev) {
        Some(g) => write_str(&uuid_string(&g.uuid), buf, len),
        None => NVML_ERROR_INVALID_ARGUMENT,
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(dev: *mut c_void, buf: *mut c_char, len: c_uint) -> c_uint {
    guarded(|| match gpu(dev) {
        Some(_) => write_str("Simulated GPU (fake-cuda test double)", buf, len),
        None => NVML_ERROR_INVALID_ARGUMENT,
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(dev: *mut c_void, index: *mut c_uint) -> c_uint {
    guarded(|| match gpu(dev) {
        Some(g) if !index.is_null() => {
            // SAFETY: non-null output pointer.
            unsafe { index.write(g.index) };
            NVML_SUCCESS
        }
        _ => NVML_ERROR_INVALID_ARGUMENT,
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(dev: *mut c_void, mem: *mut NvmlMemory) -> c_uint {
    guarded(|| match gpu(dev) {
        Some(g) if !mem.is_null() => {
            let used = crate::ledger::used(g).unwrap_or(0).min(g.memory_bytes);
            // SAFETY: non-null output pointer.
            unsafe { mem.write(NvmlMemory { total: g.memory_bytes, free: g.memory_bytes - used, used }) };
            NVML_SUCCESS
        }
        _ => NVML_ERROR_INVALID_ARGUMENT,
    })
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvmlMemoryV2 {
    /// Struct version (set by the caller).
    pub version: c_uint,
    /// Total bytes.
    pub total: u64,
    /// Reserved by the driver, bytes.
    pub reserved: u64,
    /// Free bytes.
    pub free: u64,
    /// Used bytes.
    pub used: u64,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(dev: *mut c_void, mem: *mut NvmlMemoryV2) -> c_uint {
    guarded(|| match gpu(dev) {
        Some(g) if !mem.is_null() => {
            let used = crate::ledger::used(g).unwrap_or(0).min(g.memory_bytes);
            // SAFETY: non-null output pointer; the caller set `version`, which we keep.
            unsafe {
                (*mem).total = g.memory_bytes;
                (*mem).reserved = 0;
                (*mem).free = g.memory_bytes - used;
                (*mem).used = used;
            }
            NVML_SUCCESS
        }
        _ => NVML_ERROR_INVALID_ARGUMENT,
    })
}

/// `nvmlProcessInfo_t` (the v2/v3 layout; `_v1` has only `pid` and `usedGpuMemory`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvmlProcessInfo {
    /// Process id.
    pub pid: c_uint,
    /// Bytes of GPU memory the process holds.
    pub used_gpu_memory: u64,
    /// MIG GPU instance (`0xFFFFFFFF`: not MIG).
    pub gpu_instance_id: c_uint,
    /// MIG compute instance (`0xFFFFFFFF`: not MIG).
    pub compute_instance_id: c_uint,
}

/// `gpuInstanceId`/`computeInstanceId` of a process on a GPU without MIG.
pub const NO_MIG_INSTANCE: c_uint = 0xFFFF_FFFF;

/// The compute processes on `dev`, from the capacity ledger, with NVML's size-query
/// contract: `*count` is the capacity of `infos` on entry and the number of processes
/// on return; too small a buffer gives `NVML_ERROR_INSUFFICIENT_SIZE` (and the count).
fn running_processes(dev: *mut c_void, count: *mut c_uint, infos: *mut NvmlProcessInfo) -> c_uint {
    let Some(g) = gpu(dev) else { return NVML_ERROR_INVALID_ARGUMENT };
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let Ok(procs) = crate::ledger::processes(g) else { return NVML_ERROR_UNKNOWN };
    // SAFETY: non-null in/out pointer.
    let capacity = unsafe { count.read() } as usize;
    let n = c_uint::try_from(procs.len()).unwrap_or(c_uint::MAX);
    // SAFETY: non-null in/out pointer.
    unsafe { count.write(n) };
    if procs.len() > capacity {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if procs.is_empty() {
        return NVML_SUCCESS;
    }
    if infos.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    for (i, &(pid, bytes)) in procs.iter().enumerate() {
        let info = NvmlProcessInfo {
            pid,
            used_gpu_memory: bytes,
            gpu_instance_id: NO_MIG_INSTANCE,
            compute_instance_id: NO_MIG_INSTANCE,
        };
        // SAFETY: the caller provides `capacity` >= procs.len() elements at `infos`.
        unsafe { infos.add(i).write(info) };
    }
    NVML_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    dev: *mut c_void,
    count: *mut c_uint,
    infos: *mut NvmlProcessInfo,
) -> c_uint {
    guarded(|| running_processes(dev, count, infos))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    dev: *mut c_void,
    count: *mut c_uint,
    infos: *mut NvmlProcessInfo,
) -> c_uint {
    guarded(|| running_processes(dev, count, infos))
}
