//! The cluster's cell path: a cell from this host's front-end of a kernel, through the
//! executor election, to the replica host that runs it and the namespace sync after it.
//! It reads the control plane's records and meta handle ([`super::control`]).
//!
//! - [`frontend`]: this host's front-ends of kernels, for its clients: each cell's
//!   election rounds; [`local_link`] links them in-process to this host's own replicas.
//! - [`replica_host`]: this host's replicas: election requests answered, won cells run.
//! - [`supervisor`]: starts and stops this host's replicas as the kernel records say.
//! - [`election`]: the executor election's swaps in a kernel's raft group.
//! - [`state_sync`], [`sync_metrics`]: namespace sync between replicas, and its metrics.
//! - [`objects`]: the large-object store (namespace values too large for the log);
//!   [`object_collector`]: the meta leader's garbage collector of it.

pub mod election;
pub mod frontend;
pub mod local_link;
pub mod object_collector;
pub mod objects;
pub mod replica_host;
pub mod state_sync;
pub mod supervisor;
pub mod sync_metrics;
