//! `notebookosd`, the NotebookOS node daemon.
//!
//! The layout follows the path of a cell (see `docs/design.md`): entry points and
//! [`node`] wiring at the top, then the [`gateway`], the lease server and GPU
//! control ([`lease`], [`gpu`]), down to pure modules such as [`config`]. The scheduler
//! core it drives is the `nbos-sched` crate (daemon/sched); the `nbos` CLI, its
//! benchmarks and the kernel proxy are crates of their own (daemon/cli, daemon/bench).

pub mod cluster;
pub mod config;
pub mod gateway;
pub mod gpu;
pub mod jupyter;
pub mod kernel;
pub mod lease;
pub mod link;
pub mod logging;
pub mod metrics;
pub mod node;
pub mod pki;
pub mod status;
pub mod sys;
pub mod users;
