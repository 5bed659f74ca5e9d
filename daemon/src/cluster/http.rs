//! The cluster's HTTP API (`/api/v1/cluster/…`), merged into the host's router in
//! cluster mode. Other hosts call it to forward leader-only work; `nbos cluster` calls
//! it for status, join and leave.
//!
//! Credentials ([`Credentials`]): reading, and deleting a kernel record, take the users'
//! credential; creating a record, membership, leave (drain) and re-placement take the
//! operator token (moving a replica too); a call another host forwarded ([`FORWARDED_HEADER`], run here
//! without forwarding again) takes that host's node certificate, and for membership the
//! operator token as well (the forwarding host sends it), so a node key alone cannot
//! change the cluster. With `[auth]` users, a user reads and deletes only their own kernels'
//! records (another user's is no such kernel); admins, operators and hosts all.
//! Users create kernels through the Jupyter API (`POST /api/kernels`), which applies the
//! caps of `[limits]`; a record created here bypasses them, so only operators may.
//!
//! | route | what |
//! |---|---|
//! | `GET /api/v1/cluster/status` | [`ClusterStatus`] as this host sees it |
//! | `GET /api/v1/cluster/kernels` | every [`KernelRecord`] |
//! | `POST /api/v1/cluster/kernels` | [`KernelSpec`] → placed [`KernelRecord`] (meta leader; operator) |
//! | `GET /api/v1/cluster/kernels/{id}` | one record |
//! | `DELETE /api/v1/cluster/kernels/{id}` | delete the record (meta leader) |
//! | `POST /api/v1/cluster/kernels/{id}/replace` | `{"node_id": n}` → re-placed record or `null` (meta leader) |
//! | `POST /api/v1/cluster/kernels/{id}/migrate` | [`MoveRequest`] → [`super::control::meta::MoveAnswer`]: begin moving a replica (meta leader) |
//! | `GET /api/v1/cluster/kernels/{id}/ready` | node ids whose replica of the kernel is ready |
//! | `POST /api/v1/cluster/members` | [`PeerRecord`] → add a host to the meta group (meta leader) |
//! | `DELETE /api/v1/cluster/members/{id}` | remove a host from the meta group (meta leader) |
//! | `POST /api/v1/cluster/canary` | [`CanaryOp`] → [`super::control::meta::CanaryAnswer`]: a canary register in the meta group (operator) |
//! | `POST /api/v1/cluster/leave` | this host leaves ([`LeaveReport`]); `{"phase": "drain"}` only moves its replicas, `{"phase": "remove"}` only leaves the meta group |
//! | `GET /api/v1/cluster/objects` | the large-object store as the collector sees it ([`GcReport`], a dry run on the meta leader) |
//! | `POST /api/v1/cluster/objects/gc` | [`GcRequest`] → [`GcReport`]: collect now (meta leader; operator) |
//! | `GET /api/v1/cluster/objects/refs` | [`HostRefs`]: the objects this host's kernel groups point to (the collector asks every host; operator) |

use std::collections::HashSet;
use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};

#[cfg(doc)]
use super::cells::object_collector::GcReport;
use super::cells::object_collector::{Collector, GcRequest, GC_PATH, OBJECTS_PATH, REFS_PATH};
#[cfg(doc)]
use super::cells::state_sync::HostRefs;
use super::control::meta::ClusterStatus;
#[cfg(doc)]
use super::control::meta::LeaveReport;
use super::control::meta::{CanaryOp, Cluster, ClusterError, KernelSpec, MoveRequest, PeerRecord, FORWARDED_HEADER};
use super::control::records::KernelRecord;
use crate::link::credential::{node_caller, Credentials, Presented};
use crate::users::Caller;

/// The cluster routes, with authentication by `credentials`.
pub fn router(cluster: Arc<Cluster>, collector: Arc<Collector>, credentials: Credentials) -> Router {
    let credentials = Arc::new(credentials);
    let users = Router::new()
        .route("/api/v1/cluster/status", get(status))
        .route("/api/v1/cluster/kernels", get(list_kernels))
        .route("/api/v1/cluster/kernels/{id}", get(get_kernel).delete(delete_kernel))
        .route("/api/v1/cluster/kernels/{id}/ready", get(ready_hosts))
        .route_layer(middleware::from_fn_with_state(credentials.clone(), require_user));
    let operators = Router::new()
        .route("/api/v1/cluster/kernels", post(create_kernel))
        .route("/api/v1/cluster/kernels/{id}/replace", post(replace_replica))
        .route("/api/v1/cluster/kernels/{id}/migrate", post(move_replica))
        .route_layer(middleware::from_fn_with_state(credentials.clone(), require_operator));
    // Membership, leaving (which removes this host from it) and the canary registers (never
    // forwarded): the operator token even on a call marked forwarded.
    let membership = Router::new()
        .route("/api/v1/cluster/canary", post(canary))
        .route("/api/v1/cluster/members", post(add_member))
        .route("/api/v1/cluster/members/{id}", axum::routing::delete(remove_member))
        .route("/api/v1/cluster/leave", post(leave))
        .route_layer(middleware::from_fn_with_state(credentials.clone(), require_operator_always));
    let objects_read = Router::new()
        .route(OBJECTS_PATH, get(objects_status))
        .route_layer(middleware::from_fn_with_state(credentials.clone(), require_user));
    let objects_act = Router::new()
        .route(GC_PATH, post(objects_gc))
        .route(REFS_PATH, get(objects_refs))
        .route_layer(middleware::from_fn_with_state(credentials, require_operator));
    let objects = objects_read.merge(objects_act).with_state(collector);
    users.merge(operators).merge(membership).with_state(cluster).merge(objects)
}

