//! The internal router: what other hosts (their front-ends, their cluster handlers) call
//! on this host's replicas of cluster kernels, under `/internal/v1/replicas/…`
//! ([`crate::link::peer_routes`]), apart from the users' API.
//!
//! | route | credential | what |
//! |---|---|---|
//! | `GET /internal/v1/replicas/{id}/channels` | a host's | the WebSocket onto this host's replica |
//! | `POST /internal/v1/replicas/{id}/interrupt` | a host's | SIGINT to this host's replica |
//! | `POST /internal/v1/replicas/{id}/restart` | a host's | restart this host's replica |
//! | `GET /internal/v1/replicas`, `GET …/{id}` | the users' | the models of this host's replicas |
//!
//! A host's credential: its node certificate, or the operator token in a cluster without
//! them ([`crate::link::credential::Credentials::node`]). Reading a replica's model stays a
//! users' read, as its legacy form was. Every answer carries
//! [`INTERNAL_MARKER`](crate::link::peer_routes::INTERNAL_MARKER), which tells a caller
//! this host has the internal routes. Each handler is the single-host one: a replica is a
//! kernel of this host.

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::HeaderValue;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use super::calling::Calling;
use super::channels::{upgrade, ChannelsPeer};
use super::error::ApiError;
use super::state::AppState;
use super::{auth, cluster, kernels};
use crate::link::peer_routes::INTERNAL_MARKER;

/// The internal routes (merged into the host's router by [`super::router`]).
pub fn routes(state: Arc<AppState>) -> Router<Arc<AppState>> {
    let actions = Router::new()
        .route("/internal/v1/replicas/{id}/interrupt", post(interrupt))
        .route("/internal/v1/replicas/{id}/restart", post(restart))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::require_node));
    let reads = Router::new()
        .route("/internal/v1/replicas", get(list))
        .route("/internal/v1/replicas/{id}", get(model))
        .route_layer(middleware::from_fn_with_state(state, auth::require_token));
    // The channels WebSocket checks the host's credential itself, after the kernel id.
    let sockets = Router::new().route("/internal/v1/replicas/{id}/channels", get(channels));
    Router::new().merge(actions).merge(reads).merge(sockets).route_layer(middleware::map_response(mark))
}

async fn mark(mut resp: Response) -> Response {
    resp.headers_mut().insert(INTERNAL_MARKER, HeaderValue::from_static("1"));
    resp
}

/// `GET /internal/v1/replicas/{id}/channels`: the socket onto this host's replica of `id`.
async fn channels(
    State(st): State<Arc<AppState>>,
    mode: Option<cluster::Mode>,
    Path(id): Path<String>,
    req: Request,
) -> Response {
    // First: a malformed id is no kernel, whatever the credential (nothing to hide about it).
    if let Err(e) = ApiError::check_kernel_id(&id) {
        return e.into_response();
    }
    if let Err(refusal) = st.credentials.node(&req) {
        return refusal.respond(req.uri().path());
    }
    let replicas = mode.map(|m| m.replicas.clone());
    match st.kernels.get(&id).await {
        Some(k) => upgrade(st, ChannelsPeer::Local(k, replicas), req).await,
        None => ApiError::no_kernel(&id).into_response(),
    }
}

async fn interrupt(
    st: State<Arc<AppState>>,
    calling: Calling,
    id: Path<String>,
) -> Result<axum::http::StatusCode, ApiError> {
    kernels::interrupt(st, None, calling, id).await
}

async fn restart(st: State<Arc<AppState>>, calling: Calling, id: Path<String>) -> Result<Response, ApiError> {
    kernels::restart(st, None, calling, id).await
}

async fn list(st: State<Arc<AppState>>, calling: Calling) -> Result<Response, ApiError> {
    kernels::list(st, None, calling).await
}

async fn model(st: State<Arc<AppState>>, calling: Calling, id: Path<String>) -> Result<Response, ApiError> {
    kernels::get(st, None, calling, id).await
}
