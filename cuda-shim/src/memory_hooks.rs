//! Hand-written exports for device memory: every allocation entry point is held to the
//! host's limit ([`crate::memory_limit`]), every matching free gives its bytes back, and
//! `cuMemGetInfo_v2` reports the lease's view (total = the limit, free = what is left of
//! it), as does `cuDeviceTotalMem_v2`. `build.rs` skips generating a pass-through for every `pub unsafe extern "C" fn`
//! defined here, as for `hooks.rs`.
//!
//! Counted: `cuMemAlloc_v2`, `cuMemAllocPitch_v2` (pitch × height, as the driver laid it
//! out), `cuMemAllocManaged`, `cuMemAllocAsync`(`_ptsz`), `cuMemAllocFromPoolAsync`(`_ptsz`)
//! and `cuMemCreate`; given back by `cuMemFree_v2`, `cuMemFreeAsync`(`_ptsz`) and
//! `cuMemRelease`. Host allocations (`cuMemAllocHost_v2`, `cuMemHostAlloc`) are not device
//! memory and pass through.

#![expect(clippy::missing_safety_doc, reason = "the CUDA driver API contract applies to every export")]

use std::ffi::{c_uint, c_void};

use crate::abi::{self, CUresult};
use crate::driver;
use crate::gate::{gated, ungated};
use crate::memory_limit::{self, Key};

/// Runs the allocation `call` of `bytes` under the limit: refused with
/// `CUDA_ERROR_OUT_OF_MEMORY` when it does not fit, recorded as `key()` when it succeeds.
fn limited(bytes: usize, call: impl FnOnce() -> CUresult, key: impl FnOnce() -> Key) -> CUresult {
    let Some(limit) = memory_limit::limit() else { return call() };
    if !memory_limit::reserve(limit, bytes) {
        return abi::OUT_OF_MEMORY;
    }
    let r = call();
    if r == abi::SUCCESS {
        memory_limit::commit(key(), bytes);
    } else {
        memory_limit::unreserve(bytes);
    }
    r
}

/// Reads the device pointer the driver just wrote.
fn written(dptr: *mut u64) -> Key {
    // SAFETY: only called after the driver succeeded writing through this non-null pointer.
    Key::Pointer(unsafe { *dptr })
}

/// `cuMemGetInfo_v2`: with a limit, total is the limit and free what is left of it (never
/// more than the device really has free).
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
            if let Some(limit) = memory_limit::limit() {
                to = to.min(limit);
                fr = fr.min(limit.saturating_sub(memory_limit::used()));
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

/// `cuDeviceTotalMem_v2`: with a limit, no more than the limit (frameworks size their
/// caches from it). A device query: answered without a lease.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: i32) -> CUresult {
    if bytes.is_null() {
        return abi::INVALID_VALUE;
    }
    ungated(|lease| {
        type F = unsafe extern "C" fn(*mut usize, i32) -> CUresult;
        let Some(f) = driver::by_name::<F>(c"cuDeviceTotalMem_v2") else { return abi::NOT_FOUND };
        let dev = match lease.physical(dev) {
            Ok(p) => p,
            Err(e) => return e,
        };
        let mut total = 0usize;
        // SAFETY: real entry point; output is a local, the device mapped to the lease's GPU.
        let r = unsafe { f(&mut total, dev) };
        if r == abi::SUCCESS {
            // SAFETY: checked non-null.
            unsafe { *bytes = memory_limit::limit().map_or(total, |l| total.min(l)) };
        }
        r
    })
}

/// `cuMemAlloc_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut u64, bytes: usize) -> CUresult {
    if dptr.is_null() {
        return abi::INVALID_VALUE;
    }
    gated(|_| {
        type F = unsafe extern "C" fn(*mut u64, usize) -> CUresult;
        let Some(f) = driver::by_name::<F>(c"cuMemAlloc_v2") else { return abi::NOT_FOUND };
        // SAFETY: real entry point, the caller's arguments.
        limited(bytes, || unsafe { f(dptr, bytes) }, || written(dptr))
    })
}