async fn require_user(State(creds): State<Arc<Credentials>>, mut req: Request, next: Next) -> Response {
    // A forwarded call: the host that forwarded it checked its user.
    let checked = if forwarded(req.headers()) {
        creds.node(&req).map(|()| Caller::Host(node_caller(&req).unwrap_or_default()))
    } else {
        creds.caller(Presented::of(&req)).await
    };
    match checked {
        Ok(caller) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        Err(refusal) => refusal.respond(req.uri().path()),
    }
}

/// `Ok` when `caller` may see kernel `id` (absent, or another user's: no such kernel).
async fn visible(c: &Cluster, caller: &Caller, id: &str) -> Result<KernelRecord, ApiError> {
    match c.kernel(id).await? {
        Some(k) if caller.may_see(k.owner.as_deref()) => Ok(k),
        _ => Err(ClusterError::NoSuchKernel(id.to_owned()).into()),
    }
}

async fn require_operator(State(creds): State<Arc<Credentials>>, req: Request, next: Next) -> Response {
    // A forwarded call: the host that forwarded it checked the operator; it proves itself.
    let checked = if forwarded(req.headers()) { creds.node(&req) } else { creds.operator(&req) };
    match checked {
        Ok(()) => next.run(req).await,
        Err(refusal) => refusal.respond(req.uri().path()),
    }
}

async fn require_operator_always(State(creds): State<Arc<Credentials>>, req: Request, next: Next) -> Response {
    // Forwarded: the host proves itself and passes on the operator's token.
    let checked = if forwarded(req.headers()) {
        creds.node(&req).and_then(|()| creds.operator(&req))
    } else {
        creds.operator(&req)
    };
    match checked {
        Ok(()) => next.run(req).await,
        Err(refusal) => refusal.respond(req.uri().path()),
    }
}

/// A cluster error as an HTTP answer: `{"message": …}` with a status that says whether
/// retrying may help (503) or not.
struct ApiError(ClusterError);

