//! `nbos-sched`: the scheduler core, which cell gets which GPUs when, and the trace
//! simulator that drives it. Pure: no I/O, no clock (time comes in as [`Millis`]), no
//! randomness (the simulator's is seeded), so the daemon and the simulator drive the very
//! same code and every run is reproducible. The crate's dependencies keep it so: no
//! runtime, file system, network or clock crate.
//!
//! - [`host`]: one host's GPUs and who commits or idle-holds them ([`HostScheduler`]).
//! - [`template`]: the NotebookOS workload templates (sessions, training events, 60 s ticks).
//! - [`preselect`]: which replica of a kernel proposes to execute a cell (front-end, issue 7).
//! - [`placement`]: on which hosts of a cluster a kernel's replicas live.
//! - [`replay`]: drives a [`HostScheduler`] through a template in virtual time and measures it.
//! - [`migrate`]: which replica moves where when every replica yields a cell.
//! - [`scale`]: scale-out and scale-in targets (NotebookOS's rule and ours).
//! - [`autoscaler`]: the autoscaler's decision (rule, unmet demand, host bounds).
//! - [`policy`]: the `notebookos` policy's parameters; their default is the shipped one.
//! - [`drain`]: which hosts a scale-in releases.
//! - [`fairshare`]: which waiting cell gets contended GPUs next (users' recent GPU time).
//! - [`prewarm`]: how many pre-warmed containers to keep.
//! - [`sim`]: trace replay in virtual time under the scheduling policies (`nbos sim`).

pub mod autoscaler;
pub mod drain;
pub mod fairshare;
pub mod host;
pub mod migrate;
pub mod placement;
pub mod policy;
pub mod preselect;
pub mod prewarm;
#[cfg(test)]
pub(crate) mod prop;
pub mod replay;
pub mod scale;
pub mod sim;
pub mod template;

pub use host::{Action, HostScheduler, Refusal};

/// Virtual or real time in milliseconds, from any fixed origin.
pub type Millis = u64;

/// A kernel's id.
pub type KernelId = String;

/// A cell's id (the `execute_request` msg_id in the daemon).
pub type CellId = String;
