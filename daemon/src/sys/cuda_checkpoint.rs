//! The CUDA driver's process checkpoint entry points (`cuCheckpointProcess*`), loaded
//! from a driver library by full path with `RTLD_LOCAL` (dlopen(3), dlsym(3)) and called
//! with the argument structs they take. Each call returns the driver's `CUresult`;
//! `gpu::checkpoint` turns them into its errors.

use std::ffi::{c_int, c_void, CStr};
use std::path::Path;

#[repr(C)]
struct LockArgs {
    timeout_ms: u32,
    reserved0: u32,
    reserved1: [u64; 7],
}

#[repr(C)]
struct GpuPair {
    old: [u8; 16],
    new: [u8; 16],
}

#[repr(C)]
struct RestoreArgs {
    pairs: *const GpuPair,
    count: u32,
    reserved: [u8; 44],
    reserved1: u64,
}

type PidArgs = unsafe extern "C" fn(c_int, *const c_void) -> u32;
type PidOut = unsafe extern "C" fn(c_int, *mut c_int) -> u32;

/// Why the library's entry points could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DlError {
    /// dlopen failed (`dlerror()`'s message).
    #[error("{0}")]
    Open(String),
    /// The first entry point the library lacks.
    #[error("missing {0}")]
    Missing(&'static str),
}

/// The checkpoint entry points of a driver library that is never unloaded.
#[derive(Debug)]
pub struct CheckpointEntryPoints {
    lock: PidArgs,
    checkpoint: PidArgs,
    restore: PidArgs,
    unlock: PidArgs,
    get_state: PidOut,
}

impl CheckpointEntryPoints {
    /// Opens the driver at `path` (full path) and resolves the checkpoint API.
    pub fn load(path: &Path) -> Result<Self, DlError> {
        // RTLD_LOCAL keeps the driver's symbols private to us. The handle is never closed:
        // the functions below must stay valid for the daemon's life.
        let h = super::dynamic_library::open(path, libc::RTLD_NOW | libc::RTLD_LOCAL).map_err(DlError::Open)?.as_ptr();
        let sym = |name: &'static CStr| -> Result<usize, DlError> {
            // SAFETY: h is a live handle; name is NUL-terminated.
            let p = unsafe { libc::dlsym(h, name.as_ptr()) } as usize;
            if p == 0 {
                return Err(DlError::Missing(name.to_str().unwrap_or("cuCheckpointProcess*")));
            }
            Ok(p)
        };
        let (l, c, r, u, s) = (
            sym(c"cuCheckpointProcessLock")?,
            sym(c"cuCheckpointProcessCheckpoint")?,
            sym(c"cuCheckpointProcessRestore")?,
            sym(c"cuCheckpointProcessUnlock")?,
            sym(c"cuCheckpointProcessGetState")?,
        );
        // SAFETY: each address is the driver's export of that entry point, whose C signature
        // is `CUresult f(int pid, <args>*)`; every args struct is passed by pointer.
        unsafe {
            Ok(Self {
                lock: std::mem::transmute::<usize, PidArgs>(l),
                checkpoint: std::mem::transmute::<usize, PidArgs>(c),
                restore: std::mem::transmute::<usize, PidArgs>(r),
                unlock: std::mem::transmute::<usize, PidArgs>(u),
                get_state: std::mem::transmute::<usize, PidOut>(s),
            })
        }
    }

    /// `cuCheckpointProcessLock(pid, {timeout_ms})`.
    pub fn lock(&self, pid: c_int, timeout_ms: u32) -> u32 {
        let args = LockArgs { timeout_ms, reserved0: 0, reserved1: [0; 7] };
        // SAFETY: driver entry point; args lives across the call.
        unsafe { (self.lock)(pid, (&raw const args).cast()) }
    }

    /// `cuCheckpointProcessCheckpoint(pid, NULL)`.
    pub fn checkpoint(&self, pid: c_int) -> u32 {
        // SAFETY: driver entry point; NULL args are allowed ("optional").
        unsafe { (self.checkpoint)(pid, std::ptr::null()) }
    }

    /// `cuCheckpointProcessRestore(pid, {pairs})`, NULL args when `pairs` is empty; None
    /// when there are more pairs than a `u32` counts.
    pub fn restore(&self, pid: c_int, pairs: &[([u8; 16], [u8; 16])]) -> Option<u32> {
        let pairs: Vec<GpuPair> = pairs.iter().map(|(old, new)| GpuPair { old: *old, new: *new }).collect();
        let count = u32::try_from(pairs.len()).ok()?;
        let args = RestoreArgs {
            pairs: if pairs.is_empty() { std::ptr::null() } else { pairs.as_ptr() },
            count,
            reserved: [0; 44],
            reserved1: 0,
        };
        let argp = if pairs.is_empty() { std::ptr::null() } else { (&raw const args).cast() };
        // SAFETY: driver entry point; args and the pairs it points at live across the call.
        Some(unsafe { (self.restore)(pid, argp) })
    }

    /// `cuCheckpointProcessUnlock(pid, NULL)`.
    pub fn unlock(&self, pid: c_int) -> u32 {
        // SAFETY: driver entry point; NULL args are allowed.
        unsafe { (self.unlock)(pid, std::ptr::null()) }
    }

    /// `cuCheckpointProcessGetState(pid, &state)`: the result and the state.
    pub fn get_state(&self, pid: c_int) -> (u32, c_int) {
        let mut s: c_int = -1;
        // SAFETY: driver entry point; the output is a local.
        let code = unsafe { (self.get_state)(pid, &mut s) };
        (code, s)
    }
}

// SAFETY: the struct holds only plain function pointers into a library that is never
// unloaded; the driver's checkpoint API is documented as callable from any thread.
unsafe impl Send for CheckpointEntryPoints {}
// SAFETY: as above; no interior state.
unsafe impl Sync for CheckpointEntryPoints {}
