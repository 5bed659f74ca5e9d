//! `/api/kernels…`: create, list, get, delete, interrupt, restart. In cluster mode
//! (see [`super::cluster`]) they go through the meta store. Without cluster mode they act
//! on this host's kernels, which is also what the internal routes on a replica do
//! ([`super::internal_router`]).
//!
//! With users, a kernel is its creator's: another user (not an admin) is answered as if
//! it did not exist ([`Calling::may_see`]), here from the kernel record in cluster mode, so
//! every host enforces it alike. Creates are checked against the quotas ([`super::quota`]).

use std::collections::HashSet;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::calling::Calling;
use super::cluster;
use super::error::ApiError;
use super::kernel_request::{settable_env, CreateKernel};
use super::limits::USERS_CREDENTIAL;
use super::quota::{self, KernelUse};
use super::state::AppState;
use crate::cluster::control::records::KernelRecord;
use crate::kernel::registry::{parse_gpu_memory_mib, CreateError, GPU_MEMORY_ENV};
use crate::users::metrics::user_metrics;

/// The environment variable Kernel Gateway clients name the user with; with users it is
/// set to the kernel's owner, whatever the client sent.
const KERNEL_USERNAME: &str = "KERNEL_USERNAME";

/// `POST /api/kernels`.
pub async fn create(
    State(st): State<Arc<AppState>>,
    mode: Option<cluster::Mode>,
    calling: Calling,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let result = create_kernel(&st, mode, &calling, body).await;
    match &result {
        Ok((id, _)) => calling.audit(&st, "create", Some(id), "ok", None),
        Err(e) => calling.audit_result::<()>(&st, "create", None, &Err(e.clone())),
    }
    result.map(|(_, response)| response)
}

