//! [`Calling`]: who made a request and from where (put there by [`super::auth`]), and what
//! the handlers do with it: hide other users' kernels, and write the audit log.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::StatusCode;

use super::error::ApiError;
use super::state::AppState;
use crate::link::tls::Peer;
use crate::users::audit::{event, AuditEvent};
use crate::users::metrics::user_metrics;
use crate::users::Caller;

/// The caller of a request and the client's address.
#[derive(Debug, Clone)]
pub struct Calling {
    /// Who (see [`Caller`]).
    pub caller: Caller,
    /// The client's address (absent on a request that came in without a connection's info).
    pub source: Option<SocketAddr>,
}

/// The client's address of a request's connection.
pub fn source_of(parts: &axum::http::Extensions) -> Option<SocketAddr> {
    parts.get::<ConnectInfo<Peer>>().map(|ConnectInfo(p)| p.addr)
}

impl<S: Send + Sync> FromRequestParts<S> for Calling {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        // Put there by the credential check; missing only on a route wired without it.
        let caller = parts.extensions.get::<Caller>().cloned().ok_or_else(|| ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: "no caller on a users' route (the credential check is missing)".to_owned(),
        })?;
        Ok(Self { caller, source: source_of(&parts.extensions) })
    }
}

impl Calling {
    /// `Ok` when the caller may see a kernel owned by `owner`; otherwise what an unknown
    /// kernel answers (so nobody learns that another user's kernel exists), audited and counted.
    pub fn may_see(&self, st: &AppState, action: &str, id: &str, owner: Option<&str>) -> Result<(), ApiError> {
        if self.caller.may_see(owner) {
            return Ok(());
        }
        let name = self.caller.audit_name();
        user_metrics().count_refusal(&name, "not_found");
        tracing::info!(user = %name, kernel = %id, action, "another user's kernel: answered as unknown");
        self.audit(st, action, Some(id), "not_found", Some("another user's kernel"));
        Err(ApiError::no_kernel(id))
    }

    /// Writes one audit line (when `auth.audit_log` is set).
    pub fn audit(&self, st: &AppState, action: &str, kernel: Option<&str>, outcome: &str, detail: Option<&str>) {
        if let Some(log) = &st.audit {
            let name = self.caller.audit_name();
            log.record(AuditEvent {
                source: self.source.map(|a| a.to_string()),
                detail,
                ..event(&name, action, kernel, outcome)
            });
        }
    }

    /// Audits `result`'s outcome of `action`.
    pub fn audit_result<T>(&self, st: &AppState, action: &str, kernel: Option<&str>, result: &Result<T, ApiError>) {
        match result {
            Ok(_) => self.audit(st, action, kernel, "ok", None),
            Err(e) => self.audit(st, action, kernel, outcome_of(e), Some(&e.message)),
        }
    }
}

/// The audit outcome of an error answer.
fn outcome_of(e: &ApiError) -> &'static str {
    match e.status {
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::TOO_MANY_REQUESTS => "refused",
        s if s.is_client_error() => "refused",
        _ => "error",
    }
}
