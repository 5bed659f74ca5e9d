//! The test double's allocation entry points besides `cuMemAlloc_v2`: pitched, managed,
//! stream-ordered (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`, `cuMemFreeAsync`) and
//! virtual memory management (`cuMemCreate`/`cuMemRelease`). All take device memory
//! from the same capacity ledger, so the shim's limit and oversubscription behave as for
//! `cuMemAlloc_v2`.
//!
//! Simplifications (this is a TEST DOUBLE): work runs at submission, so stream-ordered
//! calls complete at once; memory pools are not simulated (a pool allocation comes from
//! the current device); a `cuMemCreate` handle is the address of host memory standing
//! for the physical allocation (`cuMemMap` is not simulated).

#![expect(clippy::missing_safety_doc, reason = "the CUDA driver API contract applies to every export")]

use std::ffi::{c_int, c_uint, c_void};

use crate::api::{allocate, allocate_current, free, CUdeviceptr, Handle};
use crate::config::config;
use crate::result::{self, CUresult};
use crate::state::{gated, ungated};

/// Row alignment of `cuMemAllocPitch_v2` (what current GPUs use).
pub const PITCH_ALIGNMENT: usize = 512;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
const LOCATION_DEVICE: u32 = 1;

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: c_uint,
) -> CUresult {
    if pitch.is_null() || width == 0 || height == 0 || ![4, 8, 16].contains(&element_size) {
        return result::INVALID_VALUE;
    }
    let Some(row) = width.checked_next_multiple_of(PITCH_ALIGNMENT) else { return result::INVALID_VALUE };
    let Some(bytes) = row.checked_mul(height) else { return result::OUT_OF_MEMORY };
    let r = allocate_current(dptr, bytes);
    if r == result::SUCCESS {
        // SAFETY: checked non-null; the caller's output.
        unsafe { pitch.write(row) };
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytes: usize, _flags: c_uint) -> CUresult {
    allocate_current(dptr, bytes)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytes: usize, _stream: Handle) -> CUresult {
    allocate_current(dptr, bytes)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, _stream: Handle) -> CUresult {
    allocate_current(dptr, bytes)
}

/// A device's default memory pool: a token naming the device (pools are not simulated).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(pool: *mut Handle, dev: c_int) -> CUresult {
    ungated(|| {
        if pool.is_null() {
            return result::INVALID_VALUE;
        }
        let Some(index) = usize::try_from(dev).ok().filter(|i| *i < config().gpus.len()) else {
            return result::INVALID_DEVICE;
        };
        // SAFETY: checked non-null; the caller's output.
        unsafe { pool.write((0xfa4e_0000 + index) as Handle) };
        result::SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    _pool: Handle,
    _stream: Handle,
) -> CUresult {
    allocate_current(dptr, bytes)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    _pool: Handle,
    _stream: Handle,
) -> CUresult {
    allocate_current(dptr, bytes)
}

#[no_mangle]
pub extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, _stream: Handle) -> CUresult {
    gated(|d| free(d, dptr))
}

#[no_mangle]
pub extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, _stream: Handle) -> CUresult {
    gated(|d| free(d, dptr))
}

/// `CUmemAllocationProp` up to its location (type, requested handle types, location).
#[repr(C)]
struct AllocationPropHead {
    kind: u32,
    handle_types: u32,
    location_type: u32,
    location_id: i32,
}

#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(handle: *mut u64, bytes: usize, prop: *const c_void, _flags: u64) -> CUresult {
    if handle.is_null() || prop.is_null() {
        return result::INVALID_VALUE;
    }
    // SAFETY: non-null `CUmemAllocationProp*` per the API contract; its head has this layout.
    let head = unsafe { prop.cast::<AllocationPropHead>().read_unaligned() };
    if head.location_type != LOCATION_DEVICE {
        return result::INVALID_VALUE;
    }
    let Ok(dev) = u32::try_from(head.location_id) else { return result::INVALID_DEVICE };
    gated(|d| match allocate(d, dev, bytes) {
        Ok(base) => {
            // SAFETY: checked non-null; the caller's output.
            unsafe { handle.write(base) };
            result::SUCCESS
        }
        Err(e) => e,
    })
}

#[no_mangle]
pub extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    gated(|d| free(d, handle))
}
