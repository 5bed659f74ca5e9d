//! The driver's process checkpoint API (`cuCheckpointProcess*`, CUDA 12.8+ with GPU
//! remapping on restore), behind one trait: the seam tests replace, and the one place
//! the daemon calls into a CUDA driver.
//!
//! The driver is opened by full path (config `gpu.cuda_driver_path`, discovery, or the
//! fake-cuda TEST DOUBLE), with `RTLD_LOCAL`. The daemon never loads the shim.

use std::ffi::{c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};

/// `CUprocessState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessState {
    /// `CU_PROCESS_STATE_RUNNING`.
    Running,
    /// `CU_PROCESS_STATE_LOCKED`.
    Locked,
    /// `CU_PROCESS_STATE_CHECKPOINTED`.
    Checkpointed,
    /// `CU_PROCESS_STATE_FAILED` or an unknown value.
    Failed(i32),
}

/// A failed driver call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op}(pid {pid}) failed with CUresult {code}")]
pub struct DriverError {
    /// The entry point.
    pub op: &'static str,
    /// The process.
    pub pid: u32,
    /// The CUresult.
    pub code: u32,
}

/// `CUDA_ERROR_NOT_INITIALIZED`: the process has no CUDA state to checkpoint.
pub const NOT_INITIALIZED: u32 = 3;
/// `CUDA_ERROR_ILLEGAL_STATE`: the process is not in the state the call needs.
pub const ILLEGAL_STATE: u32 = 401;

/// Why the checkpoint API is unavailable.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The library could not be opened.
    #[error("cannot open CUDA driver {path}: {reason}")]
    Open {
        /// The path tried.
        path: PathBuf,
        /// `dlerror()`.
        reason: String,
    },
    /// The driver predates the checkpoint API.
    #[error("CUDA driver {path} lacks {symbol} (checkpoint API needs driver 550+/CUDA 12.8+ for GPU remapping)")]
    Missing {
        /// The library.
        path: PathBuf,
        /// The first missing entry point.
        symbol: &'static str,
    },
    /// No driver found where drivers live.
    #[error("no CUDA driver found (set gpu.cuda_driver_path)")]
    NotFound,
}

/// The checkpoint API of one driver.
pub trait CheckpointApi: Send + Sync {
    /// `cuCheckpointProcessLock`: blocks the process's CUDA calls (waits up to `timeout_ms`, 0 = forever).
    fn lock(&self, pid: u32, timeout_ms: u32) -> Result<(), DriverError>;
    /// `cuCheckpointProcessCheckpoint`: moves its GPU memory to host memory, frees the GPU.
    fn checkpoint(&self, pid: u32) -> Result<(), DriverError>;
    /// `cuCheckpointProcessRestore`, remapping GPUs by UUID (`(old, new)` pairs; empty = same GPUs).
    fn restore(&self, pid: u32, pairs: &[([u8; 16], [u8; 16])]) -> Result<(), DriverError>;
    /// `cuCheckpointProcessUnlock`.
    fn unlock(&self, pid: u32) -> Result<(), DriverError>;
    /// `cuCheckpointProcessGetState`.
    fn state(&self, pid: u32) -> Result<ProcessState, DriverError>;
}

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

/// The checkpoint API of a driver library loaded by path.
#[derive(Debug)]
pub struct DriverCheckpoint {
    path: PathBuf,
    lock: PidArgs,
    checkpoint: PidArgs,
    restore: PidArgs,
    unlock: PidArgs,
    get_state: PidOut,
}

/// Where NVIDIA installs the driver.
pub const DRIVER_LOCATIONS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/usr/lib64/libcuda.so.1",
    "/usr/lib/aarch64-linux-gnu/libcuda.so.1",
    "/usr/local/nvidia/lib64/libcuda.so.1",
];

/// The configured driver path, or the first install location that exists.
pub fn find_driver(configured: Option<&Path>) -> Result<PathBuf, LoadError> {
    if let Some(p) = configured {
        return Ok(p.to_owned());
    }
    DRIVER_LOCATIONS.iter().map(PathBuf::from).find(|p| p.exists()).ok_or(LoadError::NotFound)
}

