//! Prometheus metrics of the store (`notebookos_raft_*`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// A label with a reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why.
    pub reason: String,
}

/// All metrics of one store.
#[derive(Debug, Clone)]
pub struct Metrics {
    /// Proposals accepted into the log by this node as leader.
    pub proposals: Counter,
    /// Log batches written with an fsync.
    pub log_writes: Counter,
    /// Seconds per log batch write including fsync.
    pub log_write_seconds: Histogram,
    /// Inbound connections or frames rejected, by reason (tls, identity, truncated, oversized,
    /// garbage, unknown_group, wrong_sender).
    pub rejected: Family<ReasonLabel, Counter>,
    /// Outbound raft messages dropped, by reason (queue_full, partitioned, no_route, too_large).
    pub dropped: Family<ReasonLabel, Counter>,
    /// Snapshots sent to followers.
    pub snapshots_sent: Counter,
    /// Snapshots installed from a leader.
    pub snapshots_installed: Counter,
    /// Log compactions (own state-machine snapshots).
    pub compactions: Counter,
    /// Groups hosted.
    pub groups: Gauge,
    /// Groups hibernating.
    pub groups_hibernating: Gauge,
    /// Leader changes observed.
    pub leader_changes: Counter,
    /// Open connections to peer nodes (one per peer).
    pub peer_connections: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            proposals: Counter::default(),
            log_writes: Counter::default(),
            log_write_seconds: Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
            rejected: Family::default(),
            dropped: Family::default(),
            snapshots_sent: Counter::default(),
            snapshots_installed: Counter::default(),
            compactions: Counter::default(),
            groups: Gauge::default(),
            groups_hibernating: Gauge::default(),
            leader_changes: Counter::default(),
            peer_connections: Gauge::default(),
        }
    }
}

impl Metrics {
    /// Registers every metric (names get the `notebookos_raft_` prefix).
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("notebookos_raft");
        r.register("proposals", "Proposals accepted into the log by this node as leader", self.proposals.clone());
        r.register(
            "log_writes",
            "Log batches written with an fsync (at most one per loop iteration)",
            self.log_writes.clone(),
        );
        r.register("log_write_seconds", "Log batch write time including fsync", self.log_write_seconds.clone());
        r.register("transport_rejected", "Inbound connections or frames rejected", self.rejected.clone());
        r.register("messages_dropped", "Outbound raft messages dropped", self.dropped.clone());
        r.register("snapshots_sent", "Snapshots sent to followers", self.snapshots_sent.clone());
        r.register("snapshots_installed", "Snapshots installed from a leader", self.snapshots_installed.clone());
        r.register("compactions", "State-machine snapshots taken and log compactions", self.compactions.clone());
        r.register("groups", "Raft groups hosted", self.groups.clone());
        r.register("groups_hibernating", "Raft groups hibernating", self.groups_hibernating.clone());
        r.register("leader_changes", "Leader changes observed", self.leader_changes.clone());
        r.register("peer_connections", "Open connections to peer nodes", self.peer_connections.clone());
    }

    /// Counts a rejected inbound connection or frame.
    pub fn reject(&self, reason: &str) {
        self.rejected.get_or_create(&ReasonLabel { reason: reason.to_owned() }).inc();
    }

    /// Counts a dropped outbound message.
    pub fn drop_msg(&self, reason: &str) {
        self.dropped.get_or_create(&ReasonLabel { reason: reason.to_owned() }).inc();
    }

    /// Current value of a drop counter.
    pub fn dropped_count(&self, reason: &str) -> u64 {
        self.dropped.get_or_create(&ReasonLabel { reason: reason.to_owned() }).get()
    }

    /// Current value of a rejection counter (tests and the node service read it).
    pub fn rejected_count(&self, reason: &str) -> u64 {
        self.rejected.get_or_create(&ReasonLabel { reason: reason.to_owned() }).get()
    }
}