/// `cuMemAllocPitch_v2`: the driver picks the pitch, so at least `width × height` is
/// reserved first and the rest once the pitch is known (freed again if it does not fit).
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut u64,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: c_uint,
) -> CUresult {
    if dptr.is_null() || pitch.is_null() {
        return abi::INVALID_VALUE;
    }
    gated(|_| {
        type F = unsafe extern "C" fn(*mut u64, *mut usize, usize, usize, c_uint) -> CUresult;
        let Some(f) = driver::by_name::<F>(c"cuMemAllocPitch_v2") else { return abi::NOT_FOUND };
        // SAFETY: real entry point, the caller's arguments.
        let call = || unsafe { f(dptr, pitch, width, height, element_size) };
        let Some(limit) = memory_limit::limit() else { return call() };
        let at_least = width.saturating_mul(height);
        if !memory_limit::reserve(limit, at_least) {
            return abi::OUT_OF_MEMORY;
        }
        let r = call();
        if r != abi::SUCCESS {
            memory_limit::unreserve(at_least);
            return r;
        }
        // SAFETY: the driver succeeded, so it wrote both non-null outputs.
        let (ptr, laid_out) = unsafe { (*dptr, (*pitch).saturating_mul(height)) };
        let extra = laid_out.saturating_sub(at_least);
        if !memory_limit::reserve(limit, extra) {
            memory_limit::unreserve(at_least);
            if let Some(free) = driver::by_name::<unsafe extern "C" fn(u64) -> CUresult>(c"cuMemFree_v2") {
                // SAFETY: frees the allocation just made, which nobody else has seen.
                unsafe { free(ptr) };
            }
            return abi::OUT_OF_MEMORY;
        }
        memory_limit::commit(Key::Pointer(ptr), at_least + extra);
        r
    })
}

/// `cuMemAllocManaged`: counted as device memory (it can all migrate to the GPU).
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(dptr: *mut u64, bytes: usize, flags: c_uint) -> CUresult {
    if dptr.is_null() {
        return abi::INVALID_VALUE;
    }
    gated(|_| {
        type F = unsafe extern "C" fn(*mut u64, usize, c_uint) -> CUresult;
        let Some(f) = driver::by_name::<F>(c"cuMemAllocManaged") else { return abi::NOT_FOUND };
        // SAFETY: real entry point, the caller's arguments.
        limited(bytes, || unsafe { f(dptr, bytes, flags) }, || written(dptr))
    })
}

/// The stream-ordered allocations (`cuMemAllocAsync` and its `_ptsz` twin).
fn alloc_async(name: &std::ffi::CStr, dptr: *mut u64, bytes: usize, stream: *mut c_void) -> CUresult {
    if dptr.is_null() {
        return abi::INVALID_VALUE;
    }
    gated(|_| {
        type F = unsafe extern "C" fn(*mut u64, usize, *mut c_void) -> CUresult;
        let Some(f) = driver::by_name::<F>(name) else { return abi::NOT_FOUND };
        // SAFETY: real entry point of this name, the caller's arguments.
        limited(bytes, || unsafe { f(dptr, bytes, stream) }, || written(dptr))
    })
}

/// `cuMemAllocAsync`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(dptr: *mut u64, bytes: usize, stream: *mut c_void) -> CUresult {
    alloc_async(c"cuMemAllocAsync", dptr, bytes, stream)
}

/// `cuMemAllocAsync_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(dptr: *mut u64, bytes: usize, stream: *mut c_void) -> CUresult {
    alloc_async(c"cuMemAllocAsync_ptsz", dptr, bytes, stream)
}

/// Allocations from a memory pool (`cuMemAllocFromPoolAsync` and its `_ptsz` twin).
fn alloc_from_pool(
    name: &std::ffi::CStr,
    dptr: *mut u64,
    bytes: usize,
    pool: *mut c_void,
    stream: *mut c_void,
) -> CUresult {
    if dptr.is_null() {
        return abi::INVALID_VALUE;
    }
    gated(|_| {
        type F = unsafe extern "C" fn(*mut u64, usize, *mut c_void, *mut c_void) -> CUresult;
        let Some(f) = driver::by_name::<F>(name) else { return abi::NOT_FOUND };
        // SAFETY: real entry point of this name, the caller's arguments.
        limited(bytes, || unsafe { f(dptr, bytes, pool, stream) }, || written(dptr))
    })
}

