//! `/api/kernels…` in cluster mode: through the meta store (create places the replicas
//! and waits for them), interrupt and restart on the replica hosts (their internal routes,
//! [`crate::link::peer_routes`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::api_error::cluster_error;
use super::mode::ClusterMode;
use crate::cluster::control::records::KernelRecord;
use crate::cluster::KernelSpec;
use crate::gateway::error::ApiError;
use crate::gateway::kernel_request::{settable_env, CreateKernel};
use crate::gateway::limits::KernelReservation;
use crate::link::peer_routes::{self, ReplicaCall};

impl ClusterMode {
    /// The gateway URLs of `record`'s live replica hosts, by node id.
    async fn replica_urls(&self, record: &KernelRecord) -> BTreeMap<u64, String> {
        let hosts = self.frontends.hosts().await;
        record
            .replicas
            .iter()
            .filter_map(|r| hosts.get(&r.node_id).map(|h| (r.node_id, h.gateway_url.clone())))
            .collect()
    }

    /// `POST` `call` on `url`'s replica of kernel `id` as this host: the internal route, or
    /// `?replica=local` on a host that predates it ([`peer_routes`]).
    async fn call_replica(&self, url: &str, id: &str, call: ReplicaCall) -> Result<(), String> {
        if peer_routes::speaks_internal(url) {
            match post_as_host(url, &call.internal_path(id)).await {
                Err(PostError::Status { code, marked, .. }) if peer_routes::predates_internal_routes(code, marked) => {
                    peer_routes::remember_legacy(url);
                }
                done => return done.map_err(|e| e.to_string()),
            }
        }
        post_as_host(url, &call.legacy_path(id)).await.map_err(|e| e.to_string())
    }
}

/// Why a call to another host failed.
#[derive(Debug, thiserror::Error)]
enum PostError {
    /// The host answered with an error status.
    #[error("{target}: HTTP {code}: {body}")]
    Status { target: String, code: u16, body: String, marked: bool },
    /// The host was not reached (or the call not made).
    #[error("{0}")]
    Unreached(String),
}

/// `POST {url}{path}` on another host (or this one) as this host.
async fn post_as_host(url: &str, path: &str) -> Result<(), PostError> {
    let target = format!("{}{path}", url.trim_end_matches('/'));
    tokio::task::spawn_blocking(move || {
        let agent = crate::link::host::agent(Duration::from_secs(120));
        let req = crate::link::host::authorize(agent.post(&target));
        match req.call() {
            Ok(_) => Ok(()),
            Err(ureq::Error::Status(code, r)) => {
                let marked = r.header(peer_routes::INTERNAL_MARKER).is_some();
                let body = r.into_string().unwrap_or_default().trim().to_owned();
                Err(PostError::Status { target, code, body, marked })
            }
            Err(e) => Err(PostError::Unreached(format!("{target}: {e}"))),
        }
    })
    .await
    .map_err(|e| PostError::Unreached(format!("{e}")))?
}

/// The cluster's kernel records (for the caps and quotas of `[limits]`).
pub async fn kernel_records(mode: &ClusterMode) -> Result<Vec<KernelRecord>, ApiError> {
    mode.cluster.kernels().await.map_err(cluster_error)
}

/// The record of kernel `id`, or the 404 of an unknown kernel (for the owner check).
pub async fn visible_record(mode: &ClusterMode, id: &str) -> Result<KernelRecord, ApiError> {
    mode.record(id).await
}

/// `POST /api/kernels` in cluster mode: place, then wait for every replica.
pub async fn create(
    mode: &ClusterMode,
    req: CreateKernel,
    gpus: Option<u32>,
    reservation: KernelReservation,
    owner: Option<crate::users::User>,
) -> Result<(String, Response), ApiError> {
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
    let env = settable_env(req.env).into_iter().collect();
    let (owner, owner_groups) = owner.map_or((None, Vec::new()), |u| (Some(u.name), u.groups));
    let spec = KernelSpec { id: None, name, gpus, env, owner, owner_groups };
    let record = mode.cluster.create_kernel(spec).await.map_err(cluster_error)?;
    // The record exists (until deleted, below or by the client): it counts from now on.
    reservation.created(&record.id);
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
    Ok((record.id.clone(), (StatusCode::CREATED, Json(mode.model(&record).await)).into_response()))
}

/// `GET /api/kernels` in cluster mode: the kernels `visible` keeps.
pub async fn list(mode: &ClusterMode, visible: &(dyn Fn(&KernelRecord) -> bool + Sync)) -> Result<Response, ApiError> {
    let records = mode.cluster.kernels().await.map_err(cluster_error)?;
    // Front-ends of kernels deleted through other hosts go now.
    mode.frontends.retain(&records.iter().map(|r| r.id.as_str()).collect());
    let mut out = Vec::with_capacity(records.len());
    for r in records.iter().filter(|r| visible(r)) {
        out.push(mode.model(r).await);
    }
    out.sort_by(|a, b| a.base.id.cmp(&b.base.id));
    Ok(Json(out).into_response())
}

/// `GET /api/kernels/{id}` in cluster mode.
pub async fn get(mode: &ClusterMode, id: &str) -> Result<Response, ApiError> {
    ApiError::check_kernel_id(id)?;
    let record = mode.record(id).await?;
    Ok(Json(mode.model(&record).await).into_response())
}

/// `DELETE /api/kernels/{id}` in cluster mode: the record goes, the replica hosts stop
/// their replicas (their supervisors watch `kernels/`).
pub async fn delete(mode: &ClusterMode, id: &str) -> Result<StatusCode, ApiError> {
    ApiError::check_kernel_id(id)?;
    if !mode.cluster.delete_kernel(id).await.map_err(cluster_error)? {
        return Err(ApiError::no_kernel(id));
    }
    mode.frontends.close(id);
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /api/kernels/{id}/interrupt` in cluster mode: SIGINT on the executing
/// replica's host (every replica host when no execution is known here).
pub async fn interrupt(mode: &ClusterMode, id: &str) -> Result<StatusCode, ApiError> {
    ApiError::check_kernel_id(id)?;
    let record = mode.record(id).await?;
    let urls = mode.replica_urls(&record).await;
    let executing = mode.frontends.get(id).and_then(|f| f.executing_node());
    let targets: Vec<&String> = match executing.and_then(|n| urls.get(&n)) {
        Some(u) => vec![u],
        None => urls.values().collect(),
    };
    let mut errors = Vec::new();
    for url in targets {
        if let Err(e) = mode.call_replica(url, id, ReplicaCall::Interrupt).await {
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
    ApiError::check_kernel_id(id)?;
    let record = mode.record(id).await?;
    let urls = mode.replica_urls(&record).await;
    let restarts = urls.values().map(|u| mode.call_replica(u, id, ReplicaCall::Restart));
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
            Some(url) => post_as_host(url, &format!("/api/v1/cluster/kernels/{id}/reset-namespace"))
                .await
                .map_err(|e| e.to_string()),
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
