//! Compatibility with hosts of the previous release, which know only the legacy form of
//! host-to-host calls: `/api/kernels…?replica=local`. It sits in front of every route and
//! hands those requests to the internal router ([`super::internal_router`]) before routing,
//! so the public handlers have no `?replica=local` forks. It goes in the release after the
//! next one, with the caller's fallback in [`crate::link::peer_routes`] (docs/cluster.md).
//!
//! | legacy request | internal route |
//! |---|---|
//! | `GET /api/kernels?replica=local` | `GET /internal/v1/replicas` |
//! | `GET /api/kernels/{id}?replica=local` | `GET /internal/v1/replicas/{id}` |
//! | `GET /api/kernels/{id}/channels?replica=local` | `GET /internal/v1/replicas/{id}/channels` |
//! | `POST /api/kernels/{id}/interrupt?replica=local` | `POST /internal/v1/replicas/{id}/interrupt` |
//! | `POST /api/kernels/{id}/restart?replica=local` | `POST /internal/v1/replicas/{id}/restart` |
//!
//! Any other request with `?replica=local` and a method other than `GET` keeps what it
//! took before: a host's credential ([`LegacyHostCall`], read by [`super::auth`]). No host
//! sends `HEAD` with it; one is answered as the public route's `HEAD`, with that credential.
//! Legacy calls are counted in `notebookos_http_requests_total` under the internal route
//! they became.

use std::convert::Infallible;

use axum::extract::Request;
use axum::http::{Method, Uri};
use axum::response::Response;
use axum::Router;
use tower_service::Service;

use crate::link::peer_routes::INTERNAL_PREFIX;

/// Marks a legacy non-`GET` `?replica=local` request that has no internal route: it takes
/// a host's credential, as it did.
#[derive(Debug, Clone, Copy)]
pub struct LegacyHostCall;

/// `app` behind the compatibility layer.
pub fn in_front_of(app: Router) -> Router {
    Router::new().fallback(move |req: Request| forward(app.clone(), req))
}

async fn forward(mut app: Router, mut req: Request) -> Response {
    if let Some(uri) = internal_uri(req.method(), req.uri()) {
        *req.uri_mut() = uri;
    } else if wants_local_replica(req.uri().query()) && req.method() != Method::GET {
        req.extensions_mut().insert(LegacyHostCall);
    }
    let answered: Result<Response, Infallible> = app.call(req).await;
    match answered {
        Ok(resp) => resp,
        Err(never) => match never {},
    }
}

/// True when the request's query says `replica=local`.
fn wants_local_replica(query: Option<&str>) -> bool {
    query.is_some_and(|q| q.split('&').any(|kv| kv == "replica=local"))
}

/// The internal route of a legacy request (the rest of its query kept), if it has one.
fn internal_uri(method: &Method, uri: &Uri) -> Option<Uri> {
    let query = uri.query()?;
    if !wants_local_replica(Some(query)) {
        return None;
    }
    let tail = uri.path().strip_prefix("/api/kernels")?;
    let parts: Vec<&str> = tail.split('/').collect();
    let path = match (method, parts.as_slice()) {
        (&Method::GET, [""]) => INTERNAL_PREFIX.to_owned(),
        (&Method::GET, ["", id]) if !id.is_empty() => format!("{INTERNAL_PREFIX}/{id}"),
        (&Method::GET, ["", id, "channels"]) if !id.is_empty() => format!("{INTERNAL_PREFIX}/{id}/channels"),
        (&Method::POST, ["", id, action @ ("interrupt" | "restart")]) if !id.is_empty() => {
            format!("{INTERNAL_PREFIX}/{id}/{action}")
        }
        _ => return None,
    };
    let rest: Vec<&str> = query.split('&').filter(|kv| *kv != "replica=local").collect();
    let path_and_query = if rest.is_empty() { path } else { format!("{path}?{}", rest.join("&")) };
    path_and_query.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapped(method: Method, uri: &str) -> Option<String> {
        internal_uri(&method, &uri.parse().expect("a test URI")).map(|u| u.to_string())
    }

    #[test]
    fn legacy_forms_map_to_internal_routes() {
        assert_eq!(mapped(Method::GET, "/api/kernels?replica=local").as_deref(), Some("/internal/v1/replicas"));
        assert_eq!(mapped(Method::GET, "/api/kernels/k?replica=local").as_deref(), Some("/internal/v1/replicas/k"));
        assert_eq!(
            mapped(Method::GET, "/api/kernels/k/channels?token=t&replica=local").as_deref(),
            Some("/internal/v1/replicas/k/channels?token=t")
        );
        assert_eq!(
            mapped(Method::POST, "/api/kernels/k/interrupt?replica=local").as_deref(),
            Some("/internal/v1/replicas/k/interrupt")
        );
        assert_eq!(
            mapped(Method::POST, "/api/kernels/k/restart?replica=local").as_deref(),
            Some("/internal/v1/replicas/k/restart")
        );
    }

    #[test]
    fn other_requests_stay_public() {
        assert_eq!(mapped(Method::GET, "/api/kernels/k/channels"), None);
        assert_eq!(mapped(Method::GET, "/api/kernels/k/channels?replica=localx"), None);
        assert_eq!(mapped(Method::DELETE, "/api/kernels/k?replica=local"), None);
        assert_eq!(mapped(Method::POST, "/api/kernels?replica=local"), None);
        assert_eq!(mapped(Method::GET, "/api/v1/cluster/replicas?replica=local"), None);
        assert_eq!(mapped(Method::GET, "/api/kernels//channels?replica=local"), None);
    }
}
