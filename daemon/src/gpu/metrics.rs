//! Metrics of GPU control: evictions and restores of a process's GPU memory. The lease
//! server's metrics hold them ([`crate::lease::metrics::LeaseMetrics`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Labels of `notebookos_gpu_evictions_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvictionLabels {
    /// `checkpoint` (memory moved to host) or `resident` (driver cannot checkpoint; kept on the GPU).
    pub mode: String,
}

/// Labels of `notebookos_gpu_eviction_failures_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvictionFailureLabels {
    /// `lock_timeout`, `lock_failed`, `checkpoint_failed` or `memory_left`
    /// ([`crate::gpu::control::EvictionFailure`]).
    pub reason: String,
}

/// Eviction and restore counters (cheap to clone; clones share the values).
#[derive(Clone, Debug, Default)]
pub struct EvictionMetrics {
    /// Evictions, by mode.
    pub evictions: Family<EvictionLabels, Counter>,
    /// Evictions tried that left memory on the GPU, by reason (each fences the GPU).
    pub failures: Family<EvictionFailureLabels, Counter>,
    /// Restores that failed (the process is left without a lease).
    pub restore_failures: Counter,
    /// GPU memory moved to host memory by checkpoints (NVML per-process bytes before each).
    pub evicted_bytes: Counter,
    /// GPU memory moved back onto a GPU by restores.
    pub restored_bytes: Counter,
}

impl EvictionMetrics {
    /// Registers every metric in `r`.
    pub fn register(&self, r: &mut Registry) {
        r.register("notebookos_gpu_evictions", "Evictions of a process's GPU memory, by mode", self.evictions.clone());
        r.register(
            "notebookos_gpu_eviction_failures",
            "Evictions that left a process's memory on its GPU (the GPU is fenced), by reason",
            self.failures.clone(),
        );
        r.register(
            "notebookos_gpu_restore_failures",
            "Restores of a process's GPU memory that failed",
            self.restore_failures.clone(),
        );
        r.register(
            "notebookos_gpu_evicted_bytes",
            "GPU memory moved to host memory by checkpoints of kernel processes",
            self.evicted_bytes.clone(),
        );
        r.register(
            "notebookos_gpu_restored_bytes",
            "GPU memory moved back onto a GPU by restores of kernel processes",
            self.restored_bytes.clone(),
        );
    }
}