impl From<ClusterError> for ApiError {
    fn from(e: ClusterError) -> Self {
        ApiError(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match &self.0 {
            ClusterError::NotReady(_) | ClusterError::NotLeader { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ClusterError::Store(e) if e.outcome_unknown() => StatusCode::GATEWAY_TIMEOUT,
            ClusterError::Store(raft_store::Error::NotLeader { .. }) => StatusCode::SERVICE_UNAVAILABLE,
            ClusterError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ClusterError::Placement(_) | ClusterError::Conflict(_) => StatusCode::CONFLICT,
            ClusterError::NoSuchKernel(_) => StatusCode::NOT_FOUND,
            ClusterError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ClusterError::Remote { status, .. } => StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_GATEWAY),
        };
        let message = match &self.0 {
            // The remote host's own message, not wrapped twice.
            ClusterError::Remote { message, .. } => message.clone(),
            other => other.to_string(),
        };
        (status, Json(serde_json::json!({ "message": message }))).into_response()
    }
}

fn forwarded(h: &HeaderMap) -> bool {
    h.contains_key(FORWARDED_HEADER)
}

async fn status(State(c): State<Arc<Cluster>>, Extension(caller): Extension<Caller>) -> Result<Response, ApiError> {
    let mut status = c.status().await?;
    if !caller.sees_every_kernel() {
        let kernels = c.kernels().await?;
        let visible: HashSet<String> =
            kernels.into_iter().filter(|k| caller.may_see(k.owner.as_deref())).map(|k| k.id).collect();
        hide_others(&mut status, &caller, &visible);
    }
    Ok(Json(status).into_response())
}

/// What of the cluster's status a user who does not see every kernel may see: hosts and
/// their load, but only their own kernels (ids in the load records' memory and in moves,
/// and the count) and their own GPU time today (and their groups'), so a user cannot learn
/// that another's kernel exists or how much GPU time another used.
fn hide_others(status: &mut ClusterStatus, caller: &Caller, visible: &HashSet<String>) {
    let user = caller.user().map(|u| &u.user);
    status.kernels = visible.len();
    status.moving.retain(|m| visible.contains(&m.kernel));
    for load in status.members.iter_mut().filter_map(|m| m.load.as_mut()) {
        load.kernel_memory_mib.retain(|id, _| visible.contains(id));
        load.gpu_seconds_today.retain(|name, _| user.is_some_and(|u| &u.name == name));
        load.group_gpu_seconds_today.retain(|group, _| user.is_some_and(|u| u.in_group(group)));
    }
}

async fn list_kernels(
    State(c): State<Arc<Cluster>>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    let mut kernels = c.kernels().await?;
    kernels.retain(|k| caller.may_see(k.owner.as_deref()));
    Ok(Json(kernels).into_response())
}

async fn get_kernel(
    State(c): State<Arc<Cluster>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    Ok(Json(visible(&c, &caller, &id).await?).into_response())
}

async fn create_kernel(
    State(c): State<Arc<Cluster>>,
    headers: HeaderMap,
    Json(spec): Json<KernelSpec>,
) -> Result<Response, ApiError> {
    let record = if forwarded(&headers) { c.create_kernel_here(spec).await? } else { c.create_kernel(spec).await? };
    Ok((StatusCode::CREATED, Json(record)).into_response())
}

async fn delete_kernel(
    State(c): State<Arc<Cluster>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    if !caller.sees_every_kernel() {
        visible(&c, &caller, &id).await?;
    }
    let deleted = if forwarded(&headers) {
        if c.meta_leader().await != Some(c.node_id()) {
            return Err(ClusterError::NotLeader { me: c.node_id(), leader: c.meta_leader().await }.into());
        }
        c.meta().delete(super::control::records::keys::kernel(&id)).await.map_err(ClusterError::from)?
    } else {
        c.delete_kernel(&id).await?
    };
    Ok(Json(serde_json::json!({ "deleted": deleted })).into_response())
}

#[derive(serde::Deserialize)]
struct ReplaceBody {
    node_id: u64,
}

async fn replace_replica(
    State(c): State<Arc<Cluster>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Json(body): Json<ReplaceBody>,
) -> Result<Response, ApiError> {
    let out = if forwarded(&headers) {
        c.replace_replica_here(&id, body.node_id).await?
    } else {
        c.replace_replica(&id, body.node_id).await?
    };
    Ok(Json(out).into_response())
}

async fn canary(State(c): State<Arc<Cluster>>, Json(op): Json<CanaryOp>) -> Result<Response, ApiError> {
    Ok(Json(c.canary(op).await?).into_response())
}

async fn move_replica(
    State(c): State<Arc<Cluster>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Json(body): Json<MoveRequest>,
) -> Result<Response, ApiError> {
    let out =
        if forwarded(&headers) { c.move_replica_here(&id, &body).await? } else { c.move_replica(&id, body).await? };
    Ok(Json(out).into_response())
}

async fn add_member(
    State(c): State<Arc<Cluster>>,
    headers: HeaderMap,
    Json(peer): Json<PeerRecord>,
) -> Result<Response, ApiError> {
    let m = if forwarded(&headers) { c.add_member_here(peer).await? } else { c.add_member(peer).await? };
    Ok(Json(m).into_response())
}

async fn remove_member(
    State(c): State<Arc<Cluster>>,
    headers: HeaderMap,
    Path(id): Path<u64>,
) -> Result<Response, ApiError> {
    let m = if forwarded(&headers) { c.remove_member_here(id).await? } else { c.remove_member(id).await? };
    Ok(Json(m).into_response())
}

/// Body of `POST /api/v1/cluster/leave`: `{}` does both phases; `nbos cluster leave`
/// drains, waits for the moved replicas to be ready, then removes.
#[derive(Debug, Default, serde::Deserialize)]
struct LeaveBody {
    #[serde(default)]
    phase: Option<String>,
}

async fn leave(State(c): State<Arc<Cluster>>, body: Option<Json<LeaveBody>>) -> Result<Response, ApiError> {
    let body = body.map(|Json(b)| b).unwrap_or_default();
    match body.phase.as_deref() {
        None => Ok(Json(c.leave().await?).into_response()),
        Some("drain") => {
            let moved = c.drain().await?;
            Ok(Json(serde_json::json!({ "node_id": c.node_id(), "moved": moved })).into_response())
        }
        Some("remove") => Ok(Json(c.remove_self().await?).into_response()),
        Some(other) => {
            Err(ClusterError::BadRequest(format!("unknown leave phase {other:?} (drain, remove, or none)")).into())
        }
    }
}

async fn ready_hosts(
    State(c): State<Arc<Cluster>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    if !caller.sees_every_kernel() {
        visible(&c, &caller, &id).await?;
    }
    Ok(Json(c.ready_hosts(&id).await?).into_response())
}

async fn objects_status(State(c): State<Arc<Collector>>) -> Result<Response, ApiError> {
    Ok(Json(c.collect_on_leader(true).await?).into_response())
}

async fn objects_gc(
    State(c): State<Arc<Collector>>,
    headers: HeaderMap,
    Json(body): Json<GcRequest>,
) -> Result<Response, ApiError> {
    let report = if forwarded(&headers) {
        c.collect_here(body.dry_run).await?
    } else {
        c.collect_on_leader(body.dry_run).await?
    };
    Ok(Json(report).into_response())
}

async fn objects_refs(State(c): State<Arc<Collector>>) -> Result<Response, ApiError> {
    Ok(Json(c.local_refs().await?).into_response())
}