async fn create_kernel(
    st: &AppState,
    mode: Option<cluster::Mode>,
    calling: &Calling,
    body: axum::body::Bytes,
) -> Result<(String, Response), ApiError> {
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
    let owner = calling.caller.user().map(|u| u.user.clone());
    if let Some(owner) = &owner {
        // The client's word never names the owner: the credential does.
        req.env.insert(KERNEL_USERNAME.to_owned(), owner.name.clone());
    }
    // The caps count what exists now: the cluster's kernel records, or this host's kernels.
    let (live, uses): (HashSet<String>, Vec<KernelUse>) = match &mode {
        Some(mode) => {
            let records = cluster::kernel_records(mode).await?;
            (records.iter().map(|r| r.id.clone()).collect(), records.iter().map(record_use).collect())
        }
        None => {
            let kernels = st.kernels.all().await;
            let uses = kernels
                .iter()
                .map(|k| KernelUse {
                    owner: k.owner().map(|u| u.name.clone()),
                    groups: k.owner().map(|u| u.groups.clone()).unwrap_or_default(),
                    gpus: k.gpus,
                })
                .collect();
            (kernels.iter().map(|k| k.id.clone()).collect(), uses)
        }
    };
    if let Some(user) = calling.caller.user() {
        let name = req.name.as_deref().unwrap_or(crate::kernel::spec::DEFAULT_SPEC);
        let asked = gpus.or_else(|| crate::kernel::spec::gpus_of(name)).unwrap_or(0);
        if let Err(refused) = quota::check(&st.limits.config, user, &uses, asked) {
            user_metrics().count_refusal(&user.user.name, refused.reason);
            crate::metrics::count_refusal(refused.reason);
            tracing::warn!(user = %user.user.name, "{refused}");
            return Err(refused.into());
        }
    }
    // kernel.run_as = "owner": refused here, before a cluster kernel is recorded, with
    // the reason (no owner, no such account, root's).
    st.kernels.check_owner(owner.as_ref().map(|u| u.name.as_str())).map_err(create_error)?;
    // limits.kernels_per_token: per user when there are users.
    let credential = owner.as_ref().map_or_else(|| USERS_CREDENTIAL.to_owned(), |u| format!("user:{}", u.name));
    let reservation = st.limits.reserve_kernel(&credential, &live).inspect_err(|e| {
        if let Some(u) = &owner {
            user_metrics().count_refusal(&u.name, e.reason());
        }
    })?;
    if let Some(mode) = mode {
        return cluster::create(&mode, req, gpus, reservation, owner).await;
    }
    let env = settable_env(req.env);
    match st.kernels.create(req.name.as_deref(), gpus, &env, owner.as_ref()).await {
        Ok(k) => {
            reservation.created(&k.id);
            Ok((k.id.clone(), (StatusCode::CREATED, Json(k.model().await)).into_response()))
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

/// A kernel record as quotas count it.
fn record_use(r: &KernelRecord) -> KernelUse {
    KernelUse { owner: r.owner.clone(), groups: r.owner_groups.clone(), gpus: r.gpus }
}

/// `GET /api/kernels`: the caller's kernels (every kernel for admins and operators).
pub async fn list(
    State(st): State<Arc<AppState>>,
    mode: Option<cluster::Mode>,
    calling: Calling,
) -> Result<Response, ApiError> {
    match mode {
        Some(mode) => cluster::list(&mode, &|r: &KernelRecord| calling.caller.may_see(r.owner.as_deref())).await,
        _ => {
            let mut kernels = st.kernels.list().await;
            kernels.retain(|k| calling.caller.may_see(k.owner.as_deref()));
            Ok(Json(kernels).into_response())
        }
    }
}

/// The kernel `id` when the caller may see it; else what an unknown kernel answers.
async fn visible_kernel(
    st: &AppState,
    mode: Option<&cluster::Mode>,
    calling: &Calling,
    action: &str,
    id: &str,
) -> Result<Option<Arc<crate::kernel::LocalKernel>>, ApiError> {
    ApiError::check_kernel_id(id)?;
    match mode {
        Some(mode) => {
            let record = cluster::visible_record(mode, id).await?;
            calling.may_see(st, action, id, record.owner.as_deref())?;
            Ok(None)
        }
        None => {
            let k = st.kernels.get(id).await.ok_or_else(|| ApiError::no_kernel(id))?;
            calling.may_see(st, action, id, k.owner().map(|u| u.name.as_str()))?;
            Ok(Some(k))
        }
    }
}

/// `GET /api/kernels/{id}`.
pub async fn get(
    State(st): State<Arc<AppState>>,
    mode: Option<cluster::Mode>,
    calling: Calling,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let local = visible_kernel(&st, mode.as_ref(), &calling, "get", &id).await?;
    match (mode, local) {
        (Some(mode), _) => cluster::get(&mode, &id).await,
        (None, Some(k)) => Ok(Json(k.model().await).into_response()),
        (None, None) => Err(ApiError::no_kernel(&id)),
    }
}

/// `DELETE /api/kernels/{id}`.
pub async fn delete(
    State(st): State<Arc<AppState>>,
    mode: Option<cluster::Mode>,
    calling: Calling,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    visible_kernel(&st, mode.as_ref(), &calling, "delete", &id).await?;
    let result = match mode {
        // A cluster replica is stopped by its host's supervisor when the record goes, never directly.
        Some(mode) => cluster::delete(&mode, &id).await,
        None if st.kernels.remove(&id).await => Ok(StatusCode::NO_CONTENT),
        None => Err(ApiError::no_kernel(&id)),
    };
    calling.audit_result(&st, "delete", Some(&id), &result);
    result
}

/// `POST /api/kernels/{id}/interrupt`.
pub async fn interrupt(
    State(st): State<Arc<AppState>>,
    mode: Option<cluster::Mode>,
    calling: Calling,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let local = visible_kernel(&st, mode.as_ref(), &calling, "interrupt", &id).await?;
    let result = match (mode, local) {
        (Some(mode), _) => cluster::interrupt(&mode, &id).await,
        (None, Some(k)) => {
            k.interrupt().await.map(|()| StatusCode::NO_CONTENT).map_err(|e| ApiError::internal(format!("{e:#}")))
        }
        (None, None) => Err(ApiError::no_kernel(&id)),
    };
    calling.audit_result(&st, "interrupt", Some(&id), &result);
    result
}

/// `POST /api/kernels/{id}/restart`.
pub async fn restart(
    State(st): State<Arc<AppState>>,
    mode: Option<cluster::Mode>,
    calling: Calling,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let local = visible_kernel(&st, mode.as_ref(), &calling, "restart", &id).await?;
    let result = match (mode, local) {
        (Some(mode), _) => cluster::restart(&mode, &id).await,
        (None, Some(k)) => match k.restart().await {
            Ok(()) => Ok(Json(k.model().await).into_response()),
            Err(e) => Err(ApiError::internal(format!("restart failed: {e:#}"))),
        },
        (None, None) => Err(ApiError::no_kernel(&id)),
    };
    calling.audit_result(&st, "restart", Some(&id), &result);
    result
}
