//! Host side of the lease protocol between the CUDA shim (inside kernel processes)
//! and this daemon: the lease table ([`table`], pure), the peer check by
//! `SO_PEERCRED` ([`peer`]), the Unix socket server that drives both and calls GPU
//! control to evict and restore ([`server`]), and its metrics ([`metrics`]).

pub mod metrics;
pub mod peer;
pub mod server;
pub mod table;

pub use server::{ConnectionLimits, KernelProcess, LeaseServer, LeaseServerConfig, LeaseServerError, ProcessStatus};
pub use table::LeaseState;
