//! Fault injection into the checkpoint API, for tests of the daemon's failure paths.
//!
//! A test writes `<FAKE_CUDA_STATE_DIR>/faults/<op>` (`op`: `lock`, `checkpoint` or
//! `restore`) holding one word; every process sharing the state directory reads it at
//! each request of that kind, until the file is removed:
//! - `timeout`: the call fails with `CUDA_ERROR_TIMEOUT` at once (no wait: tests stay quick).
//! - `fail`: the call fails with `CUDA_ERROR_UNKNOWN`; nothing changes.
//! - `leave` (checkpoint only): the call succeeds, but the process's bytes stay charged
//!   to its GPUs, as a driver that freed nothing would leave them (NVML keeps showing them).

use std::path::{Path, PathBuf};

use crate::config::config;

/// One of the checkpoint API's requests that can be made to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `cuCheckpointProcessLock`.
    Lock,
    /// `cuCheckpointProcessCheckpoint`.
    Checkpoint,
    /// `cuCheckpointProcessRestore`.
    Restore,
}

/// What a request does under an injected fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Fails with `CUDA_ERROR_TIMEOUT`.
    Timeout,
    /// Fails with `CUDA_ERROR_UNKNOWN`.
    Fail,
    /// Succeeds but leaves the memory charged to the GPUs.
    Leave,
}

impl Op {
    fn file(self) -> &'static str {
        match self {
            Op::Lock => "lock",
            Op::Checkpoint => "checkpoint",
            Op::Restore => "restore",
        }
    }
}

/// Where the fault of `op` is written, under `state_dir`.
pub fn path(state_dir: &Path, op: Op) -> PathBuf {
    state_dir.join("faults").join(op.file())
}

/// The fault injected into `op` now, if any (an unknown word is reported on stderr and ignored).
pub fn injected(op: Op) -> Option<Fault> {
    let text = std::fs::read_to_string(path(&config().state_dir, op)).ok()?;
    match text.trim() {
        "timeout" => Some(Fault::Timeout),
        "fail" => Some(Fault::Fail),
        "leave" if op == Op::Checkpoint => Some(Fault::Leave),
        other => {
            eprintln!("fake-cuda (test double): fault {other:?} for {} is not one of timeout, fail, leave", op.file());
            None
        }
    }
}
