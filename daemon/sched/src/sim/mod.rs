//! Trace replay in virtual time (`nbos sim`): a workload of notebook sessions replayed
//! under a scheduling policy on a model of a GPU cluster, driving the daemon's own
//! scheduler core (this crate's root modules): per-host GPU binding ([`crate::host`]),
//! placement, executor pre-selection, migration choice, scaling, drain and pre-warm.
//!
//! - [`workload`]: sessions and trainings; the Sensei CSV reader; templates.
//! - [`sessions`]: the session generator for a trace without sessions (calibrated on a template).
//! - [`synthetic`]: a synthetic workload generator.
//! - [`users`]: sessions' owners (Zipf over `--users`) and the flood (`--flood-user`).
//! - [`events`], [`engine`]: the discrete-event loop (virtual ms, deterministic ties);
//!   [`ctx`]: what policies see and act through.
//! - [`cluster`]: hosts, provisioning, the independent GPU ledger, GPU-hour integrals.
//! - [`costs`]: replica starts and state transfers as measured (`docs/sim/costs.json`);
//!   [`namespace`]: the sessions' namespace sizes (an assumption).
//! - [`policy`]: one file per scheduling policy.
//! - [`metrics`]: what a run measured; [`fairness`]: per-user delays and Jain's index; [`report`]: table, JSON, markdown; [`svg`]: plots;
//!   [`spread`]: intervals across seeds, spread across windows; [`stats`]: percentiles.
//!
//! Uses the scheduler core and nothing above it; no I/O (the CLI reads and writes files).

pub mod cluster;
pub mod costs;
pub mod ctx;
pub mod engine;
pub mod events;
pub mod fairness;
pub mod front;
pub mod metrics;
pub mod namespace;
pub mod policy;
pub mod report;
pub mod rng;
pub mod sessions;
pub mod spread;
pub mod stats;
pub mod svg;
pub mod synthetic;
pub mod users;
pub mod workload;

pub use engine::{run, SimError};
pub use metrics::PolicyResult;
pub use workload::Workload;

use crate::policy::PolicyConfig;
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
    /// Replica and container starts, state transfers and the cap on concurrent moves,
    /// as measured ([`costs::Costs`]; `docs/sim/costs.json` unless `--costs` says otherwise).
    pub costs: costs::Costs,
    /// Executor election (replicated policies): one quorum-fsynced CAS.
    pub election_ms: Millis,
    /// The paper's cap on its moving subscription ratio.
    pub paper_max_ratio: f64,
    /// Middle-ground and the paper: pre-warmed containers per host.
    pub prewarm_per_host: u32,
    /// How often the other autoscaling policies' autoscaler runs (`notebookos`:
    /// `notebookos.autoscale.interval_ms`).
    pub scaling_interval_ms: Millis,
    /// `notebookos`: the daemon's policy parameters (`nbos sim --config`, else the shipped
    /// defaults). Its autoscaler runs whatever `[autoscale] provider` says: a simulated
    /// cluster always has a provider (`fixed_hosts` models one without).
    pub notebookos: PolicyConfig,
    /// A fixed cluster when above 0: this many hosts up from the start, none requested or
    /// released later (no autoscaler), as a `notebookosd` cluster runs today.
    pub fixed_hosts: u32,
    /// Host memory replicas (or containers) may use on a host, MiB; 0: not modelled.
    /// The default host shape is an 8-GPU host with 1 TiB of RAM for kernels (an
    /// 8 x A100 p4d.24xlarge has 1,152 GiB; the rest is left to the OS and the daemon).
    pub host_memory_mib: u64,
    /// Host memory of one idle replica before its namespace, MiB: an ipykernel with the
    /// user's imports. An assumption: `import ipykernel, numpy` measures 47 MiB RSS, one
    /// with PyTorch imported several hundred; the trace's notebooks train models.
    pub replica_base_mib: u64,
    /// The seed of everything random.
    pub seed: u64,
}

impl Model {
    /// Hosts every policy keeps from the start and never releases below: the autoscaler's
    /// `min_hosts` (one option for all policies, so that none wins by keeping fewer).
    pub fn min_hosts(&self) -> u32 {
        self.notebookos.autoscale.min_hosts
    }
}

impl Default for Model {
    fn default() -> Self {
        Self {
            gpus_per_host: 8,
            provision_ms: 15_000,
            provision_jitter_ms: 2_000,
            costs: costs::Costs::measured(),
            election_ms: 2,
            paper_max_ratio: 7.0,
            prewarm_per_host: 3,
            scaling_interval_ms: 30_000,
            fixed_hosts: 0,
            host_memory_mib: 1 << 20,
            replica_base_mib: 512,
            notebookos: PolicyConfig::default(),
            seed: 1,
        }
    }
}
