//! The cluster's control plane: which hosts there are, which kernels and replicas live
//! where, and the meta leader's decisions about them. It knows nothing of cells.
//!
//! - [`records`]: what is stored where (shared by everything in the cluster).
//! - [`meta`]: the [`meta::Cluster`] handle — hosts, loads, kernels, placement on the meta leader.
//! - [`membership`]: this host's heartbeat (host and load records on a lease), peer
//!   discovery, re-placement of replicas of hosts that stayed down; it starts the cluster.
//! - [`autoscale`]: the meta leader adds hosts through a provider and releases idle ones.
//! - [`moves`]: the meta leader's driver of replica moves (migration) to their end.
//! - [`elastic_metrics`]: the metrics of moves and autoscaling.
//!
//! Layering: [`meta`] knows nothing of [`membership`].

pub mod autoscale;
pub mod elastic_metrics;
pub mod membership;
pub mod meta;
pub mod moves;
pub mod records;
