//! The HTTP face of a host: the Jupyter gateway API (with the single-host platform,
//! issue 6), the operator API (`/api/v1/…`), `/metrics` and `/healthz`.

pub mod auth;
pub mod cell;
pub mod channels;
pub mod client;
pub mod cluster;
pub mod error;
pub mod kernels;
pub mod kernelspecs;

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use crate::gpu::Inventory;
use crate::kernel::Kernels;
use crate::metrics::{HttpLabels, Metrics, StateLabels};
use crate::status::NodeStatus;

/// What the HTTP handlers share.
pub struct AppState {
    /// Host name.
    pub node: String,
    /// Base URL clients use.
    pub url: String,
    /// Durable state directory (shown in status).
    pub state_dir: String,
    /// Started with `--dev`.
    pub dev: bool,
    /// When the daemon started.
    pub started: Instant,
    /// The API token; `None` means the API is open (loopback `--dev` only).
    pub token: Option<String>,
    /// GPU inventory.
    pub inventory: Inventory,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The kernels hosted here.
    pub kernels: Arc<Kernels>,
    /// The lease server (hosts with GPUs).
    pub leases: Option<Arc<crate::lease::LeaseServer>>,
}

/// Builds the router.
pub fn router(state: Arc<AppState>) -> Router {
    let api = Router::new()
        .route("/api", get(api_version))
        .route("/api/v1/status", get(status))
        .route("/api/v1/gpus", get(gpus))
        .route("/api/v1/leases", get(leases))
        .route("/api/kernelspecs", get(kernelspecs::list))
        .route("/api/kernelspecs/{name}", get(kernelspecs::get))
        .route("/kernelspecs/{name}/{resource}", get(kernelspecs::resource))
        .route("/api/kernels", get(kernels::list).post(kernels::create))
        .route("/api/kernels/{id}", get(kernels::get).delete(kernels::delete))
        .route("/api/kernels/{id}/interrupt", post(kernels::interrupt))
        .route("/api/kernels/{id}/restart", post(kernels::restart))
        .route("/api/v1/cluster/replicas", get(cluster_replicas))
        .route("/api/v1/cluster/kernels/{id}/digest", get(cluster_digest))
        .route("/api/v1/cluster/kernels/{id}/elections", get(cluster_elections))
        .route("/api/v1/cluster/kernels/{id}/reset-namespace", post(cluster_reset_namespace))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::require_token));
    // The channels WebSocket checks the token itself (see `channels` for why).
    let ws = Router::new().route("/api/kernels/{id}/channels", get(channels::channels));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .merge(api)
        .merge(ws)
        .layer(middleware::from_fn_with_state(state.clone(), count_requests))
        .with_state(state)
}

/// `GET /api/v1/cluster/replicas`: the replicas of cluster kernels hosted here (role, lag).
async fn cluster_replicas(mode: Option<cluster::Mode>) -> Result<Response, error::ApiError> {
    let mode = mode.ok_or_else(not_in_cluster_mode)?;
    Ok(Json(mode.replicas.replicas().await).into_response())
}

async fn cluster_digest(mode: Option<cluster::Mode>, Path(id): Path<String>) -> Result<Response, error::ApiError> {
    let mode = mode.ok_or_else(not_in_cluster_mode)?;
    cluster::digest(&mode, &id).await
}

async fn cluster_elections(mode: Option<cluster::Mode>, Path(id): Path<String>) -> Result<Response, error::ApiError> {
    let mode = mode.ok_or_else(not_in_cluster_mode)?;
    cluster::elections(&mode, &id).await
}

async fn cluster_reset_namespace(
    mode: Option<cluster::Mode>,
    Path(id): Path<String>,
) -> Result<Response, error::ApiError> {
    let mode = mode.ok_or_else(not_in_cluster_mode)?;
    cluster::reset_namespace(&mode, &id).await
}

fn not_in_cluster_mode() -> error::ApiError {
    error::ApiError::not_found("this host is not in cluster mode ([cluster] enabled = false)")
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn metrics(State(st): State<Arc<AppState>>, mode: Option<cluster::Mode>) -> Response {
    // Kernels by state are counted when scraped, so the gauge never drifts.
    st.metrics.kernels.clear();
    for k in st.kernels.list().await {
        st.metrics.kernels.get_or_create(&StateLabels { state: k.execution_state }).inc();
    }
    let mut text = st.metrics.render();
    if let Some(mode) = mode {
        mode.frontends.append_metrics(&mut text);
        crate::metrics::append_registry(&mode.replicas.sync_metrics().registry(), &mut text);
    }
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response()
}

/// `GET /api`: what Jupyter clients probe first.
async fn api_version() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "version": env!("CARGO_PKG_VERSION"), "server": "notebookosd" }))
}

async fn status(State(st): State<Arc<AppState>>) -> Json<NodeStatus> {
    Json(NodeStatus {
        node: st.node.clone(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        uptime_s: st.started.elapsed().as_secs(),
        dev: st.dev,
        url: st.url.clone(),
        state_dir: st.state_dir.clone(),
        auth: st.token.is_some(),
        inventory: st.inventory.clone(),
        kernels: u64::try_from(st.kernels.len().await).unwrap_or(u64::MAX),
    })
}

/// `GET /api/v1/gpus`: who holds which GPU, and which cells wait.
async fn gpus(State(st): State<Arc<AppState>>) -> Json<crate::sched::host::Snapshot> {
    Json(st.kernels.binder().snapshot())
}

/// `GET /api/v1/leases`: the kernel processes connected to the lease server and their leases.
async fn leases(State(st): State<Arc<AppState>>) -> Json<Vec<crate::lease::ProcessStatus>> {
    Json(st.leases.as_ref().map(|l| l.status()).unwrap_or_default())
}

async fn count_requests(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    // The route template, not the raw path: kernel ids must not become label values.
    let route = req.extensions().get::<MatchedPath>().map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let resp = next.run(req).await;
    let code = resp.status().as_u16();
    st.metrics.http_requests_total.get_or_create(&HttpLabels { route, code }).inc();
    if resp.status() == StatusCode::UNAUTHORIZED {
        st.metrics.http_auth_failures_total.inc();
    }
    resp
}
