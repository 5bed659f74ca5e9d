//! Metrics of the lease server, with GPU control's ([`EvictionMetrics`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::gpu::metrics::EvictionMetrics;

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
    /// Evictions and restores (GPU control's).
    pub eviction: EvictionMetrics,
    /// Request-to-grant time.
    pub acquire_seconds: Histogram,
    /// GPUs fenced now: an eviction left a process's memory on them.
    pub gpus_fenced: Gauge,
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
            eviction: EvictionMetrics::default(),
            acquire_seconds: Histogram::new([
                0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0,
            ]),
            gpus_not_visible: Counter::default(),
            gpus_fenced: Gauge::default(),
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
        self.eviction.register(r);
        r.register(
            "notebookos_gpus_fenced",
            "GPUs not granted because an eviction left a kernel process's memory on them (until it is gone), GPUs",
            self.gpus_fenced.clone(),
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

/// GPU control counts into the lease server's eviction metrics.
impl From<LeaseMetrics> for EvictionMetrics {
    fn from(m: LeaseMetrics) -> Self {
        m.eviction
    }
}
