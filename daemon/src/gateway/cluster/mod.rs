//! The gateway in cluster mode (issue 7): every host serves every kernel of the
//! cluster. `/api/kernels…` go through the meta store; a client's channels go to this
//! host's [`FrontendKernel`], which elects a replica per cell. The internal routes
//! ([`crate::gateway::internal_router`]) are the cluster-internal way to reach *this
//! host's* replica (front-ends of other hosts use them, with their node certificate).
//!
//! Cluster mode is on when the router carries a [`ClusterMode`] extension
//! ([`with_cluster`]); without it every handler keeps its single-host behaviour.
//!
//! - [`mode`]: the extension and how a node turns cluster mode on.
//! - [`local_replicas`]: this host's replicas linked in-process to its own front-ends.
//! - [`model`]: the cluster kernel model (`GET /api/kernels…`).
//! - [`kernels`]: `/api/kernels…` through the meta store.
//! - [`replica_routes`]: `/api/v1/cluster/…` about this host's replicas.
//! - [`api_error`]: cluster failures as client answers.
//!
//! [`FrontendKernel`]: crate::cluster::cells::frontend::FrontendKernel

pub mod api_error;
pub mod kernels;
pub mod local_replicas;
pub mod mode;
pub mod model;
pub mod replica_routes;

pub use kernels::{create, delete, get, interrupt, kernel_records, list, restart, visible_record};
pub use mode::{enable, with_cluster, ClusterMode, Mode, DEFAULT_READY_TIMEOUT};
pub use model::{ClusterKernelModel, ReplicaModel};
