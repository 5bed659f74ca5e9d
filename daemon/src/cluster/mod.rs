//! The cluster (issue 7): hosts in a meta raft group, kernels as three replicas on
//! three hosts with a raft group each, executor election and namespace sync.
//!
//! Two planes, in layer order (a lower one never uses a higher one):
//! - [`control`]: the control plane — what is stored where, the meta group's [`Cluster`]
//!   handle, membership, replica moves, autoscaling and the elastic metrics.
//! - [`cells`]: the cell path — front-ends, replica hosts and their supervisor, executor
//!   election, namespace sync and the large-object store. It reads the control plane's
//!   records and meta handle; the control plane knows nothing of it.
//! - [`http`]: `/api/v1/cluster/…`, over both planes (forwarding to the meta leader,
//!   `nbos cluster`, the object collector).
//!
//! Nothing here uses the gateway (the front-ends reach other hosts through [`crate::link`]).
//! The meta handle's main types are re-exported here: most of the crate knows the cluster by them.

pub mod cells;
pub mod control;
pub mod http;

pub use control::meta::{Cluster, ClusterError, ClusterSettings, ClusterStatus, KernelEvent, KernelSpec};
