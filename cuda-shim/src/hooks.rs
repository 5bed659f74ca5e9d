//! Hand-written exports: the calls whose meaning the shim changes. `build.rs` skips
//! generating a pass-through for every `pub unsafe extern "C" fn` defined here.

#![expect(clippy::missing_safety_doc, reason = "the CUDA driver API contract applies to every export")]

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::abi::{self, CUresult};
use crate::client::{self, Phase};
use crate::driver;
use crate::gate::{gated, ungated};

/// `cuInit`: loads the real driver, initialises it, registers with the host.
#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    ungated(|_| {
        let Some(f) = driver::by_name::<unsafe extern "C" fn(c_uint) -> CUresult>(c"cuInit") else {
            return abi::NOT_INITIALIZED;
        };
        // SAFETY: real cuInit, same signature.
        unsafe { f(flags) }
    })
}

/// `cuDeviceGetCount`: the virtual device count (the lease's size).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    if count.is_null() {
        return abi::INVALID_VALUE;
    }
    let managed = client::phase() != Phase::Unmanaged;
    ungated(|lease| {
        type F = unsafe extern "C" fn(*mut c_int) -> CUresult;
        let Some(f) = driver::by_name::<F>(c"cuDeviceGetCount") else { return abi::NOT_INITIALIZED };
        let mut real = 0;
        // SAFETY: real entry point; output is a local.
        let r = unsafe { f(&mut real) };
        if r != abi::SUCCESS {
            return r;
        }
        // SAFETY: checked non-null above; caller's output pointer.
        unsafe { *count = if managed { lease.devices as c_int } else { real } };
        abi::SUCCESS
    })
}

/// `cuDeviceGet`: virtual ordinals `0..n` are the devices.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut c_int, ordinal: c_int) -> CUresult {
    if device.is_null() {
        return abi::INVALID_VALUE;
    }
    ungated(|lease| {
        type F = unsafe extern "C" fn(*mut c_int, c_int) -> CUresult;
        let Some(f) = driver::by_name::<F>(c"cuDeviceGet") else { return abi::NOT_INITIALIZED };
        let mut dev = 0;
        // SAFETY: real entry point; output is a local.
        let r = unsafe { f(&mut dev, lease.physical(ordinal)) };
        if r == abi::SUCCESS {
            // SAFETY: checked non-null; the CUdevice handed out is the virtual ordinal.
            unsafe { *device = lease.virtual_of(dev) };
        }
        r
    })
}

/// `cuCtxGetDevice`: answers with the virtual ordinal.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut c_int) -> CUresult {
    if device.is_null() {
        return abi::INVALID_VALUE;
    }
    gated(|lease| {
        type F = unsafe extern "C" fn(*mut c_int) -> CUresult;
        let Some(f) = driver::by_name::<F>(c"cuCtxGetDevice") else { return abi::NOT_FOUND };
        let mut dev = 0;
        // SAFETY: real entry point; output is a local.
        let r = unsafe { f(&mut dev) };
        if r == abi::SUCCESS {
            // SAFETY: checked non-null.
            unsafe { *device = lease.virtual_of(dev) };
        }
        r
    })
}

fn created(r: CUresult, ctx: *mut *mut c_void) -> CUresult {
    if r == abi::SUCCESS {
        // SAFETY: the real driver just wrote a context through this non-null pointer.
        client::track_context(unsafe { *ctx } as usize);
    }
    r
}

/// `cuDevicePrimaryCtxRetain`: maps the device, remembers the context for revoke.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut *mut c_void, dev: c_int) -> CUresult {
    if ctx.is_null() {
        return abi::INVALID_VALUE;
    }
    gated(|lease| {
        type F = unsafe extern "C" fn(*mut *mut c_void, c_int) -> CUresult;
        let Some(f) = driver::by_name::<F>(c"cuDevicePrimaryCtxRetain") else { return abi::NOT_FOUND };
        // SAFETY: real entry point, caller's arguments with the device mapped.
        created(unsafe { f(ctx, lease.physical(dev)) }, ctx)
    })
}

/// `cuCtxCreate_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(ctx: *mut *mut c_void, flags: c_uint, dev: c_int) -> CUresult {
    if ctx.is_null() {
        return abi::INVALID_VALUE;
    }
    gated(|lease| {
        type F = unsafe extern "C" fn(*mut *mut c_void, c_uint, c_int) -> CUresult;
        let Some(f) = driver::by_name::<F>(c"cuCtxCreate_v2") else { return abi::NOT_FOUND };
        // SAFETY: real entry point, caller's arguments with the device mapped.
        created(unsafe { f(ctx, flags, lease.physical(dev)) }, ctx)
    })
}

