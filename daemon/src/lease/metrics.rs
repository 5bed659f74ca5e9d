//! Metrics of the lease server and GPU control.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels of `notebookos_gpu_evictions_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvictionLabels {
    /// `checkpoint` (memory moved to host) or `resident` (driver cannot checkpoint; kept on the GPU).
    pub mode: String,
}

/// Labels of `notebookos_lease_refused_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    /// Why: `unregistered`, `pid_reused` (descends from a registered pid that now names a later
    /// process), `peer_exited`, `pid_mismatch`, `kernel_mismatch`, `bad_frame`, `bad_peer`.
    /// (Connections over a cap are counted in `notebookos_lease_connections_refused_total`.)
    pub reason: String,
}

/// Labels of `notebookos_lease_connections_refused_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnectionRefusedLabels {
    /// Which cap: `total` (all peers) or `per_uid` (the peer's user).
    pub reason: String,
}

/// The lease server's metrics (cheap to clone; clones share the values).
#[derive(Clone, Debug)]
pub struct LeaseMetrics {
    /// Leases granted.
    pub grants: Counter,
    /// Revocations sent.
    pub revocations: Counter,
    /// Connections refused, by reason.
    pub refused: Family<RefusedLabels, Counter>,
    /// Connections closed on accept because a connection cap was reached, by cap.
    pub connections_refused: Family<ConnectionRefusedLabels, Counter>,
    /// Lease-socket connections open now.
    pub connections: Gauge,
    /// Evictions, by mode.
    pub evictions: Family<EvictionLabels, Counter>,
    /// Restores that failed (the process is left without a lease).
    pub restore_failures: Counter,
    /// Request-to-grant time.
    pub acquire_seconds: Histogram,
    /// GPU memory moved to host memory by checkpoints (NVML per-process bytes before each).
    pub evicted_bytes: Counter,
    /// GPU memory moved back onto a GPU by restores.
    pub restored_bytes: Counter,
    /// Granted GPUs a shim reported its driver does not list (calls on them failed).
    pub gpus_not_visible: Counter,
}

impl Default for LeaseMetrics {
    fn default() -> Self {
        Self {
            grants: Counter::default(),
            revocations: Counter::default(),
            refused: Family::default(),
            connections_refused: Family::default(),
            connections: Gauge::default(),
            evictions: Family::default(),
            restore_failures: Counter::default(),
            acquire_seconds: Histogram::new([
                0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0,
            ]),
            evicted_bytes: Counter::default(),
            restored_bytes: Counter::default(),
            gpus_not_visible: Counter::default(),
        }
    }
}

impl LeaseMetrics {
    /// Registers every metric in `r`.
    pub fn register(&self, r: &mut Registry) {
        r.register("notebookos_lease_grants", "GPU leases granted", self.grants.clone());
        r.register("notebookos_lease_revocations", "GPU lease revocations sent", self.revocations.clone());
        r.register("notebookos_lease_refused", "Lease connections refused, by reason", self.refused.clone());
        r.register(
            "notebookos_lease_connections_refused",
            "Lease connections closed on accept because a connection cap was reached, by cap (total, per_uid)",
            self.connections_refused.clone(),
        );
        r.register("notebookos_lease_connections", "Lease socket connections open", self.connections.clone());
        r.register("notebookos_gpu_evictions", "Evictions of a process's GPU memory, by mode", self.evictions.clone());
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
        r.register(
            "notebookos_lease_gpus_not_visible",
            "Granted GPUs that a kernel process's driver did not list (its calls on them failed with \
             CUDA_ERROR_INVALID_DEVICE instead of running on another GPU), GPUs",
            self.gpus_not_visible.clone(),
        );
        r.register(
            "notebookos_lease_acquire_seconds",
            "Time from a lease request to its grant",
            self.acquire_seconds.clone(),
        );
    }
}
