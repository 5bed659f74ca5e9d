//! The driver's process checkpoint API (`cuCheckpointProcess*`, CUDA 12.8+ with GPU
//! remapping on restore), behind one trait: the seam tests replace. The calls into the CUDA
//! driver itself are `sys::cuda_checkpoint`'s.
//!
//! The driver is opened by full path (config `gpu.cuda_driver_path`, discovery, or the
//! fake-cuda TEST DOUBLE), with `RTLD_LOCAL`. The daemon never loads the shim.

use std::ffi::c_int;
use std::path::{Path, PathBuf};

use crate::sys::cuda_checkpoint::{CheckpointEntryPoints, DlError};

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

/// The checkpoint API of a driver library loaded by path.
#[derive(Debug)]
pub struct DriverCheckpoint {
    path: PathBuf,
    entry_points: CheckpointEntryPoints,
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
        match CheckpointEntryPoints::load(path) {
            Ok(entry_points) => Ok(Self { path: path.to_owned(), entry_points }),
            Err(DlError::Open(reason)) => Err(LoadError::Open { path: path.to_owned(), reason }),
            Err(DlError::Missing(symbol)) => Err(LoadError::Missing { path: path.to_owned(), symbol }),
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
        check("cuCheckpointProcessLock", pid, self.entry_points.lock(p, timeout_ms))
    }

    fn checkpoint(&self, pid: u32) -> Result<(), DriverError> {
        let p = c_pid("cuCheckpointProcessCheckpoint", pid)?;
        check("cuCheckpointProcessCheckpoint", pid, self.entry_points.checkpoint(p))
    }

    fn restore(&self, pid: u32, pairs: &[([u8; 16], [u8; 16])]) -> Result<(), DriverError> {
        let p = c_pid("cuCheckpointProcessRestore", pid)?;
        let code = self.entry_points.restore(p, pairs).ok_or(DriverError {
            op: "cuCheckpointProcessRestore",
            pid,
            code: 1,
        })?;
        check("cuCheckpointProcessRestore", pid, code)
    }

    fn unlock(&self, pid: u32) -> Result<(), DriverError> {
        let p = c_pid("cuCheckpointProcessUnlock", pid)?;
        check("cuCheckpointProcessUnlock", pid, self.entry_points.unlock(p))
    }

    fn state(&self, pid: u32) -> Result<ProcessState, DriverError> {
        let p = c_pid("cuCheckpointProcessGetState", pid)?;
        let (code, s) = self.entry_points.get_state(p);
        check("cuCheckpointProcessGetState", pid, code)?;
        Ok(match s {
            0 => ProcessState::Running,
            1 => ProcessState::Locked,
            2 => ProcessState::Checkpointed,
            other => ProcessState::Failed(other),
        })
    }
}
