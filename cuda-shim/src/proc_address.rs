//! `cuGetProcAddress`/`_v2`: the shim's own function for whatever the real driver would
//! return.
//!
//! The real driver knows which ABI version of a base name (`cuMemAlloc` → `_v2`) and
//! which per-thread-stream variant (`_ptsz`/`_ptds`) a `cudaVersion` and `flags` select,
//! so the shim asks it, finds which export that address is, and returns the shim's
//! function of the same name. An address that is none of the listed exports (a driver
//! newer than the list) is returned as is, so the program still works, ungated.

use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use crate::abi::{self, CUresult};
use crate::driver;
use crate::generated::{own_functions, COUNT};

/// `CU_GET_PROC_ADDRESS_SUCCESS`.
const FOUND: c_int = 0;
/// `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND`.
const SYMBOL_NOT_FOUND: c_int = 1;

fn own() -> &'static [usize; COUNT] {
    static OWN: OnceLock<[usize; COUNT]> = OnceLock::new();
    OWN.get_or_init(own_functions)
}

/// Shared body of both exports.
///
/// # Safety
/// The `cuGetProcAddress_v2` contract: `symbol` NULL or a C string, `pfn` NULL or
/// writable, `status` NULL or writable.
pub unsafe fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    catch_unwind(AssertUnwindSafe(|| {
        if symbol.is_null() || pfn.is_null() {
            return abi::INVALID_VALUE;
        }
        type V2 = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult;
        type V1 = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CUresult;
        let mut real: *mut c_void = std::ptr::null_mut();
        let mut st: c_int = SYMBOL_NOT_FOUND;
        let r = if let Some(f) = driver::by_name::<V2>(c"cuGetProcAddress_v2") {
            // SAFETY: real entry point; symbol is the caller's C string, outputs are locals.
            unsafe { f(symbol, &mut real, cuda_version, flags, &mut st) }
        } else if let Some(f) = driver::by_name::<V1>(c"cuGetProcAddress") {
            // SAFETY: as above.
            let r = unsafe { f(symbol, &mut real, cuda_version, flags) };
            st = if r == abi::SUCCESS { FOUND } else { SYMBOL_NOT_FOUND };
            r
        } else {
            abi::NOT_INITIALIZED
        };
        let answer = if r == abi::SUCCESS {
            driver::name_of_address(real as usize).map_or(real, |i| own()[i] as *mut c_void)
        } else {
            std::ptr::null_mut()
        };
        // SAFETY: both output pointers checked non-null (status is optional).
        unsafe {
            *pfn = answer;
            if !status.is_null() {
                *status = st;
            }
        }
        r
    }))
    .unwrap_or(abi::UNKNOWN)
}
