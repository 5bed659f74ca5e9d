//! Trace replay in virtual time (`nbos sim`): a workload of notebook sessions replayed
//! under a scheduling policy on a model of a GPU cluster, driving the daemon's own
//! scheduler core (this crate's root modules): per-host GPU binding ([`crate::host`]),
//! placement, executor pre-selection, migration choice, scaling, drain and pre-warm.
//!
//! - [`workload`]: sessions and trainings; the Sensei CSV reader; templates.
//! - [`sessions`]: the session generator for a trace without sessions (calibrated on a template).
//! - [`synthetic`]: a synthetic workload generator.
//! - [`events`], [`engine`]: the discrete-event loop (virtual ms, deterministic ties);
//!   [`ctx`]: what policies see and act through.
//! - [`cluster`]: hosts, provisioning, the independent GPU ledger, GPU-hour integrals.
//! - [`policy`]: one file per scheduling policy.
//! - [`metrics`]: what a run measured; [`report`]: table, JSON, markdown; [`svg`]: plots;
//!   [`spread`]: intervals across seeds, spread across windows.
//!
//! Uses the scheduler core and nothing above it; no I/O (the CLI reads and writes files).

pub mod cluster;
pub mod ctx;
pub mod engine;
pub mod events;
pub mod metrics;
pub mod policy;
pub mod report;
pub mod rng;
pub mod sessions;
pub mod spread;
pub mod svg;
pub mod synthetic;
pub mod workload;

pub use engine::{run, SimError};
pub use metrics::PolicyResult;
pub use workload::Workload;

use crate::Millis;

/// The policies `nbos sim` compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PolicyKind {
    /// One container per session, its GPUs held for the whole session.
    Reservation,
    /// A fresh container per training, first come first served.
    FcfsBatch,
    /// Pre-warmed single-replica containers, one training each.
    MiddleGround,
    /// NotebookOS as in the authors' code: 3 replicas, GPUs bound per training.
    NotebookosPaper,
    /// Ours: the daemon's scheduler core and the decisions in `sched/`.
    Notebookos,
}

impl PolicyKind {
    /// All, in report order.
    pub const ALL: [PolicyKind; 5] = [
        PolicyKind::Reservation,
        PolicyKind::FcfsBatch,
        PolicyKind::MiddleGround,
        PolicyKind::NotebookosPaper,
        PolicyKind::Notebookos,
    ];

    /// The name on the command line and in the reports.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Reservation => "reservation",
            PolicyKind::FcfsBatch => "fcfs-batch",
            PolicyKind::MiddleGround => "middle-ground",
            PolicyKind::NotebookosPaper => "notebookos-paper",
            PolicyKind::Notebookos => "notebookos",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == s)
    }
}

/// The cluster model shared by all policies (each policy uses the parts it needs).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Model {
    /// GPUs per host.
    pub gpus_per_host: u32,
    /// Mean time from requesting a host to its being up.
    pub provision_ms: Millis,
    /// Half-width of the uniform jitter on `provision_ms`.
    pub provision_jitter_ms: Millis,
    /// Starting a container (kernel process) that is not pre-warmed.
    pub container_start_ms: Millis,
    /// Loading a notebook's state into a fresh or migrated replica/container.
    pub state_load_ms: Millis,
    /// Executor election (replicated policies): one quorum-fsynced CAS.
    pub election_ms: Millis,
    /// Ours: idle-held GPUs are released after this (the daemon's `gpu.idle_release`).
    pub idle_release_ms: Millis,
    /// Ours: the subscription ratio placement keeps (subscribed replica GPUs ÷ host GPUs).
    pub subscription_ratio: f64,
    /// The paper's cap on its moving subscription ratio.
    pub paper_max_ratio: f64,
    /// Middle-ground and the paper: pre-warmed containers per host.
    pub prewarm_per_host: u32,
    /// Ours: the trailing window of the demand peak the autoscaler covers.
    pub peak_window_ms: Millis,
    /// Ours: whole hosts kept above that peak.
    pub spare_hosts: u32,
    /// How often the autoscaler runs.
    pub scaling_interval_ms: Millis,
    /// A fixed cluster when above 0: this many hosts up from the start, none requested or
    /// released later (no autoscaler), as a `notebookosd` cluster runs today.
    pub fixed_hosts: u32,
    /// The seed of everything random.
    pub seed: u64,
}

impl Default for Model {
    fn default() -> Self {
        Self {
            gpus_per_host: 8,
            provision_ms: 15_000,
            provision_jitter_ms: 2_000,
            container_start_ms: 5_000,
            state_load_ms: 2_000,
            election_ms: 2,
            idle_release_ms: 30_000,
            subscription_ratio: 21.0,
            paper_max_ratio: 7.0,
            prewarm_per_host: 3,
            peak_window_ms: 300_000,
            spare_hosts: 1,
            scaling_interval_ms: 30_000,
            fixed_hosts: 0,
            seed: 1,
        }
    }
}
