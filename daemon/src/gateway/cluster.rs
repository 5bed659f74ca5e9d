//! The gateway in cluster mode (issue 7): every host serves every kernel of the
//! cluster. `/api/kernels…` go through the meta store; a client's channels go to this
//! host's [`FrontendKernel`], which elects a replica per cell. `?replica=local` on
//! the channels, interrupt and restart routes is the cluster-internal way to reach
//! *this host's* replica (front-ends of other hosts use it; it needs the token).
//!
//! Cluster mode is on when the router carries a [`ClusterMode`] extension
//! ([`with_cluster`]); without it every handler keeps its single-host behaviour.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json, Router};
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::error::ApiError;
use super::kernels::CreateKernel;
use super::AppState;
use crate::cluster::frontend::{ExecutionInfo, FrontendMetrics, Frontends};
use crate::cluster::local_link::{LocalLink, LocalReplicas, SendToReplica};
use crate::cluster::records::KernelRecord;
use crate::cluster::replica_host::ReplicaHost;
use crate::cluster::{Cluster, ClusterError, KernelSpec};
use crate::jupyter::message::iso_date;
use crate::kernel::KernelModel;

/// What the gateway needs in cluster mode.
pub struct ClusterMode {
    /// The meta store view and placement.
    pub cluster: Arc<Cluster>,
    /// This host's replicas of cluster kernels (the `?replica=local` side).
    pub replicas: Arc<ReplicaHost>,
    /// This host's front-ends of cluster kernels (the client side).
    pub frontends: Arc<Frontends>,
    /// How long `POST /api/kernels` waits for every replica to be ready.
    pub ready_timeout: Duration,
    /// The cluster's API token, for calls to other hosts.
    pub token: Option<String>,
}

/// The extension handlers look for.
pub type Mode = Extension<Arc<ClusterMode>>;

/// Puts the gateway in cluster mode (call on the router [`super::router`] built).
pub fn with_cluster(router: Router, mode: Arc<ClusterMode>) -> Router {
    router.layer(Extension(mode))
}

/// How long `POST /api/kernels` waits for a new kernel's replicas by default.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Cluster mode for a node: front-ends over `cluster`'s meta group, `replicas` for the
/// `?replica=local` side, `token` for calls to other hosts. What `node.rs` calls.
pub fn enable(
    router: Router,
    state: Arc<AppState>,
    cluster: Arc<Cluster>,
    replicas: Arc<ReplicaHost>,
    token: Option<String>,
) -> Router {
    let frontends = Frontends::new(
        cluster.meta().clone(),
        Some(cluster.store().clone()),
        token.clone(),
        FrontendMetrics::default(),
    );
    frontends.set_local(cluster.node_id(), Arc::new(GatewayReplicas { state, replicas: replicas.clone() }));
    let mode = ClusterMode { cluster, replicas, frontends, ready_timeout: DEFAULT_READY_TIMEOUT, token };
    with_cluster(router, Arc::new(mode))
}

/// This host's replicas for its own front-ends: the client connection the
/// `?replica=local` WebSocket handler makes, in-process.
struct GatewayReplicas {
    state: Arc<AppState>,
    replicas: Arc<ReplicaHost>,
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
                Box::pin(
                    async move { super::cell::forward(&state, &kernel, Some(&replicas), client, channel, msg).await },
                )
            });
            let close = Box::new(move || kernel.hub.disconnect(client));
            Some(LocalLink { rx, send, close })
        })
    }
}

/// True when the request's query says `replica=local`.
pub fn wants_local_replica(query: Option<&str>) -> bool {
    query.is_some_and(|q| q.split('&').any(|kv| kv == "replica=local"))
}

/// One replica in the cluster kernel model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaModel {
    /// Replica number.
    pub replica: u32,
    /// Host (raft node id).
    pub node_id: u64,
    /// Host name (empty while the host is down).
    pub host: String,
    /// `executor` for the replica that ran the last cell seen here, else `standby`.
    pub role: String,
    /// Its host is up (has a `hosts/` record).
    pub live: bool,
    /// Its replica is caught up and serving (`ready/` mark).
    pub ready: bool,
}

