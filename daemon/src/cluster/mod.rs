//! The cluster (issue 7): hosts in a meta raft group, kernels as three replicas on
//! three hosts with a raft group each, executor election and namespace sync.
//!
//! - [`records`]: what is stored where (shared by everything below).
//! - [`meta`]: the [`Cluster`] handle — hosts, loads, kernels, placement on the meta leader.
//! - [`membership`]: this host's heartbeat (host and load records on a lease), peer
//!   discovery, re-placement of replicas of hosts that stayed down; it starts the cluster.
//! - [`autoscale`]: the meta leader adds hosts through a provider and releases idle ones.
//! - [`moves`]: the meta leader's driver of replica moves (migration) to their end.
//! - [`http`]: `/api/v1/cluster/…`, for forwarding to the meta leader and `nbos cluster`.
//! - [`supervisor`]: starts and stops this host's replicas as the kernel records say.
//! - [`replica_host`], [`election`], [`state_sync`], [`objects`]: this host's replicas,
//!   their executor election and namespace sync, and the large-object store.
//! - [`frontend`]: this host's front-ends of kernels, for its clients; [`local_link`]
//!   links them in-process to this host's own replicas.
//!
//! Layering: [`meta`] knows nothing of [`membership`] or [`http`]; nothing here uses the
//! gateway (the front-ends reach other hosts through [`crate::link`]).

pub mod autoscale;
pub mod elastic_metrics;
pub mod election;
pub mod frontend;
pub mod http;
pub mod local_link;
pub mod membership;
pub mod meta;
pub mod moves;
pub mod objects;
pub mod records;
pub mod replica_host;
pub mod state_sync;
pub mod supervisor;
pub mod sync_metrics;

pub use meta::{Cluster, ClusterError, ClusterSettings, ClusterStatus, KernelEvent, KernelSpec};
