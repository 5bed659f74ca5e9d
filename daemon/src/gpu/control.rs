//! Eviction and restore of a kernel process's GPU memory, on top of the driver's
//! checkpoint API. Where the API is missing or fails, memory stays resident on the GPU
//! (logged, and counted as `notebookos_gpu_evictions_total{mode="resident"}`); a failure
//! says why ([`EvictionFailure`], `notebookos_gpu_eviction_failures_total{reason}`), so the
//! lease table can fence the GPU until the memory is gone.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::gpu::checkpoint::{CheckpointApi, DriverError, ProcessState, ILLEGAL_STATE, NOT_INITIALIZED};
use crate::gpu::metrics::{EvictionFailureLabels, EvictionLabels, EvictionMetrics};
use crate::gpu::process_memory::ProcessGpuMemory;

/// How long to wait for a process's in-flight CUDA calls when locking it.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// `CUDA_ERROR_TIMEOUT`: the lock's wait for the process's CUDA calls ran out.
pub const TIMEOUT: u32 = 909;

/// What an eviction did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eviction {
    /// Memory moved to host memory; the GPU is free. The process stays locked until restore.
    Checkpointed,
    /// The process had no CUDA state; nothing to move.
    Nothing,
    /// Memory left on the GPU by configuration (no checkpoint API, or checkpointing off).
    Resident,
    /// The eviction was tried and did not free the GPU: memory is still on it.
    Failed(EvictionFailure),
}

/// Why an eviction did not free the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EvictionFailure {
    /// `cuCheckpointProcessLock` timed out (a CUDA call of the process did not end in time).
    LockTimeout,
    /// `cuCheckpointProcessLock` failed otherwise.
    LockFailed,
    /// `cuCheckpointProcessCheckpoint` failed (the process was unlocked and runs on).
    CheckpointFailed,
    /// The checkpoint said it succeeded, but NVML still shows the process's memory on a GPU.
    MemoryLeft,
}

impl EvictionFailure {
    /// The metric label and status word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LockTimeout => "lock_timeout",
            Self::LockFailed => "lock_failed",
            Self::CheckpointFailed => "checkpoint_failed",
            Self::MemoryLeft => "memory_left",
        }
    }
}

/// GPU control: evicts and restores processes by pid.
pub struct GpuControl {
    api: Option<Box<dyn CheckpointApi>>,
    metrics: EvictionMetrics,
    /// NVML's per-process memory, for the byte counters (`None`: not counted).
    memory: Option<ProcessGpuMemory>,
    /// Bytes each checkpointed process had on its GPUs, counted again when restored.
    evicted: Mutex<HashMap<u32, u64>>,
}

impl std::fmt::Debug for GpuControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuControl").field("checkpoint_api", &self.api.is_some()).finish()
    }
}

