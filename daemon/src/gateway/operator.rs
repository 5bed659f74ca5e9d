//! What operators and probes ask a host: `/api` (the version Jupyter clients probe first),
//! `/api/v1/status`, `/api/v1/gpus`, `/api/v1/leases`, `/healthz` and `/metrics`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::calling::Calling;
use super::cluster;
use super::error::ApiError;
use super::state::AppState;
use crate::metrics::StateLabels;
use crate::status::NodeStatus;

/// `GET /healthz`.
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// `GET /metrics` (OpenMetrics), with the cluster's front-end and sync metrics in cluster mode.
pub async fn metrics(State(st): State<Arc<AppState>>, mode: Option<cluster::Mode>) -> Response {
    // Kernels by state are counted when scraped, so the gauge never drifts.
    st.metrics.kernels.clear();
    for k in st.kernels.list().await {
        st.metrics.kernels.get_or_create(&StateLabels { state: k.execution_state }).inc();
    }
    match crate::sys::fs_stats::free_bytes(std::path::Path::new(&st.state_dir)) {
        Ok(free) => {
            st.metrics.state_dir_free_bytes.set(i64::try_from(free).unwrap_or(i64::MAX));
        }
        Err(e) => tracing::debug!(error = %e, "statvfs of the state directory"),
    }
    // Kernels by owner too, from the cluster's records in cluster mode.
    let owners: Vec<String> = match &mode {
        Some(mode) => mode.cluster.kernels().await.unwrap_or_default().into_iter().filter_map(|r| r.owner).collect(),
        None => st.kernels.list().await.into_iter().filter_map(|k| k.owner).collect(),
    };
    crate::users::metrics::user_metrics().set_kernels(owners.iter().map(String::as_str));
    let mut text = st.metrics.render();
    crate::users::metrics::user_metrics().append_to(&mut text);
    if let Some(mode) = mode {
        mode.frontends.append_metrics(&mut text);
        crate::metrics::append_registry(&mode.replicas.sync_metrics().registry(), &mut text);
        crate::metrics::append_registry(&mode.cluster.elastic_metrics().registry(), &mut text);
        crate::metrics::append_registry(&mode.collector.registry(), &mut text);
        crate::metrics::append_exposition(&mode.cluster.store().metrics_text(), &mut text);
    }
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response()
}

/// `GET /api`: what Jupyter clients probe first.
pub async fn api_version() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "version": env!("CARGO_PKG_VERSION"), "server": "notebookosd" }))
}

/// `GET /api/v1/status`: this host at a glance.
pub async fn status(State(st): State<Arc<AppState>>) -> Json<NodeStatus> {
    Json(NodeStatus {
        node: st.node.clone(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        uptime_s: st.started.elapsed().as_secs(),
        dev: st.dev,
        url: st.url.clone(),
        state_dir: st.state_dir.clone(),
        auth: !st.credentials.open_api(),
        inventory: st.inventory.clone(),
        kernels: u64::try_from(st.kernels.len().await).unwrap_or(u64::MAX),
        fenced_gpus: st.leases.as_ref().map(|l| l.fenced()).unwrap_or_default(),
    })
}

/// `GET /api/v1/gpus`: who holds which GPU, and which cells wait (every kernel's: not a
/// user's view, see [`every_kernel_view`]).
pub async fn gpus(
    State(st): State<Arc<AppState>>,
    calling: Calling,
) -> Result<Json<nbos_sched::host::Snapshot>, ApiError> {
    every_kernel_view(&calling)?;
    Ok(Json(st.kernels.binder().snapshot()))
}

/// `GET /api/v1/leases`: the kernel processes connected to the lease server and their leases.
pub async fn leases(
    State(st): State<Arc<AppState>>,
    calling: Calling,
) -> Result<Json<Vec<crate::lease::ProcessStatus>>, ApiError> {
    every_kernel_view(&calling)?;
    Ok(Json(st.leases.as_ref().map(|l| l.status()).unwrap_or_default()))
}

/// Views that name every kernel of the host are for admins and operators when there are
/// users: a user must not learn others' kernel ids from them.
fn every_kernel_view(calling: &Calling) -> Result<(), ApiError> {
    if calling.caller.sees_every_kernel() {
        Ok(())
    } else {
        Err(ApiError {
            status: axum::http::StatusCode::FORBIDDEN,
            message: "every kernel's view: for admins (auth.admin_group) and the operator token".to_owned(),
        })
    }
}