/// The Kernel Gateway model plus where the replicas are and who executes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterKernelModel {
    /// The standard model.
    #[serde(flatten)]
    pub base: KernelModel,
    /// The replicas.
    pub replicas: Vec<ReplicaModel>,
    /// Execution as this host's front-end sees it (absent when no client used it here).
    #[serde(default)]
    pub execution: Option<ExecutionInfo>,
}

/// Why a store failure is the cluster being unavailable for now (503) rather than a fault,
/// in words for the client: whether anything may have changed, and what to do.
fn store_unavailable(e: &raft_store::Error) -> Option<&'static str> {
    use raft_store::Error as E;
    match e {
        E::NotLeader { .. } => Some("no leader of the meta group is known right now; nothing was changed, retry"),
        E::LeaderUnreachable { .. } => Some("the meta group's leader cannot be reached; nothing was changed, retry"),
        E::Overloaded => Some("the raft store is overloaded; nothing was changed, retry later"),
        E::Stopped => Some("this host's raft store is shutting down; use another host"),
        e if e.outcome_unknown() => Some(
            "the outcome is unknown (timeout or leader change): the change may or may not have been applied; \
             check before retrying",
        ),
        _ => None,
    }
}

fn cluster_error(e: ClusterError) -> ApiError {
    if let ClusterError::Store(store) = &e {
        if let Some(reason) = store_unavailable(store) {
            return ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: format!("{reason} ({e})") };
        }
    }
    let status = match &e {
        ClusterError::NotReady(_) | ClusterError::NotLeader { .. } => StatusCode::SERVICE_UNAVAILABLE,
        ClusterError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
        // No room for the replicas within the subscription ratio (the meta leader's
        // answer when forwarded is the same 409).
        ClusterError::Placement(_) | ClusterError::Conflict(_) => StatusCode::CONFLICT,
        ClusterError::NoSuchKernel(_) => StatusCode::NOT_FOUND,
        ClusterError::BadRequest(_) => StatusCode::BAD_REQUEST,
        ClusterError::Remote { status, .. } => StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_GATEWAY),
    };
    ApiError { status, message: e.to_string() }
}

impl ClusterMode {
    /// The model of `record`.
    pub async fn model(&self, record: &KernelRecord) -> ClusterKernelModel {
        let hosts: HashMap<u64, String> = self.frontends.hosts().await.into_iter().map(|(n, h)| (n, h.name)).collect();
        let ready = self.cluster.ready_hosts(&record.id).await.unwrap_or_default();
        let front = self.frontends.get(&record.id);
        let execution = front.as_ref().map(|f| f.execution());
        let executor = self.frontends.last_executor(record).await.map(|(replica, _)| replica);
        let replicas = record
            .replicas
            .iter()
            .map(|r| ReplicaModel {
                replica: r.replica,
                node_id: r.node_id,
                host: hosts.get(&r.node_id).cloned().unwrap_or_default(),
                role: if executor == Some(r.replica) { "executor" } else { "standby" }.to_owned(),
                live: hosts.contains_key(&r.node_id),
                ready: ready.contains(&r.node_id),
            })
            .collect::<Vec<_>>();
        let all_ready = replicas.iter().all(|r| r.ready);
        let (state, activity, connections) = match &front {
            Some(f) => {
                let a = f.hub.activity();
                (a.execution_state, a.last_activity, a.connections)
            }
            None => (
                if all_ready { "idle" } else { "starting" }.to_owned(),
                UNIX_EPOCH + Duration::from_millis(record.created_ms),
                0,
            ),
        };
        let pids = self.replicas.kernels().get(&record.id).await.map(|k| k.pids()).unwrap_or_default();
        ClusterKernelModel {
            base: KernelModel {
                id: record.id.clone(),
                name: record.name.clone(),
                last_activity: iso_date(activity),
                execution_state: state,
                connections,
                gpus: record.gpus,
                pids,
            },
            replicas,
            execution,
        }
    }

    async fn record(&self, id: &str) -> Result<KernelRecord, ApiError> {
        match self.cluster.kernel(id).await.map_err(cluster_error)? {
            Some(r) => Ok(r),
            None => {
                self.frontends.close(id);
                Err(ApiError::no_kernel(id))
            }
        }
    }

