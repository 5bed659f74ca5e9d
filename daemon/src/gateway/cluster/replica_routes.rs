//! `/api/v1/cluster/…` about this host's replicas: their roles and lag, a replica's
//! namespace digest, a kernel group's election records, and the namespace reset after a
//! restart of every replica. Outside cluster mode they are 404.

use std::time::{Duration, SystemTime};

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::mode::{ClusterMode, Mode};
use crate::gateway::calling::Calling;
use crate::gateway::error::ApiError;
use crate::gateway::state::AppState;
use crate::jupyter::message::iso_date;

/// `GET /api/v1/cluster/replicas`: the replicas of cluster kernels hosted here (role, lag);
/// a user's own only.
pub async fn replicas_route(mode: Option<Mode>, calling: Calling) -> Result<Response, ApiError> {
    let mode = mode.ok_or_else(not_in_cluster_mode)?;
    let mut replicas = mode.replicas.replicas().await;
    if !calling.caller.sees_every_kernel() {
        let records = mode.cluster.kernels().await.unwrap_or_default();
        replicas.retain(|r| records.iter().any(|k| k.id == r.kernel_id && calling.caller.may_see(k.owner.as_deref())));
    }
    Ok(Json(replicas).into_response())
}

/// `GET /api/v1/cluster/kernels/{id}/digest` (see [`digest`]): the caller's kernels only.
pub async fn digest_route(
    State(st): State<Arc<AppState>>,
    mode: Option<Mode>,
    calling: Calling,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let mode = mode.ok_or_else(not_in_cluster_mode)?;
    check_owner(&st, &mode, &calling, "digest", &id).await?;
    digest(&mode, &id).await
}

/// `GET /api/v1/cluster/kernels/{id}/elections` (see [`elections`]): the caller's kernels only.
pub async fn elections_route(
    State(st): State<Arc<AppState>>,
    mode: Option<Mode>,
    calling: Calling,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let mode = mode.ok_or_else(not_in_cluster_mode)?;
    check_owner(&st, &mode, &calling, "elections", &id).await?;
    elections(&mode, &id).await
}

/// Another user's kernel is an unknown one, as on `/api/kernels/{id}`.
async fn check_owner(
    st: &AppState,
    mode: &ClusterMode,
    calling: &Calling,
    action: &str,
    id: &str,
) -> Result<(), ApiError> {
    if calling.caller.sees_every_kernel() {
        return Ok(());
    }
    ApiError::check_kernel_id(id)?;
    let record = mode.record(id).await?;
    calling.may_see(st, action, id, record.owner.as_deref())
}

/// `POST /api/v1/cluster/kernels/{id}/reset-namespace` (see [`reset_namespace`]).
pub async fn reset_namespace_route(mode: Option<Mode>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let mode = mode.ok_or_else(not_in_cluster_mode)?;
    reset_namespace(&mode, &id).await
}

fn not_in_cluster_mode() -> ApiError {
    ApiError::not_found("this host is not in cluster mode ([cluster] enabled = false)")
}

/// `POST /api/v1/cluster/kernels/{id}/reset-namespace` (cluster-internal, after a restart of
/// every replica): this host, which must hold a replica, empties the kernel group's namespace.
pub async fn reset_namespace(mode: &ClusterMode, id: &str) -> Result<Response, ApiError> {
    ApiError::check_kernel_id(id)?;
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
    ApiError::check_kernel_id(id)?;
    let kernel = mode.replicas.kernels().get(id).await.ok_or_else(|| {
        ApiError::not_found(format!("no replica of kernel {} on this host", id.chars().take(64).collect::<String>()))
    })?;
    let replica = mode.replicas.replica(id).map(|r| r.replica);
    let digest = crate::cluster::cells::state_sync::namespace_digest(&kernel, Duration::from_secs(60))
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
    ApiError::check_kernel_id(id)?;
    let record = mode.record(id).await?;
    if !record.replicas.iter().any(|r| r.node_id == mode.cluster.node_id()) {
        return Err(ApiError::not_found(format!("this host holds no replica of kernel {id}")));
    }
    let kv = mode.replicas.store().kv(record.group);
    let rows = kv
        .range(crate::cluster::control::records::keys::ELECT.as_bytes(), 0)
        .await
        .map_err(|e| ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: format!("kernel group: {e}") })?;
    let mut cells = Vec::with_capacity(rows.len());
    for kv in rows {
        let cell = String::from_utf8_lossy(&kv.key[crate::cluster::control::records::keys::ELECT.len()..]).into_owned();
        let rec: crate::cluster::control::records::ElectionRecord =
            crate::cluster::control::records::decode(&kv.key, &kv.value)
                .map_err(|e| ApiError::internal(format!("{e:#}")))?;
        cells.push(serde_json::json!({ "cell": cell, "revision": kv.mod_revision, "record": rec }));
    }
    Ok(Json(serde_json::json!({ "kernel_id": id, "cells": cells })).into_response())
}