/// `cuCtxCreate_v3`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v3(
    ctx: *mut *mut c_void,
    params: *mut c_void,
    n: c_int,
    flags: c_uint,
    dev: c_int,
) -> CUresult {
    if ctx.is_null() {
        return abi::INVALID_VALUE;
    }
    gated(|lease| {
        type F = unsafe extern "C" fn(*mut *mut c_void, *mut c_void, c_int, c_uint, c_int) -> CUresult;
        let Some(f) = driver::by_name::<F>(c"cuCtxCreate_v3") else { return abi::NOT_FOUND };
        // SAFETY: real entry point, caller's arguments with the device mapped.
        created(unsafe { f(ctx, params, n, flags, lease.physical(dev)) }, ctx)
    })
}

/// `cuCtxCreate_v4`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v4(
    ctx: *mut *mut c_void,
    params: *mut c_void,
    flags: c_uint,
    dev: c_int,
) -> CUresult {
    if ctx.is_null() {
        return abi::INVALID_VALUE;
    }
    gated(|lease| {
        type F = unsafe extern "C" fn(*mut *mut c_void, *mut c_void, c_uint, c_int) -> CUresult;
        let Some(f) = driver::by_name::<F>(c"cuCtxCreate_v4") else { return abi::NOT_FOUND };
        // SAFETY: real entry point, caller's arguments with the device mapped.
        created(unsafe { f(ctx, params, flags, lease.physical(dev)) }, ctx)
    })
}

/// `cuMemGetInfo_v2`: clamped to the host's memory limit for the process.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    if free.is_null() || total.is_null() {
        return abi::INVALID_VALUE;
    }
    gated(|_| {
        type F = unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult;
        let Some(f) = driver::by_name::<F>(c"cuMemGetInfo_v2") else { return abi::NOT_FOUND };
        let (mut fr, mut to) = (0usize, 0usize);
        // SAFETY: real entry point; outputs are locals.
        let r = unsafe { f(&mut fr, &mut to) };
        if r == abi::SUCCESS {
            let limit = usize::try_from(client::memory_limit()).unwrap_or(usize::MAX);
            if limit > 0 {
                let used: usize = ALLOCATIONS.lock().as_ref().map_or(0, |m| m.values().sum());
                to = to.min(limit);
                fr = fr.min(limit.saturating_sub(used));
            }
            // SAFETY: both checked non-null.
            unsafe {
                *free = fr;
                *total = to;
            }
        }
        r
    })
}

/// Bytes of live `cuMemAlloc_v2` allocations, by pointer; only kept while the host set a
/// memory limit (so the common case does no bookkeeping at all).
static ALLOCATIONS: parking_lot::Mutex<Option<std::collections::HashMap<u64, usize>>> = parking_lot::Mutex::new(None);

/// `cuMemAlloc_v2`: refused with `CUDA_ERROR_OUT_OF_MEMORY` beyond the host's limit.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut u64, bytes: usize) -> CUresult {
    if dptr.is_null() {
        return abi::INVALID_VALUE;
    }
    gated(|_| {
        type F = unsafe extern "C" fn(*mut u64, usize) -> CUresult;
        let Some(f) = driver::by_name::<F>(c"cuMemAlloc_v2") else { return abi::NOT_FOUND };
        let limit = usize::try_from(client::memory_limit()).unwrap_or(usize::MAX);
        if limit == 0 {
            // SAFETY: real entry point, the caller's arguments.
            return unsafe { f(dptr, bytes) };
        }
        let mut live = ALLOCATIONS.lock();
        let map = live.get_or_insert_with(std::collections::HashMap::new);
        let used: usize = map.values().sum();
        if used.saturating_add(bytes) > limit {
            return abi::OUT_OF_MEMORY;
        }
        // SAFETY: real entry point, the caller's arguments.
        let r = unsafe { f(dptr, bytes) };
        if r == abi::SUCCESS {
            // SAFETY: the driver just wrote the new pointer through this non-null pointer.
            map.insert(unsafe { *dptr }, bytes);
        }
        r
    })
}

/// `cuMemFree_v2`: keeps the limit's bookkeeping.
#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: u64) -> CUresult {
    gated(|_| {
        type F = unsafe extern "C" fn(u64) -> CUresult;
        let Some(f) = driver::by_name::<F>(c"cuMemFree_v2") else { return abi::NOT_FOUND };
        // SAFETY: real entry point, the caller's argument.
        let r = unsafe { f(dptr) };
        if r == abi::SUCCESS {
            if let Some(map) = ALLOCATIONS.lock().as_mut() {
                map.remove(&dptr);
            }
        }
        r
    })
}

/// `cuGetProcAddress` (CUDA 11.3–12.4 signature).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    // SAFETY: the caller's cuGetProcAddress contract is the same.
    unsafe { crate::proc_address::get_proc_address(symbol, pfn, cuda_version, flags, std::ptr::null_mut()) }
}

/// `cuGetProcAddress_v2` (CUDA 12.0+): also fills `symbolStatus`.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    // SAFETY: the caller's cuGetProcAddress_v2 contract is the same.
    unsafe { crate::proc_address::get_proc_address(symbol, pfn, cuda_version, flags, status) }
}