    /// The gateway URLs of `record`'s live replica hosts, by node id.
    async fn replica_urls(&self, record: &KernelRecord) -> BTreeMap<u64, String> {
        let hosts = self.frontends.hosts().await;
        record
            .replicas
            .iter()
            .filter_map(|r| hosts.get(&r.node_id).map(|h| (r.node_id, h.gateway_url.clone())))
            .collect()
    }

    /// `POST {url}{path}?replica=local` on another host (or this one) with the token.
    async fn post_local(&self, url: &str, path: &str) -> Result<(), String> {
        let target = format!("{}{path}?replica=local", url.trim_end_matches('/'));
        let token = self.token.clone();
        tokio::task::spawn_blocking(move || {
            let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(120)).build();
            let mut req = agent.post(&target);
            if let Some(t) = token {
                req = req.set("Authorization", &format!("token {t}"));
            }
            match req.call() {
                Ok(_) => Ok(()),
                Err(ureq::Error::Status(code, r)) => {
                    Err(format!("{target}: HTTP {code}: {}", r.into_string().unwrap_or_default().trim()))
                }
                Err(e) => Err(format!("{target}: {e}")),
            }
        })
        .await
        .map_err(|e| format!("{e}"))?
    }
}

/// `POST /api/kernels` in cluster mode: place, then wait for every replica.
pub async fn create(mode: &ClusterMode, req: CreateKernel, gpus: Option<u32>) -> Result<Response, ApiError> {
    let name = req.name.unwrap_or_else(|| crate::kernel::spec::DEFAULT_SPEC.to_owned());
    let spec_gpus = crate::kernel::spec::gpus_of(&name)
        .ok_or_else(|| ApiError::not_found(format!("no such kernelspec: {name}")))?;
    let gpus = gpus.unwrap_or(spec_gpus);
    if gpus > crate::kernel::registry::MAX_GPUS_PER_KERNEL {
        return Err(ApiError::bad_request(format!(
            "invalid GPU request: {gpus} > {}",
            crate::kernel::registry::MAX_GPUS_PER_KERNEL
        )));
    }
    let env = req.env.into_iter().filter(|(k, _)| super::kernels::allowed_env(k)).collect();
    let record = mode.cluster.create_kernel(KernelSpec { id: None, name, gpus, env }).await.map_err(cluster_error)?;
    let deadline = Instant::now() + mode.ready_timeout;
    let wanted: Vec<u64> = record.replicas.iter().map(|r| r.node_id).collect();
    loop {
        let ready = mode.cluster.ready_hosts(&record.id).await.unwrap_or_default();
        let missing: Vec<u64> = wanted.iter().copied().filter(|n| !ready.contains(n)).collect();
        if missing.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            let hosts = mode.frontends.hosts().await;
            let names: Vec<String> = missing
                .iter()
                .map(|n| hosts.get(n).map_or_else(|| format!("node {n} (down)"), |h| format!("{} (node {n})", h.name)))
                .collect();
            tracing::warn!(kernel = %record.id, missing = ?missing, "replicas did not come up; deleting the kernel");
            if let Err(e) = mode.cluster.delete_kernel(&record.id).await {
                tracing::warn!(kernel = %record.id, error = %e, "could not delete the kernel that did not come up");
            }
            return Err(ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message: format!(
                    "kernel {}: the replicas on {} did not come up within {:?}",
                    record.id,
                    names.join(", "),
                    mode.ready_timeout
                ),
            });
        }
        // Readiness marks are committed facts: poll the local meta state briefly.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tracing::info!(kernel = %record.id, hosts = ?wanted, "cluster kernel ready");
    Ok((StatusCode::CREATED, Json(mode.model(&record).await)).into_response())
}

/// `GET /api/kernels` in cluster mode.
pub async fn list(mode: &ClusterMode) -> Result<Response, ApiError> {
    let records = mode.cluster.kernels().await.map_err(cluster_error)?;
    // Front-ends of kernels deleted through other hosts go now.
    mode.frontends.retain(&records.iter().map(|r| r.id.as_str()).collect());
    let mut out = Vec::with_capacity(records.len());
    for r in &records {
        out.push(mode.model(r).await);
    }
    out.sort_by(|a, b| a.base.id.cmp(&b.base.id));
    Ok(Json(out).into_response())
}

