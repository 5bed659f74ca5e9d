//! Host side of the lease protocol between the CUDA shim (inside kernel processes)
//! and this daemon: the lease table ([`table`], pure), whether a peer descends from a
//! registered kernel process ([`peer`]), the Unix socket server that drives both and calls GPU
//! control to evict and restore ([`server`]), and its metrics ([`metrics`]).

pub mod metrics;
pub mod peer;
pub mod server;
pub mod table;

pub use server::{
    ConnectionLimits, FencedGpu, LeaseServer, LeaseServerConfig, LeaseServerError, ProcessStatus, RegisteredProcess,
};

pub use table::LeaseState;