impl GpuControl {
    /// With the given checkpoint API (`None`: always keep memory resident).
    pub fn new(api: Option<Box<dyn CheckpointApi>>, metrics: impl Into<EvictionMetrics>) -> Self {
        let metrics = metrics.into();
        if api.is_none() {
            tracing::warn!("no CUDA checkpoint API: revoked GPU memory stays resident on the GPU");
        }
        let memory = match ProcessGpuMemory::open(None) {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::debug!(reason = %e, "no NVML: evicted/restored GPU bytes are not counted");
                None
            }
        };
        Self { api, metrics, memory, evicted: Mutex::new(HashMap::new()) }
    }

    /// Counts evicted/restored bytes with this NVML (e.g. one loaded from the fake-cuda
    /// TEST DOUBLE) instead of the system's.
    pub fn with_process_memory(mut self, memory: ProcessGpuMemory) -> Self {
        self.memory = Some(memory);
        self
    }

    /// Bytes `pid` holds on GPUs now; `None` (and a debug log) when NVML cannot say.
    fn bytes_of(&self, pid: u32) -> Option<u64> {
        let m = self.memory.as_ref()?;
        match m.bytes_of(pid) {
            Ok(b) => Some(b),
            Err(e) => {
                tracing::debug!(pid, reason = %e, "GPU bytes of the process unknown; not counted");
                None
            }
        }
    }

    /// Bytes `pid` holds on GPU `gpu` (the NVML index) now; `None` when NVML cannot say.
    pub fn bytes_on(&self, pid: u32, gpu: usize) -> Option<u64> {
        let m = self.memory.as_ref()?;
        match m.bytes_on(pid, gpu) {
            Ok(b) => Some(b),
            Err(e) => {
                tracing::debug!(pid, gpu, reason = %e, "GPU bytes of the process unknown");
                None
            }
        }
    }

    fn count(&self, mode: &str) {
        self.metrics.evictions.get_or_create(&EvictionLabels { mode: mode.to_owned() }).inc();
    }

    fn failed(&self, why: EvictionFailure) -> Eviction {
        self.count("resident");
        self.metrics.failures.get_or_create(&EvictionFailureLabels { reason: why.as_str().to_owned() }).inc();
        Eviction::Failed(why)
    }

    /// Locks `pid` and checkpoints its GPU memory.
    pub fn evict(&self, pid: u32) -> Eviction {
        let Some(api) = &self.api else {
            self.count("resident");
            return Eviction::Resident;
        };
        let timeout = u32::try_from(LOCK_TIMEOUT.as_millis()).unwrap_or(u32::MAX);
        match api.lock(pid, timeout) {
            Ok(()) => {}
            Err(DriverError { code: NOT_INITIALIZED, .. }) => return Eviction::Nothing,
            Err(e) => {
                tracing::warn!(pid, error = %e, "cannot lock process for checkpoint; GPU memory stays resident");
                let why = if e.code == TIMEOUT { EvictionFailure::LockTimeout } else { EvictionFailure::LockFailed };
                return self.failed(why);
            }
        }
        // Locked: the process cannot allocate or free until the checkpoint, so this is what moves.
        let bytes = self.bytes_of(pid);
        if let Err(e) = api.checkpoint(pid) {
            tracing::warn!(pid, error = %e, "checkpoint failed; GPU memory stays resident");
            if let Err(e) = api.unlock(pid) {
                tracing::error!(pid, error = %e, "unlock after a failed checkpoint failed");
            }
            return self.failed(EvictionFailure::CheckpointFailed);
        }
        // A driver that reports success but frees nothing would hand the next kernel a GPU
        // whose memory is taken: believe NVML, where it can say.
        if let Some(left) = self.bytes_of(pid).filter(|b| *b > 0) {
            tracing::error!(
                pid,
                bytes = left,
                "checkpoint reported success but the process's memory is still on the GPU"
            );
            return self.failed(EvictionFailure::MemoryLeft);
        }
        self.count("checkpoint");
        if let Some(b) = bytes {
            self.metrics.evicted_bytes.inc_by(b);
            self.evicted.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(pid, b);
        }
        Eviction::Checkpointed
    }

    /// Restores `pid`'s memory, remapping `(old, new)` GPU UUID pairs, and unlocks it.
    pub fn restore(&self, pid: u32, pairs: &[([u8; 16], [u8; 16])]) -> Result<(), DriverError> {
        let Some(api) = &self.api else { return Ok(()) };
        let remap: Vec<_> = pairs.iter().filter(|(a, b)| a != b).copied().collect();
        // The lease table knows the process was checkpointed, so restore first and only
        // ask for the state when the driver says that was wrong (saves a round trip).
        let moved = self.evicted.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&pid);
        let r = match api.restore(pid, &remap) {
            Ok(()) => {
                if let Some(b) = moved {
                    self.metrics.restored_bytes.inc_by(b);
                }
                api.unlock(pid)
            }
            Err(DriverError { code: NOT_INITIALIZED, .. }) => Ok(()),
            Err(e) if e.code == ILLEGAL_STATE => match api.state(pid) {
                Ok(ProcessState::Locked) => api.unlock(pid),
                Ok(ProcessState::Running) => Ok(()),
                Ok(_) => Err(e),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        if let Err(e) = &r {
            tracing::error!(pid, error = %e, "restoring GPU memory failed");
            self.metrics.restore_failures.inc();
        }
        r
    }
}
