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
        let ordinal = match lease.physical(ordinal) {
            Ok(p) => p,
            Err(e) => return e,
        };
        let mut dev = 0;
        // SAFETY: real entry point; output is a local.
        let r = unsafe { f(&mut dev, ordinal) };
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
        let dev = match lease.physical(dev) {
            Ok(p) => p,
            Err(e) => return e,
        };
        // SAFETY: real entry point, caller's arguments with the device mapped.
        created(unsafe { f(ctx, dev) }, ctx)
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
        let dev = match lease.physical(dev) {
            Ok(p) => p,
            Err(e) => return e,
        };
        // SAFETY: real entry point, caller's arguments with the device mapped.
        created(unsafe { f(ctx, flags, dev) }, ctx)
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
        let dev = match lease.physical(dev) {
            Ok(p) => p,
            Err(e) => return e,
        };
        // SAFETY: real entry point, caller's arguments with the device mapped.
        created(unsafe { f(ctx, params, n, flags, dev) }, ctx)
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
        let dev = match lease.physical(dev) {
            Ok(p) => p,
            Err(e) => return e,
        };
        // SAFETY: real entry point, caller's arguments with the device mapped.
        created(unsafe { f(ctx, params, flags, dev) }, ctx)
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
