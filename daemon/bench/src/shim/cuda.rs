//! The CUDA driver API as `nbos bench shim` calls it: a library opened by path (the
//! driver itself, or the shim as `libcuda.so.1`) and the C signatures of the entry points
//! the child times.

use std::ffi::{c_int, c_uint, c_void, CStr, CString};
use std::path::Path;

use anyhow::{bail, Context};

/// A library opened by path with `RTLD_LOCAL`.
pub(super) struct Lib(*mut c_void);

impl Lib {
    pub(super) fn open(path: &Path) -> anyhow::Result<Self> {
        let c = CString::new(path.as_os_str().as_encoded_bytes()).context("path with NUL")?;
        // SAFETY: valid C string; RTLD_LOCAL keeps its symbols out of the global scope.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            // SAFETY: dlerror returns NULL or a message.
            let e = unsafe { libc::dlerror() };
            let msg = if e.is_null() {
                String::new()
            } else {
                // SAFETY: non-null dlerror message.
                unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
            };
            bail!("cannot load {}: {msg}", path.display());
        }
        Ok(Self(h))
    }

    pub(super) fn has(&self, name: &CStr) -> bool {
        // SAFETY: live handle, NUL-terminated name.
        !unsafe { libc::dlsym(self.0, name.as_ptr()) }.is_null()
    }

    /// # Safety
    /// `F` must be the C signature of `name`.
    pub(super) unsafe fn get<F: Copy>(&self, name: &CStr) -> anyhow::Result<F> {
        // SAFETY: live handle, NUL-terminated name.
        let p = unsafe { libc::dlsym(self.0, name.as_ptr()) };
        if p.is_null() {
            bail!("missing {}", name.to_string_lossy());
        }
        // SAFETY: caller guarantees F is a function pointer type of this symbol.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
    }
}

pub(super) type Init = unsafe extern "C" fn(c_uint) -> u32;
pub(super) type Version = unsafe extern "C" fn(*mut c_int) -> u32;
pub(super) type DeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> u32;
pub(super) type Retain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> u32;
pub(super) type SetCurrent = unsafe extern "C" fn(*mut c_void) -> u32;
pub(super) type Load = unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> u32;
pub(super) type GetFn = unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const i8) -> u32;
pub(super) type Alloc = unsafe extern "C" fn(*mut u64, usize) -> u32;
pub(super) type Free = unsafe extern "C" fn(u64) -> u32;
pub(super) type Sync = unsafe extern "C" fn() -> u32;
pub(super) type HtoDAsync = unsafe extern "C" fn(u64, *const c_void, usize, *mut c_void) -> u32;
pub(super) type Launch = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> u32;

/// An empty `fill_f32` for a real GPU; the fake driver ignores the image and runs its own.
pub(super) const PTX: &CStr = c".version 7.0
.target sm_50
.address_size 64
.visible .entry fill_f32(.param .u64 p0, .param .f32 p1, .param .u64 p2) { ret; }
";

pub(super) fn check(what: &str, r: u32) -> anyhow::Result<()> {
    if r != 0 {
        bail!("{what} returned CUresult {r}");
    }
    Ok(())
}
