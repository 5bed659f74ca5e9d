//! The built-in "kernels" of the test double. They really compute on simulated device
//! memory so tests can check results after eviction and restore.
//!
//! Parameters arrive as in `cuLaunchKernel`: `kernelParams[i]` points at argument `i`.
//! - `fill_f32(float* dst, float value, uint64 n)`: `dst[i] = value`
//! - `axpy_f32(float* y, const float* x, float a, uint64 n)`: `y[i] += a * x[i]`
//! - `sum_f32(float* out, const float* x, uint64 n)`: `out[0] = sum(x)` (accumulated in f64)

use std::ffi::c_void;

use crate::result::{self, CUresult};
use crate::state::Driver;

/// A built-in kernel; its `CUfunction` handle is `kind as usize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Kernel {
    /// `fill_f32`.
    Fill = 0xf1,
    /// `axpy_f32`.
    Axpy = 0xf2,
    /// `sum_f32`.
    Sum = 0xf3,
}

impl Kernel {
    /// By name (`cuModuleGetFunction`).
    pub fn by_name(name: &[u8]) -> Option<Self> {
        match name {
            b"fill_f32" => Some(Self::Fill),
            b"axpy_f32" => Some(Self::Axpy),
            b"sum_f32" => Some(Self::Sum),
            _ => None,
        }
    }

    /// By `CUfunction` handle.
    pub fn by_handle(h: usize) -> Option<Self> {
        [Self::Fill, Self::Axpy, Self::Sum].into_iter().find(|k| *k as usize == h)
    }
}

/// Reads argument `i` of type `T`.
///
/// # Safety
/// `params` must be a `kernelParams` array with at least `i + 1` entries, entry `i`
/// pointing at a readable `T` (the `cuLaunchKernel` contract).
unsafe fn arg<T: Copy>(params: *mut *mut c_void, i: usize) -> Result<T, CUresult> {
    // SAFETY: caller guarantees the array has entry i.
    let p = unsafe { *params.add(i) };
    if p.is_null() {
        return Err(result::INVALID_VALUE);
    }
    // SAFETY: caller guarantees entry i points at a T; unaligned read tolerates any packing.
    Ok(unsafe { (p as *const T).read_unaligned() })
}

/// Runs `k` now.
///
/// # Safety
/// `params` must follow the `cuLaunchKernel` contract for `k`'s signature.
pub unsafe fn launch(d: &mut Driver, k: Kernel, params: *mut *mut c_void) -> CUresult {
    if params.is_null() {
        return result::INVALID_VALUE;
    }
    // SAFETY: forwarded caller contract.
    match unsafe { run(d, k, params) } {
        Ok(()) => result::SUCCESS,
        Err(e) => e,
    }
}

unsafe fn run(d: &mut Driver, k: Kernel, params: *mut *mut c_void) -> Result<(), CUresult> {
    match k {
        Kernel::Fill => {
            // SAFETY: caller contract: (ptr, f32, u64).
            let (dst, value, n) = unsafe { (arg::<u64>(params, 0)?, arg::<f32>(params, 1)?, arg::<u64>(params, 2)?) };
            let dst = slice_mut(d, dst, n)?;
            dst.fill(value);
        }
        Kernel::Axpy => {
            // SAFETY: caller contract: (ptr, ptr, f32, u64).
            let (y, x, a, n) = unsafe {
                (arg::<u64>(params, 0)?, arg::<u64>(params, 1)?, arg::<f32>(params, 2)?, arg::<u64>(params, 3)?)
            };
            let x: Vec<f32> = slice_mut(d, x, n)?.to_vec();
            let y = slice_mut(d, y, n)?;
            for (yi, xi) in y.iter_mut().zip(x) {
                *yi += a * xi;
            }
        }
        Kernel::Sum => {
            // SAFETY: caller contract: (ptr, ptr, u64).
            let (out, x, n) = unsafe { (arg::<u64>(params, 0)?, arg::<u64>(params, 1)?, arg::<u64>(params, 2)?) };
            let s: f64 = slice_mut(d, x, n)?.iter().map(|v| f64::from(*v)).sum();
            slice_mut(d, out, 1)?[0] = s as f32;
        }
    }
    Ok(())
}

fn slice_mut(d: &mut Driver, ptr: u64, n: u64) -> Result<&mut [f32], CUresult> {
    let n = usize::try_from(n).map_err(|_| result::INVALID_VALUE)?;
    let len = n.checked_mul(4).ok_or(result::INVALID_VALUE)?;
    d.check_range(ptr, len)?;
    if !ptr.is_multiple_of(4) {
        return Err(result::ILLEGAL_ADDRESS);
    }
    // SAFETY: check_range proved [ptr, ptr+len) lies in one live read-write mapping of this
    // process; work is serialised under the STATE lock, so no other slice aliases it now.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr as *mut f32, n) })
}