impl DriverCheckpoint {
    /// Opens the driver at `path` (full path) and resolves the checkpoint API.
    pub fn load(path: &Path) -> Result<Self, LoadError> {
        let open_err = |reason: String| LoadError::Open { path: path.to_owned(), reason };
        let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| open_err(e.to_string()))?;
        // SAFETY: c is a valid C string; RTLD_LOCAL keeps the driver's symbols private to us.
        // The handle is never closed: the functions below must stay valid for the daemon's life.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            // SAFETY: dlerror returns NULL or a NUL-terminated message.
            let e = unsafe { libc::dlerror() };
            let reason = if e.is_null() {
                "unknown error".to_owned()
            } else {
                // SAFETY: non-null dlerror message.
                unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
            };
            return Err(open_err(reason));
        }
        let sym = |name: &'static CStr| -> Result<usize, LoadError> {
            // SAFETY: h is a live handle; name is NUL-terminated.
            let p = unsafe { libc::dlsym(h, name.as_ptr()) } as usize;
            if p == 0 {
                return Err(LoadError::Missing {
                    path: path.to_owned(),
                    symbol: name.to_str().unwrap_or("cuCheckpointProcess*"),
                });
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
                path: path.to_owned(),
                lock: std::mem::transmute::<usize, PidArgs>(l),
                checkpoint: std::mem::transmute::<usize, PidArgs>(c),
                restore: std::mem::transmute::<usize, PidArgs>(r),
                unlock: std::mem::transmute::<usize, PidArgs>(u),
                get_state: std::mem::transmute::<usize, PidOut>(s),
            })
        }
    }

    /// The library in use.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn check(op: &'static str, pid: u32, code: u32) -> Result<(), DriverError> {
    if code == 0 {
        Ok(())
    } else {
        Err(DriverError { op, pid, code })
    }
}

fn c_pid(op: &'static str, pid: u32) -> Result<c_int, DriverError> {
    c_int::try_from(pid).map_err(|_| DriverError { op, pid, code: 1 })
}

impl CheckpointApi for DriverCheckpoint {
    fn lock(&self, pid: u32, timeout_ms: u32) -> Result<(), DriverError> {
        let p = c_pid("cuCheckpointProcessLock", pid)?;
        let args = LockArgs { timeout_ms, reserved0: 0, reserved1: [0; 7] };
        // SAFETY: driver entry point; args lives across the call.
        check("cuCheckpointProcessLock", pid, unsafe { (self.lock)(p, (&raw const args).cast()) })
    }

    fn checkpoint(&self, pid: u32) -> Result<(), DriverError> {
        let p = c_pid("cuCheckpointProcessCheckpoint", pid)?;
        // SAFETY: driver entry point; NULL args are allowed ("optional").
        check("cuCheckpointProcessCheckpoint", pid, unsafe { (self.checkpoint)(p, std::ptr::null()) })
    }

    fn restore(&self, pid: u32, pairs: &[([u8; 16], [u8; 16])]) -> Result<(), DriverError> {
        let p = c_pid("cuCheckpointProcessRestore", pid)?;
        let pairs: Vec<GpuPair> = pairs.iter().map(|(old, new)| GpuPair { old: *old, new: *new }).collect();
        let count =
            u32::try_from(pairs.len()).map_err(|_| DriverError { op: "cuCheckpointProcessRestore", pid, code: 1 })?;
        let args = RestoreArgs {
            pairs: if pairs.is_empty() { std::ptr::null() } else { pairs.as_ptr() },
            count,
            reserved: [0; 44],
            reserved1: 0,
        };
        let argp = if pairs.is_empty() { std::ptr::null() } else { (&raw const args).cast() };
        // SAFETY: driver entry point; args and the pairs it points at live across the call.
        check("cuCheckpointProcessRestore", pid, unsafe { (self.restore)(p, argp) })
    }

    fn unlock(&self, pid: u32) -> Result<(), DriverError> {
        let p = c_pid("cuCheckpointProcessUnlock", pid)?;
        // SAFETY: driver entry point; NULL args are allowed.
        check("cuCheckpointProcessUnlock", pid, unsafe { (self.unlock)(p, std::ptr::null()) })
    }

    fn state(&self, pid: u32) -> Result<ProcessState, DriverError> {
        let p = c_pid("cuCheckpointProcessGetState", pid)?;
        let mut s: c_int = -1;
        // SAFETY: driver entry point; the output is a local.
        check("cuCheckpointProcessGetState", pid, unsafe { (self.get_state)(p, &mut s) })?;
        Ok(match s {
            0 => ProcessState::Running,
            1 => ProcessState::Locked,
            2 => ProcessState::Checkpointed,
            other => ProcessState::Failed(other),
        })
    }
}

// SAFETY: the struct holds only plain function pointers into a library that is never
// unloaded; the driver's checkpoint API is documented as callable from any thread.
unsafe impl Send for DriverCheckpoint {}
// SAFETY: as above; no interior state.
unsafe impl Sync for DriverCheckpoint {}
