//! `/api/kernels…`: create, list, get, delete, interrupt, restart. In cluster mode
//! (see [`super::cluster`]) they go through the meta store. Without cluster mode they act
//! on this host's kernels, which is also what the internal routes on a replica do
//! ([`super::internal_router`]).

use std::collections::HashSet;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::cluster;
use super::error::ApiError;
use super::kernel_request::{settable_env, CreateKernel};
use super::limits::USERS_CREDENTIAL;
use super::state::AppState;
use crate::kernel::registry::{parse_gpu_memory_mib, CreateError, GPU_MEMORY_ENV};

/// `POST /api/kernels`.
pub async fn create(
    State(st): State<Arc<AppState>>,
    mode: Option<cluster::Mode>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let mut req: CreateKernel = if body.iter().all(u8::is_ascii_whitespace) {
        CreateKernel::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(format!("invalid kernel request: {e}")))?
    };
    let gpus = match (req.gpus, req.env.get("KERNEL_GPUS")) {
        (Some(g), _) => Some(g),
        (None, Some(s)) => Some(
            s.trim().parse().map_err(|_| ApiError::bad_request(format!("KERNEL_GPUS must be a number, got {s:?}")))?,
        ),
        (None, None) => None,
    };
    // Checked here so that cluster mode refuses it before recording the kernel; the
    // limit travels to every replica as this KERNEL_* variable.
    if let Some(mib) = req.gpu_memory_mib {
        req.env.insert(GPU_MEMORY_ENV.to_owned(), mib.to_string());
    }
    if let Some(v) = req.env.get(GPU_MEMORY_ENV) {
        parse_gpu_memory_mib(v).map_err(ApiError::bad_request)?;
    }
    // The caps count what exists now: the cluster's kernel records, or this host's kernels.
    let live: HashSet<String> = match &mode {
        Some(mode) => cluster::kernel_ids(mode).await?,
        None => st.kernels.list().await.into_iter().map(|k| k.id).collect(),
    };
    // The kernel's owner: the authenticated user once there are users (`None` until then).
    let owner: Option<&str> = None;
    // kernel.run_as = "owner": refused here, before a cluster kernel is recorded, with
    // the reason (no owner, no such account, root's).
    st.kernels.check_owner(owner).map_err(create_error)?;
    let reservation = st.limits.reserve_kernel(USERS_CREDENTIAL, &live)?;
    if let Some(mode) = mode {
        return cluster::create(&mode, req, gpus, reservation).await;
    }
    let env = settable_env(req.env);
    match st.kernels.create(req.name.as_deref(), gpus, &env, owner).await {
        Ok(k) => {
            reservation.created(&k.id);
            Ok((StatusCode::CREATED, Json(k.model().await)).into_response())
        }
        Err(e) => Err(create_error(e)),
    }
}

/// The API's answer to a kernel that could not be created.
fn create_error(e: CreateError) -> ApiError {
    match e {
        e @ CreateError::UnknownSpec(_) => ApiError::not_found(e.to_string()),
        e @ CreateError::BadGpuRequest(_) => ApiError::bad_request(e.to_string()),
        e @ CreateError::Refused(_) => ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: e.to_string() },
        // Not reachable here (the id is a fresh UUID), but a kernel id refused is a 400.
        e @ CreateError::BadKernelId(_) => ApiError::bad_request(e.to_string()),
        // kernel.run_as = "owner": this user may not have a kernel here as configured.
        e @ CreateError::Owner(_) => {
            tracing::warn!(error = %e, "kernel refused: it cannot run as its owner");
            ApiError { status: StatusCode::FORBIDDEN, message: e.to_string() }
        }
        e @ CreateError::Start(_) => {
            tracing::error!(error = %e, "kernel start failed");
            ApiError::internal(e.to_string())
        }
    }
}

/// `GET /api/kernels`.
pub async fn list(State(st): State<Arc<AppState>>, mode: Option<cluster::Mode>) -> Result<Response, ApiError> {
    match mode {
        Some(mode) => cluster::list(&mode).await,
        _ => Ok(Json(st.kernels.list().await).into_response()),
    }
}

/// `GET /api/kernels/{id}`.
pub async fn get(
    State(st): State<Arc<AppState>>,
    mode: Option<cluster::Mode>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    ApiError::check_kernel_id(&id)?;
    if let Some(mode) = mode {
        return cluster::get(&mode, &id).await;
    }
    let k = st.kernels.get(&id).await.ok_or_else(|| ApiError::no_kernel(&id))?;
    Ok(Json(k.model().await).into_response())
}

/// `DELETE /api/kernels/{id}`.
pub async fn delete(
    State(st): State<Arc<AppState>>,
    mode: Option<cluster::Mode>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    ApiError::check_kernel_id(&id)?;
    // A cluster replica is stopped by its host's supervisor when the record goes, never directly.
    if let Some(mode) = mode {
        return cluster::delete(&mode, &id).await;
    }
    if st.kernels.remove(&id).await {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::no_kernel(&id))
    }
}

/// `POST /api/kernels/{id}/interrupt`.
pub async fn interrupt(
    State(st): State<Arc<AppState>>,
    mode: Option<cluster::Mode>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    ApiError::check_kernel_id(&id)?;
    if let Some(mode) = mode {
        return cluster::interrupt(&mode, &id).await;
    }
    let k = st.kernels.get(&id).await.ok_or_else(|| ApiError::no_kernel(&id))?;
    k.interrupt().await.map_err(|e| ApiError::internal(format!("{e:#}")))?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /api/kernels/{id}/restart`.
pub async fn restart(
    State(st): State<Arc<AppState>>,
    mode: Option<cluster::Mode>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    ApiError::check_kernel_id(&id)?;
    if let Some(mode) = mode {
        return cluster::restart(&mode, &id).await;
    }
    let k = st.kernels.get(&id).await.ok_or_else(|| ApiError::no_kernel(&id))?;
    k.restart().await.map_err(|e| ApiError::internal(format!("restart failed: {e:#}")))?;
    Ok(Json(k.model().await).into_response())
}
