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

/// Labels of a forwarded request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ForwardLabel {
    /// write, read or keepalive.
    pub op: String,
    /// How it ended.
    pub outcome: String,
}

/// A label with an outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// How it ended.
    pub outcome: String,
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
    /// Groups stopped on this node after a broken invariant (the raft library panicked).
    pub groups_failed: Counter,
    /// Leader changes observed.
    pub leader_changes: Counter,
    /// Open connections to peer nodes (one per peer).
    pub peer_connections: Gauge,
    /// Requests this node forwarded to a leader, by op and outcome (ok, error, not_leader,
    /// not_sent, lost, timeout, overloaded, late_answer).
    pub forwarded: Family<ForwardLabel, Counter>,
    /// Forwarded requests this node ran for peers, by outcome (ok, error, not_leader, overloaded).
    pub forward_served: Family<OutcomeLabel, Counter>,
    /// Forwarded requests waiting for the leader's answer.
    pub forward_in_flight: Gauge,
    /// Round trip of a forwarded request that was answered.
    pub forward_seconds: Histogram,
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
            groups_failed: Counter::default(),
            leader_changes: Counter::default(),
            peer_connections: Gauge::default(),
            forwarded: Family::default(),
            forward_served: Family::default(),
            forward_in_flight: Gauge::default(),
            forward_seconds: Histogram::new(exponential_buckets(0.000_1, 2.0, 16)),
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
        r.register(
            "groups_failed",
            "Raft groups stopped on this node after a broken invariant (the node's other groups go on)",
            self.groups_failed.clone(),
        );
        r.register("leader_changes", "Leader changes observed", self.leader_changes.clone());
        r.register("peer_connections", "Open connections to peer nodes", self.peer_connections.clone());
        r.register("forwarded_requests", "Requests forwarded to a group's leader", self.forwarded.clone());
        r.register("forward_served_requests", "Forwarded requests run for peers", self.forward_served.clone());
        r.register("forward_in_flight", "Forwarded requests awaiting an answer", self.forward_in_flight.clone());
        r.register("forward_seconds", "Round trip of an answered forwarded request", self.forward_seconds.clone());
    }

    /// Counts a forwarded request's outcome.
    pub fn forward_outcome(&self, op: &str, outcome: &str) {
        self.forwarded.get_or_create(&ForwardLabel { op: op.to_owned(), outcome: outcome.to_owned() }).inc();
    }

    /// Current value of a forwarded-request counter.
    pub fn forwarded_count(&self, op: &str, outcome: &str) -> u64 {
        self.forwarded.get_or_create(&ForwardLabel { op: op.to_owned(), outcome: outcome.to_owned() }).get()
    }

    /// Counts a forwarded request served for a peer.
    pub fn forward_served(&self, outcome: &str) {
        self.forward_served.get_or_create(&OutcomeLabel { outcome: outcome.to_owned() }).inc();
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
