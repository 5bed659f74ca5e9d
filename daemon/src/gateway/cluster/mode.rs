//! [`ClusterMode`]: what the gateway's handlers need in cluster mode, carried as a router
//! extension, and [`enable`], how a node turns it on.

use std::sync::Arc;
use std::time::Duration;

use axum::{Extension, Router};

use super::api_error::cluster_error;
use super::local_replicas::GatewayReplicas;
use crate::cluster::cells::frontend::{FrontendMetrics, Frontends};
use crate::cluster::cells::object_collector::Collector;
use crate::cluster::cells::replica_host::ReplicaHost;
use crate::cluster::control::records::KernelRecord;
use crate::cluster::Cluster;
use crate::gateway::error::ApiError;
use crate::gateway::state::AppState;

/// What the gateway needs in cluster mode.
pub struct ClusterMode {
    /// The meta store view and placement.
    pub cluster: Arc<Cluster>,
    /// This host's replicas of cluster kernels (the internal routes' side).
    pub replicas: Arc<ReplicaHost>,
    /// This host's front-ends of cluster kernels (the client side).
    pub frontends: Arc<Frontends>,
    /// How long `POST /api/kernels` waits for every replica to be ready.
    pub ready_timeout: Duration,
    /// The cluster's API token, for calls to other hosts.
    pub token: Option<String>,
    /// The large-object store's collector (its metrics are this host's).
    pub collector: Arc<Collector>,
}

/// The extension handlers look for.
pub type Mode = Extension<Arc<ClusterMode>>;

/// Puts the gateway in cluster mode (call on the router [`crate::gateway::router`] built).
pub fn with_cluster(router: Router, mode: Arc<ClusterMode>) -> Router {
    router.layer(Extension(mode))
}

/// How long `POST /api/kernels` waits for a new kernel's replicas by default.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Cluster mode for a node: front-ends over `cluster`'s meta group, `replicas` for the
/// internal routes' side, `token` for calls to other hosts. What `node/api.rs` calls.
pub fn enable(
    router: Router,
    state: Arc<AppState>,
    cluster: Arc<Cluster>,
    replicas: Arc<ReplicaHost>,
    collector: Arc<Collector>,
    token: Option<String>,
) -> Router {
    let frontends = Frontends::new(cluster.meta().clone(), Some(cluster.store().clone()), FrontendMetrics::default());
    frontends.set_local(cluster.node_id(), Arc::new(GatewayReplicas::new(state, replicas.clone())));
    frontends.set_cluster(cluster.clone());
    let mode = ClusterMode { cluster, replicas, frontends, ready_timeout: DEFAULT_READY_TIMEOUT, token, collector };
    with_cluster(router, Arc::new(mode))
}

impl ClusterMode {
    /// The record of kernel `id`; 404 when there is none (its front-end here closes).
    pub(super) async fn record(&self, id: &str) -> Result<KernelRecord, ApiError> {
        match self.cluster.kernel(id).await.map_err(cluster_error)? {
            Some(r) => Ok(r),
            None => {
                self.frontends.close(id);
                Err(ApiError::no_kernel(id))
            }
        }
    }
}
