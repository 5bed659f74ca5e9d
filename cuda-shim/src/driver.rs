//! The real driver: loaded by full path, never by soname (which would find the shim
//! itself), and resolved once into a table indexed like [`crate::generated::NAMES`].
//!
//! Where: under a host (`NBOS_LEASE_SOCKET` set), the path the host names when it accepts
//! the process's registration (the real `libcuda.so.1`, or the fake-cuda test double), and
//! nothing else: the kernel's environment does not say where the driver is. Unmanaged:
//! `NBOS_CUDA_DRIVER`, else the usual install locations of the NVIDIA driver.

use std::ffi::{c_void, CStr, CString};
use std::sync::OnceLock;

use crate::generated::{COUNT, NAMES};

/// Install locations tried when `NBOS_CUDA_DRIVER` is unset.
const DISCOVERY: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/usr/lib64/libcuda.so.1",
    "/usr/lib/aarch64-linux-gnu/libcuda.so.1",
    "/usr/local/nvidia/lib64/libcuda.so.1",
    "/usr/lib/wsl/lib/libcuda.so.1",
];

/// The loaded real driver.
pub struct Driver {
    /// Address of each entry point (0: the real driver lacks it).
    pub syms: Box<[usize; COUNT]>,
    /// The path it was loaded from.
    pub path: String,
}

static DRIVER: OnceLock<Option<Driver>> = OnceLock::new();

/// Asks the host which driver library to load (under a lease socket): the lease client's
/// `registered_driver_path`, wired in by the crate root when the library loads, so that
/// this lower layer never imports the client (which loads entry points from here).
static HOST_LOCATOR: OnceLock<fn() -> Option<String>> = OnceLock::new();

/// Sets where the host's answer comes from (once; the crate root does it at load time).
pub fn set_host_locator(locate: fn() -> Option<String>) {
    let _ = HOST_LOCATOR.set(locate);
}

/// The real driver, loading it on first use; `None` when it cannot be loaded.
#[inline]
pub fn get() -> Option<&'static Driver> {
    DRIVER.get_or_init(load).as_ref()
}

/// The real driver's entry point `idx` as a function of type `F`.
#[inline]
pub fn function<F: Copy>(idx: usize) -> Option<F> {
    debug_assert_eq!(size_of::<F>(), size_of::<usize>());
    let p = *get()?.syms.get(idx)?;
    if p == 0 {
        return None;
    }
    // SAFETY: F is a function-pointer type (callers only instantiate it so), the same size
    // as usize, and p is a non-null address dlsym returned for this entry point.
    Some(unsafe { std::mem::transmute_copy::<usize, F>(&p) })
}

/// Index of `name` in the table.
pub fn index(name: &CStr) -> Option<usize> {
    NAMES.binary_search_by(|n| n.to_bytes().cmp(name.to_bytes())).ok()
}

/// The real driver's entry point `name` as a function of type `F`.
pub fn by_name<F: Copy>(name: &CStr) -> Option<F> {
    function(index(name)?)
}

/// Our own file, so discovery never picks the shim up as "the real driver".
fn own_path() -> Option<std::path::PathBuf> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr fills `info` for an address inside this library (this function).
    let rc = unsafe { libc::dladdr(own_path as *const c_void, info.as_mut_ptr()) };
    if rc == 0 {
        return None;
    }
    // SAFETY: dladdr succeeded, so dli_fname is a valid NUL-terminated path (or NULL).
    let info = unsafe { info.assume_init() };
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: checked non-null above; owned by the dynamic loader for the process lifetime.
    let p = unsafe { CStr::from_ptr(info.dli_fname) };
    std::fs::canonicalize(p.to_string_lossy().as_ref()).ok()
}

fn candidate() -> Option<String> {
    if std::env::var_os("NBOS_LEASE_SOCKET").is_some() {
        // Registration does not touch the driver, so this cannot re-enter the load.
        let p = HOST_LOCATOR.get().and_then(|locate| locate());
        return match p {
            Some(p) if p.starts_with('/') => Some(p),
            Some(p) => {
                eprintln!("nbos-cuda-shim: the host named the driver {p}, not an absolute path; not loading it");
                None
            }
            None => None,
        };
    }
    if let Some(p) = std::env::var_os("NBOS_CUDA_DRIVER") {
        let p = p.to_string_lossy().into_owned();
        if !p.starts_with('/') {
            eprintln!("nbos-cuda-shim: NBOS_CUDA_DRIVER={p} is not an absolute path; refusing to load by soname");
            return None;
        }
        return Some(p);
    }
    let me = own_path();
    DISCOVERY
        .iter()
        .find(|p| std::path::Path::new(p).exists() && std::fs::canonicalize(p).ok() != me)
        .map(|p| (*p).to_owned())
}

fn load() -> Option<Driver> {
    let path = candidate()?;
    let c = CString::new(path.clone()).ok()?;
    // SAFETY: c is a valid path string; RTLD_LOCAL keeps the real driver's symbols out of
    // the global scope, so nothing else binds to them instead of the shim.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns a thread-local message or NULL.
        let err = unsafe { libc::dlerror() };
        let msg = if err.is_null() {
            String::new()
        } else {
            // SAFETY: non-null dlerror result is a NUL-terminated string.
            unsafe { CStr::from_ptr(err) }.to_string_lossy().into_owned()
        };
        eprintln!("nbos-cuda-shim: cannot load the CUDA driver {path}: {msg}");
        return None;
    }
    let mut syms = Box::new([0usize; COUNT]);
    for (slot, name) in syms.iter_mut().zip(NAMES.iter()) {
        // SAFETY: handle is a live dlopen handle; name is NUL-terminated. dlsym on a
        // handle searches that library (and its dependencies), never the shim.
        *slot = unsafe { libc::dlsym(handle, name.as_ptr()) } as usize;
    }
    Some(Driver { syms, path })
}

/// The name of the real-driver entry point at `addr`, if it is one of ours.
pub fn name_of_address(addr: usize) -> Option<usize> {
    if addr == 0 {
        return None;
    }
    get()?.syms.iter().position(|&p| p == addr)
}
