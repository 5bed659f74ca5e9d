//! The API's credential check (see [`crate::link::credential`] for who may call what).

use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::calling::source_of;
use super::legacy_replica_query::LegacyHostCall;
use super::state::AppState;
use crate::link::credential::{node_caller, Presented, Refusal};
use crate::users::audit::{event, AuditEvent};
use crate::users::Caller;

/// The route a front-end calls on a replica host after a restart.
pub const RESET_NAMESPACE: &str = "/api/v1/cluster/kernels/{id}/reset-namespace";

/// Refuses a request without a users' credential (401), unless the API is open, and puts
/// its [`Caller`] into the request's extensions for the handlers. Resetting a replica's
/// namespace takes another host's node certificate instead, as does a legacy
/// `?replica=local` call without an internal route ([`LegacyHostCall`]).
pub async fn require_token(State(st): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    let host_to_host = req.extensions().get::<LegacyHostCall>().is_some()
        || req.extensions().get::<MatchedPath>().is_some_and(|p| p.as_str() == RESET_NAMESPACE);
    let checked = if host_to_host {
        st.credentials.node(&req).map(|()| Caller::Host(node_caller(&req).unwrap_or_default()))
    } else {
        st.credentials.caller(Presented::of(&req)).await
    };
    match checked {
        Ok(caller) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        Err(refusal) => refused(&st, refusal, &req),
    }
}

/// Answers a credential refusal, and audits it.
pub fn refused(st: &AppState, refusal: Refusal, req: &Request) -> Response {
    if let Some(log) = &st.audit {
        let detail = format!("{} {}", refusal.reason(), req.uri().path());
        log.record(AuditEvent {
            source: source_of(req.extensions()).map(|a| a.to_string()),
            detail: Some(&detail),
            ..event(crate::users::account_name::UNKNOWN, "authenticate", None, "unauthenticated")
        });
    }
    refusal.respond(req.uri().path())
}

/// Refuses a request without another host's credential (its node certificate, or the
/// operator token in a cluster without them): the internal routes that act on a replica.
pub async fn require_node(State(st): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    match st.credentials.node(&req) {
        Ok(()) => {
            let host = node_caller(&req).unwrap_or_default();
            req.extensions_mut().insert(Caller::Host(host));
            next.run(req).await
        }
        Err(refusal) => refusal.respond(req.uri().path()),
    }
}

/// Token-less dev mode (`--dev`, a loopback listener) trusts whoever reaches the port, so
/// it must be a local program, not a web page the user happens to have open: a page can
/// send requests to 127.0.0.1 (with a rebound DNS name as `Host`, or with its own
/// `Origin`) and post forms without a preflight. So, without a token: `Host` must name a
/// loopback address, `Origin` must be absent or loopback, and a request body must be JSON.
pub async fn guard_open_api(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if !st.credentials.open_api() {
        return next.run(req).await;
    }
    let refuse = |status: StatusCode, why: String| {
        tracing::warn!(path = %req.uri().path(), %why, "refused request to the token-less API");
        (status, format!("{}: {why}\n", status.as_u16())).into_response()
    };
    let host = req.headers().get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    if !is_loopback_authority(host) {
        return refuse(StatusCode::FORBIDDEN, format!("the token-less API answers only a loopback Host, not {host:?}"));
    }
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        let authority = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://"));
        if !authority.is_some_and(is_loopback_authority) {
            return refuse(StatusCode::FORBIDDEN, format!("the token-less API refuses Origin {origin:?}"));
        }
    }
    let has_body =
        req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).is_some_and(|n| n.trim() != "0")
            || req.headers().contains_key(header::TRANSFER_ENCODING);
    let json = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.split(';').next().is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json")));
    if has_body && !json {
        return refuse(StatusCode::UNSUPPORTED_MEDIA_TYPE, "the token-less API takes JSON bodies only".to_owned());
    }
    next.run(req).await
}

/// `localhost`, `127.x.y.z` or `[::1]`, with or without a port.
fn is_loopback_authority(authority: &str) -> bool {
    let host = match authority.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => authority.rsplit_once(':').map_or(authority, |(h, port)| {
            if port.chars().all(|c| c.is_ascii_digit()) {
                h
            } else {
                authority
            }
        }),
    };
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::is_loopback_authority;

    #[test]
    fn only_loopback_authorities_pass() {
        for ok in ["localhost", "LOCALHOST:8888", "127.0.0.1", "127.0.0.1:8888", "127.1.2.3:1", "[::1]", "[::1]:8888"] {
            assert!(is_loopback_authority(ok), "{ok}");
        }
        for bad in [
            "",
            "evil.example",
            "evil.example:8888",
            "localhost.evil.example",
            "10.0.0.1:8888",
            "[::2]:1",
            "127.0.0.1.evil.example",
            "0.0.0.0:8888",
        ] {
            assert!(!is_loopback_authority(bad), "{bad}");
        }
    }
}
