//! Metrics of namespace synchronisation on this host: what its executors committed and
//! what its followers applied. Rendered after the daemon's own metrics.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Labels of `notebookos_sync_bytes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PathLabels {
    /// `log` (inline in the kernel's raft log) or `object_store` (content-addressed object).
    pub path: &'static str,
}

/// Labels of the apply counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApplyLabels {
    /// `kernel` (the follower's kernel ran the apply) or `count_only` (a cell that changed no
    /// names: only its execution count is kept, set when the replica next executes).
    pub mode: &'static str,
}

/// Labels of `notebookos_sync_failures_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SideLabels {
    /// `export` (the executor's export or commit) or `apply` (a follower's apply attempt).
    pub side: &'static str,
}

/// Sync metrics (cheap to clone: every field is shared).
#[derive(Debug, Clone)]
pub struct SyncMetrics {
    /// Cells whose namespace changes this host committed as executor.
    pub cells_exported: Counter,
    /// Payload bytes committed, by path.
    pub bytes: Family<PathLabels, Counter>,
    /// Names left out because they cannot be pickled (each named in a warning on its cell).
    pub unpicklable_names: Counter,
    /// Export + commit time on a cell's path (before its reply is released), seconds.
    pub export_seconds: Histogram,
    /// Committed cells this host's followers applied, by mode.
    pub cells_applied: Family<ApplyLabels, Counter>,
    /// Time for a follower to apply one cell in its kernel, seconds.
    pub apply_seconds: Histogram,
    /// Failed exports and apply attempts.
    pub failures: Family<SideLabels, Counter>,
    /// Kernel groups (each a kernel's namespace log) this host holds that no kernel record
    /// names: a kernel deleted while this host was away. The supervisor destroys them.
    pub groups_unknown: Gauge,
}

impl Default for SyncMetrics {
    fn default() -> Self {
        Self {
            cells_exported: Counter::default(),
            bytes: Family::default(),
            unpicklable_names: Counter::default(),
            export_seconds: Histogram::new(exponential_buckets(0.000_5, 2.0, 18)),
            cells_applied: Family::default(),
            apply_seconds: Histogram::new(exponential_buckets(0.000_5, 2.0, 18)),
            failures: Family::default(),
            groups_unknown: Gauge::default(),
        }
    }
}

impl SyncMetrics {
    /// A registry holding these metrics (names as exported, units in the names).
    pub fn registry(&self) -> Registry {
        let mut r = Registry::default();
        let s = r.sub_registry_with_prefix("notebookos_sync");
        s.register(
            "cells_exported",
            "Cells whose namespace changes this host committed as executor",
            self.cells_exported.clone(),
        );
        s.register("bytes", "Namespace payload bytes committed, by path (log or object_store)", self.bytes.clone());
        s.register(
            "unpicklable_names",
            "Names left out of sync because they cannot be pickled (named in a warning on the cell)",
            self.unpicklable_names.clone(),
        );
        s.register(
            "export_seconds",
            "Export and commit of a cell's namespace changes on its path",
            self.export_seconds.clone(),
        );
        s.register(
            "cells_applied",
            "Committed cells applied by this host's followers, by mode",
            self.cells_applied.clone(),
        );
        s.register("apply_seconds", "A follower applying one cell in its kernel", self.apply_seconds.clone());
        s.register("failures", "Failed namespace exports and apply attempts", self.failures.clone());
        s.register(
            "groups_unknown",
            "Kernel raft groups this host holds that no kernel record names (deleted while it was away; destroyed)",
            self.groups_unknown.clone(),
        );
        r
    }
}