/// `cuMemAllocFromPoolAsync`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut u64,
    bytes: usize,
    pool: *mut c_void,
    stream: *mut c_void,
) -> CUresult {
    alloc_from_pool(c"cuMemAllocFromPoolAsync", dptr, bytes, pool, stream)
}

/// `cuMemAllocFromPoolAsync_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut u64,
    bytes: usize,
    pool: *mut c_void,
    stream: *mut c_void,
) -> CUresult {
    alloc_from_pool(c"cuMemAllocFromPoolAsync_ptsz", dptr, bytes, pool, stream)
}

/// `CUmemAllocationProp` (the same 32 bytes in CUDA 12.x and 13.x): type, requested
/// handle types, location (type, id), win32 metadata, flags.
#[repr(C)]
#[derive(Clone, Copy)]
struct AllocationProp {
    kind: u32,
    handle_types: u32,
    location_type: u32,
    location_id: i32,
    win32: *mut c_void,
    flags: [u8; 8],
}

/// `CU_MEM_LOCATION_TYPE_DEVICE`.
const LOCATION_DEVICE: u32 = 1;

/// `cuMemCreate`: counted by handle; a device location is a virtual ordinal, mapped to
/// the leased GPU.
#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(handle: *mut u64, bytes: usize, prop: *const c_void, flags: u64) -> CUresult {
    if handle.is_null() || prop.is_null() {
        return abi::INVALID_VALUE;
    }
    // SAFETY: non-null `const CUmemAllocationProp*` per the API contract; read as a copy.
    let mut mapped = unsafe { prop.cast::<AllocationProp>().read_unaligned() };
    gated(|lease| {
        if mapped.location_type == LOCATION_DEVICE {
            mapped.location_id = match lease.physical(mapped.location_id) {
                Ok(p) => p,
                Err(e) => return e,
            };
        }
        type F = unsafe extern "C" fn(*mut u64, usize, *const c_void, u64) -> CUresult;
        let Some(f) = driver::by_name::<F>(c"cuMemCreate") else { return abi::NOT_FOUND };
        let prop = (&raw const mapped).cast::<c_void>();
        // SAFETY: real entry point; the caller's arguments with the location mapped.
        let call = || unsafe { f(handle, bytes, prop, flags) };
        // SAFETY: only called after the driver succeeded, so it wrote the non-null handle.
        let key = || Key::Handle(unsafe { *handle });
        limited(bytes, call, key)
    })
}

/// Frees of device pointers (`cuMemFree_v2`, `cuMemFreeAsync`(`_ptsz`)).
fn free_pointer(name: &std::ffi::CStr, dptr: u64, stream: Option<*mut c_void>) -> CUresult {
    gated(|_| {
        let r = match stream {
            None => {
                let Some(f) = driver::by_name::<unsafe extern "C" fn(u64) -> CUresult>(name) else {
                    return abi::NOT_FOUND;
                };
                // SAFETY: real entry point of this name, the caller's argument.
                unsafe { f(dptr) }
            }
            Some(s) => {
                type F = unsafe extern "C" fn(u64, *mut c_void) -> CUresult;
                let Some(f) = driver::by_name::<F>(name) else { return abi::NOT_FOUND };
                // SAFETY: real entry point of this name, the caller's arguments.
                unsafe { f(dptr, s) }
            }
        };
        if r == abi::SUCCESS {
            memory_limit::release(Key::Pointer(dptr));
        }
        r
    })
}

/// `cuMemFree_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: u64) -> CUresult {
    free_pointer(c"cuMemFree_v2", dptr, None)
}

/// `cuMemFreeAsync`.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: u64, stream: *mut c_void) -> CUresult {
    free_pointer(c"cuMemFreeAsync", dptr, Some(stream))
}

/// `cuMemFreeAsync_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: u64, stream: *mut c_void) -> CUresult {
    free_pointer(c"cuMemFreeAsync_ptsz", dptr, Some(stream))
}

/// `cuMemRelease`.
#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    gated(|_| {
        let Some(f) = driver::by_name::<unsafe extern "C" fn(u64) -> CUresult>(c"cuMemRelease") else {
            return abi::NOT_FOUND;
        };
        // SAFETY: real entry point, the caller's argument.
        let r = unsafe { f(handle) };
        if r == abi::SUCCESS {
            memory_limit::release(Key::Handle(handle));
        }
        r
    })
}
