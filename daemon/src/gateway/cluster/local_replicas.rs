//! This host's replicas, linked in-process to its own front-ends: the client connection
//! the internal channels WebSocket handler makes, without the socket (see
//! [`crate::cluster::cells::local_link`]).

use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::cluster::cells::local_link::{LocalLink, LocalReplicas, SendToReplica};
use crate::cluster::cells::replica_host::ReplicaHost;
use crate::gateway::state::AppState;

/// This host's replicas for its own front-ends: the client connection the
/// internal channels WebSocket handler makes, in-process.
pub struct GatewayReplicas {
    state: Arc<AppState>,
    replicas: Arc<ReplicaHost>,
}

impl GatewayReplicas {
    /// The replicas `replicas` hosts, as `state`'s gateway serves them.
    pub fn new(state: Arc<AppState>, replicas: Arc<ReplicaHost>) -> Self {
        Self { state, replicas }
    }
}

impl LocalReplicas for GatewayReplicas {
    fn connect(&self, kernel: &str) -> BoxFuture<'static, Option<LocalLink>> {
        let (state, replicas, id) = (self.state.clone(), self.replicas.clone(), kernel.to_owned());
        Box::pin(async move {
            let kernel = state.kernels.get(&id).await?;
            let (client, rx, _) = kernel.hub.connect();
            let to_kernel = kernel.clone();
            let send: SendToReplica = Box::new(move |channel, msg| {
                let (state, kernel, replicas) = (state.clone(), to_kernel.clone(), replicas.clone());
                Box::pin(async move {
                    crate::gateway::cell::forward(&state, &kernel, Some(&replicas), client, channel, msg).await
                })
            });
            let close = Box::new(move || kernel.hub.disconnect(client));
            Some(LocalLink { rx, send, close })
        })
    }
}
