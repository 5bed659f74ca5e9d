//! Metrics of the cluster's elasticity: replica moves (migration), counted by the meta
//! leader, which begins, finishes and aborts them; and the autoscaler's scale events.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Labels of `notebookos_migrations_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MoveLabels {
    /// `all_yield` or `drain` ([`crate::cluster::control::records::MoveReason`]).
    pub reason: &'static str,
    /// `started`, `completed`, `aborted`, or `no_host` (nowhere to go now).
    pub result: &'static str,
}

/// Labels of `notebookos_migration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// `all_yield` or `drain`.
    pub reason: &'static str,
}

/// Labels of `notebookos_autoscale_hosts_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScaleLabels {
    /// `out` (hosts requested) or `in` (hosts released).
    pub direction: &'static str,
    /// `ok` or `failed` (the drain gave up, or one provider call failed: each retry counts).
    pub result: &'static str,
}

/// Move and scaling metrics (cheap to clone: every field is shared).
#[derive(Debug, Clone)]
pub struct ElasticMetrics {
    /// Moves by reason and result.
    pub moves: Family<MoveLabels, Counter>,
    /// A move begun → the new replica in the kernel's record, seconds.
    pub seconds: Family<ReasonLabels, Histogram>,
    /// Hosts the autoscaler asked for or released, by result.
    pub scaled_hosts: Family<ScaleLabels, Counter>,
    /// Hosts requested from the provider that have not registered yet.
    pub hosts_booting: Gauge,
    /// Hosts that left the cluster whose release the provider has not done yet (retried).
    pub hosts_unreleased: Gauge,
    /// Decisions the autoscaler made while this host led the meta group.
    pub decisions: Counter,
}

impl Default for ElasticMetrics {
    fn default() -> Self {
        fn buckets() -> Histogram {
            Histogram::new(exponential_buckets(0.05, 2.0, 14))
        }
        Self {
            moves: Family::default(),
            seconds: Family::new_with_constructor(buckets),
            scaled_hosts: Family::default(),
            hosts_booting: Gauge::default(),
            hosts_unreleased: Gauge::default(),
            decisions: Counter::default(),
        }
    }
}

impl ElasticMetrics {
    /// Counts one move event.
    pub fn count(&self, reason: &'static str, result: &'static str) {
        self.moves.get_or_create(&MoveLabels { reason, result }).inc();
    }

    /// A registry holding these metrics (names as exported, units in the names).
    pub fn registry(&self) -> Registry {
        let mut r = Registry::default();
        r.register(
            "notebookos_migrations",
            "Replica moves by reason (all_yield, drain) and result (started, completed, aborted, no_host)",
            self.moves.clone(),
        );
        r.register(
            "notebookos_migration_seconds",
            "A replica move begun until the new replica replaced the old one in the kernel's record",
            self.seconds.clone(),
        );
        r.register(
            "notebookos_autoscale_hosts",
            "Hosts the autoscaler requested (out) or released (in), by result",
            self.scaled_hosts.clone(),
        );
        r.register(
            "notebookos_autoscale_hosts_booting",
            "Hosts requested from the autoscaling provider that have not registered yet",
            self.hosts_booting.clone(),
        );
        r.register(
            "notebookos_autoscale_hosts_unreleased",
            "Hosts that left the cluster for a scale-in whose release the provider failed so far (retried)",
            self.hosts_unreleased.clone(),
        );
        r.register(
            "notebookos_autoscale_decisions",
            "Decisions the autoscaler made (one per interval while this host leads the meta group)",
            self.decisions.clone(),
        );
        r
    }
}