/// `GET /api/kernels/{id}` in cluster mode.
pub async fn get(mode: &ClusterMode, id: &str) -> Result<Response, ApiError> {
    let record = mode.record(id).await?;
    Ok(Json(mode.model(&record).await).into_response())
}

/// `DELETE /api/kernels/{id}` in cluster mode: the record goes, the replica hosts stop
/// their replicas (their supervisors watch `kernels/`).
pub async fn delete(mode: &ClusterMode, id: &str) -> Result<StatusCode, ApiError> {
    if !mode.cluster.delete_kernel(id).await.map_err(cluster_error)? {
        return Err(ApiError::no_kernel(id));
    }
    mode.frontends.close(id);
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /api/kernels/{id}/interrupt` in cluster mode: SIGINT on the executing
/// replica's host (every replica host when no execution is known here).
pub async fn interrupt(mode: &ClusterMode, id: &str) -> Result<StatusCode, ApiError> {
    let record = mode.record(id).await?;
    let urls = mode.replica_urls(&record).await;
    let executing = mode.frontends.get(id).and_then(|f| f.executing_node());
    let targets: Vec<&String> = match executing.and_then(|n| urls.get(&n)) {
        Some(u) => vec![u],
        None => urls.values().collect(),
    };
    let path = format!("/api/kernels/{id}/interrupt");
    let mut errors = Vec::new();
    for url in targets {
        if let Err(e) = mode.post_local(url, &path).await {
            errors.push(e);
        }
    }
    if errors.is_empty() {
        Ok(StatusCode::NO_CONTENT)
    } else if executing.is_none() {
        // No cell runs: there was nothing to interrupt on a replica that is away (its host
        // down, or the replica being re-created), so that is not the client's failure.
        tracing::debug!(kernel = %id, errors = %errors.join("; "), "idle kernel: interrupt skipped unreachable replicas");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError { status: StatusCode::BAD_GATEWAY, message: format!("interrupt failed: {}", errors.join("; ")) })
    }
}

/// `POST /api/kernels/{id}/restart` in cluster mode: every replica restarts.
pub async fn restart(mode: &ClusterMode, id: &str) -> Result<Response, ApiError> {
    let record = mode.record(id).await?;
    let urls = mode.replica_urls(&record).await;
    let path = format!("/api/kernels/{id}/restart");
    let restarts = urls.values().map(|u| mode.post_local(u, &path));
    let errors: Vec<String> =
        futures_util::future::join_all(restarts).await.into_iter().filter_map(Result::err).collect();
    if !errors.is_empty() {
        return Err(ApiError {
            status: StatusCode::BAD_GATEWAY,
            message: format!("restart failed: {}", errors.join("; ")),
        });
    }
    // Every replica runs a fresh interpreter: the group forgets the old namespace, once, so a
    // replica that catches up later does not bring pre-restart names back.
    let me = mode.cluster.node_id();
    let reset = if urls.contains_key(&me) {
        mode.replicas.reset_namespace(id).await.map(drop).map_err(|e| format!("{e:#}"))
    } else {
        match urls.values().next() {
            Some(url) => mode.post_local(url, &format!("/api/v1/cluster/kernels/{id}/reset-namespace")).await,
            None => Err("no replica host is up".to_owned()),
        }
    };
    if let Err(e) = reset {
        return Err(ApiError {
            status: StatusCode::BAD_GATEWAY,
            message: format!("every replica restarted, but the kernel group's namespace was not reset: {e}"),
        });
    }
    Ok(Json(mode.model(&record).await).into_response())
}

/// `POST /api/v1/cluster/kernels/{id}/reset-namespace` (cluster-internal, after a restart of
/// every replica): this host, which must hold a replica, empties the kernel group's namespace.
pub async fn reset_namespace(mode: &ClusterMode, id: &str) -> Result<Response, ApiError> {
    if mode.replicas.replica(id).is_none() {
        return Err(ApiError::not_found(format!(
            "no replica of kernel {} on this host",
            id.chars().take(64).collect::<String>()
        )));
    }
    let revision = mode.replicas.reset_namespace(id).await.map_err(|e| ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message: format!("resetting the namespace of kernel {id}: {e:#}"),
    })?;
    Ok(Json(serde_json::json!({ "kernel_id": id, "revision": revision })).into_response())
}

/// `GET /api/v1/cluster/kernels/{id}/digest`: the namespace digest of this host's
/// replica of the kernel (equal on every replica after every completed cell).
pub async fn digest(mode: &ClusterMode, id: &str) -> Result<Response, ApiError> {
    let kernel = mode.replicas.kernels().get(id).await.ok_or_else(|| {
        ApiError::not_found(format!("no replica of kernel {} on this host", id.chars().take(64).collect::<String>()))
    })?;
    let replica = mode.replicas.replica(id).map(|r| r.replica);
    let digest = crate::cluster::state_sync::namespace_digest(&kernel, Duration::from_secs(60))
        .await
        .map_err(|e| ApiError::internal(format!("digest of kernel {id}: {e:#}")))?;
    Ok(Json(serde_json::json!({
        "kernel_id": id,
        "node_id": mode.cluster.node_id(),
        "replica": replica,
        "digest": digest,
        "at": iso_date(SystemTime::now()),
    }))
    .into_response())
}

/// `GET /api/v1/cluster/kernels/{id}/elections`: every cell's election record in the
/// kernel's group (read on this host, which must hold a replica): exactly one winner per cell.
pub async fn elections(mode: &ClusterMode, id: &str) -> Result<Response, ApiError> {
    let record = mode.record(id).await?;
    if !record.replicas.iter().any(|r| r.node_id == mode.cluster.node_id()) {
        return Err(ApiError::not_found(format!("this host holds no replica of kernel {id}")));
    }
    let kv = mode.replicas.store().kv(record.group);
    let rows = kv
        .range(crate::cluster::records::keys::ELECT.as_bytes(), 0)
        .await
        .map_err(|e| ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: format!("kernel group: {e}") })?;
    let mut cells = Vec::with_capacity(rows.len());
    for kv in rows {
        let cell = String::from_utf8_lossy(&kv.key[crate::cluster::records::keys::ELECT.len()..]).into_owned();
        let rec: crate::cluster::records::ElectionRecord =
            crate::cluster::records::decode(&kv.key, &kv.value).map_err(|e| ApiError::internal(format!("{e:#}")))?;
        cells.push(serde_json::json!({ "cell": cell, "revision": kv.mod_revision, "record": rec }));
    }
    Ok(Json(serde_json::json!({ "kernel_id": id, "cells": cells })).into_response())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn store(e: raft_store::Error) -> ApiError {
        cluster_error(ClusterError::Store(e))
    }

    #[test]
    fn store_unavailability_is_503_with_the_reason() {
        let not_proposed = [
            raft_store::Error::NotLeader { group: 1, hint: None },
            raft_store::Error::LeaderUnreachable { group: 1, leader: 2, after: Duration::from_secs(5) },
            raft_store::Error::Overloaded,
        ];
        for e in not_proposed {
            let shown = e.to_string();
            let got = store(e);
            assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE, "{shown}");
            assert!(got.message.contains("nothing was changed"), "{}", got.message);
            assert!(got.message.contains(&shown), "the store's own words are kept: {}", got.message);
        }
        let unknown = [
            raft_store::Error::Timeout { group: 1, after: Duration::from_secs(5) },
            raft_store::Error::LeadershipLost { group: 1 },
            raft_store::Error::ForwardLost { group: 1, leader: 2, reason: "connection closed" },
        ];
        for e in unknown {
            assert!(e.outcome_unknown());
            let got = store(e);
            assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
            assert!(got.message.contains("may or may not have been applied"), "{}", got.message);
        }
        assert_eq!(store(raft_store::Error::Stopped).status, StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn other_failures_keep_their_status() {
        assert_eq!(store(raft_store::Error::Corrupt("bad".into())).status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(cluster_error(ClusterError::NoSuchKernel("k".into())).status, StatusCode::NOT_FOUND);
        assert_eq!(cluster_error(ClusterError::BadRequest("b".into())).status, StatusCode::BAD_REQUEST);
        let not_ready = cluster_error(ClusterError::NotReady("no quorum".into()));
        assert_eq!(not_ready.status, StatusCode::SERVICE_UNAVAILABLE);
    }
}
