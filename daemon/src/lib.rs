//! `notebookosd`, the NotebookOS node daemon, and the `nbos` operator CLI.
//!
//! The layout follows the path of a cell (see `docs/design.md`): entry points and
//! [`node`] wiring at the top, then the [`gateway`], the lease server and GPU
//! control ([`lease`], [`gpu`]), down to pure modules such as [`config`].

pub mod cli;
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
pub mod sched;
pub mod sim;
pub mod status;
pub mod sys;
