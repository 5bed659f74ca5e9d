//! The host's router: every route of the gateway (the users' API and the internal routes
//! of [`super::internal_router`]), token authentication on the API, and the request
//! counter, behind the legacy `?replica=local` layer ([`super::legacy_replica_query`]).
//! Cluster mode adds its extension on top ([`super::cluster::enable`]).

use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;

use super::state::AppState;
use super::{auth, channels, cluster, internal_router, kernels, kernelspecs, legacy_replica_query, operator};
use crate::metrics::HttpLabels;

/// Builds the router.
pub fn router(state: Arc<AppState>) -> Router {
    let api = Router::new()
        .route("/api", get(operator::api_version))
        .route("/api/v1/status", get(operator::status))
        .route("/api/v1/gpus", get(operator::gpus))
        .route("/api/v1/leases", get(operator::leases))
        .route("/api/kernelspecs", get(kernelspecs::list))
        .route("/api/kernelspecs/{name}", get(kernelspecs::get))
        .route("/kernelspecs/{name}/{resource}", get(kernelspecs::resource))
        .route("/api/kernels", get(kernels::list).post(kernels::create))
        .route("/api/kernels/{id}", get(kernels::get).delete(kernels::delete))
        .route("/api/kernels/{id}/interrupt", post(kernels::interrupt))
        .route("/api/kernels/{id}/restart", post(kernels::restart))
        .route("/api/v1/cluster/replicas", get(cluster::replica_routes::replicas_route))
        .route("/api/v1/cluster/kernels/{id}/digest", get(cluster::replica_routes::digest_route))
        .route("/api/v1/cluster/kernels/{id}/elections", get(cluster::replica_routes::elections_route))
        .route(auth::RESET_NAMESPACE, post(cluster::replica_routes::reset_namespace_route))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::require_token));
    // The channels WebSocket checks credentials itself, after the kernel id.
    let ws = Router::new().route("/api/kernels/{id}/channels", get(channels::channels));
    let app = Router::new()
        .route("/healthz", get(operator::healthz))
        .route("/metrics", get(operator::metrics))
        .merge(api)
        .merge(ws)
        .merge(internal_router::routes(state.clone()))
        .layer(middleware::from_fn_with_state(state.clone(), auth::guard_open_api))
        .layer(middleware::from_fn_with_state(state.clone(), count_requests))
        .with_state(state);
    legacy_replica_query::in_front_of(app)
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
