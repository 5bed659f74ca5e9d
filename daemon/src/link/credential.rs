//! Who may call what on a host's HTTP API, decided from one request:
//!
//! - **users** (the Jupyter API, the operator's read-only views): without `[auth]` users,
//!   the one API token, *or* a client certificate the TLS handshake verified against
//!   `http.tls.client_ca` (that is how jupyter_server's `GatewayKernelClient` authenticates
//!   its channels WebSocket, which it opens without headers): an anonymous caller. With
//!   users ([`Authenticator`]), a user's own token or certificate names them; the shared
//!   token is refused; the operator token is the operator everywhere;
//! - **hosts** (cluster-internal routes): a verified certificate naming `node-<id>`
//!   (see [`node_caller`]); the users' token is refused there;
//! - **operators** (membership, drain, re-placement): the operator token.
//!
//! Every refusal is counted in `notebookos_http_auth_refusals_total{reason}`.

use axum::extract::{ConnectInfo, Request};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use std::sync::Arc;

use super::tls::{cert_names_node, ClientCertificate, Peer};
use super::token::{presented_token, token_matches};
use crate::users::{AuthError, Authenticator, Caller};

/// Header in which a host names itself on a host-to-host call; its certificate must name
/// `node-<id>` for that id.
pub const NODE_HEADER: &str = "x-notebookos-node";

/// Why a request was refused; its `reason` labels the metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No token and no client certificate (401).
    NoCredential,
    /// A token that is not the API token (401).
    WrongToken,
    /// A host-to-host route called without a node certificate (403).
    NotANode,
    /// An operator route called without the operator token (403).
    NotAnOperator,
    /// With users: a client certificate that names no user (401).
    NotAUser,
    /// With users: an identity source could not answer now (503).
    SourceUnavailable,
}

impl Refusal {
    /// The metric label.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::NoCredential => "no_credential",
            Refusal::WrongToken => "wrong_token",
            Refusal::NotANode => "not_a_node",
            Refusal::NotAnOperator => "not_an_operator",
            Refusal::NotAUser => "not_a_user",
            Refusal::SourceUnavailable => "identity_source_unavailable",
        }
    }

    /// Counts it, logs it and answers.
    pub fn respond(self, path: &str) -> Response {
        crate::metrics::count_auth_refusal(self.reason());
        tracing::warn!(path, reason = self.reason(), "refused request");
        match self {
            Refusal::NoCredential | Refusal::WrongToken | Refusal::NotAUser => (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "token")],
                "401: missing or wrong token (or client certificate)\n",
            )
                .into_response(),
            Refusal::NotANode => (
                StatusCode::FORBIDDEN,
                "403: a cluster-internal route: only another host of the cluster may call it, with its node certificate\n",
            )
                .into_response(),
            Refusal::NotAnOperator => {
                (StatusCode::FORBIDDEN, "403: an operator route: it needs the operator token\n").into_response()
            }
            Refusal::SourceUnavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "503: the identity source cannot check this credential now; retry\n",
            )
                .into_response(),
        }
    }
}

/// The client certificate the connection's TLS handshake verified, if any.
pub fn client_certificate(req: &Request) -> Option<&ClientCertificate> {
    req.extensions().get::<ConnectInfo<Peer>>().and_then(|ConnectInfo(p)| p.client_cert.as_ref())
}

/// A host-to-host request: the id in [`NODE_HEADER`], proved by a verified client
/// certificate naming `node-<id>`. Tokens count for nothing here.
pub fn node_caller(req: &Request) -> Result<u64, Refusal> {
    let cert = client_certificate(req).ok_or(Refusal::NotANode)?;
    let id = req
        .headers()
        .get(NODE_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .ok_or(Refusal::NotANode)?;
    if cert_names_node(&cert.0, id) {
        Ok(id)
    } else {
        Err(Refusal::NotANode)
    }
}

/// An operator's request: the operator token (a separate secret from the users' token).
/// `expected` `None`: no operator token is configured, so operator routes are closed,
/// except on the token-less dev API (`open_api`).
pub fn check_operator(expected: Option<&str>, open_api: bool, req: &Request) -> Result<(), Refusal> {
    let Some(expected) = expected else {
        return if open_api { Ok(()) } else { Err(Refusal::NotAnOperator) };
    };
    match presented_token(req) {
        Some(t) if token_matches(&t, expected) => Ok(()),
        _ => Err(Refusal::NotAnOperator),
    }
}

/// The credential a request presents, taken out of it (so the check may wait on an
/// identity source without holding the request).
#[derive(Debug, Clone)]
pub struct Presented {
    /// The token (header or `?token=`).
    pub token: Option<String>,
    /// The client certificate the handshake verified.
    pub cert: Option<ClientCertificate>,
    /// The host the request proves it is (node certificate and [`NODE_HEADER`]).
    pub node: Option<u64>,
}

impl Presented {
    /// What `req` presents.
    pub fn of(req: &Request) -> Self {
        Self { token: presented_token(req), cert: client_certificate(req).cloned(), node: node_caller(req).ok() }
    }
}

/// What a host checks, from its config: the users' token, the operator token, and whether
/// host-to-host calls must prove a node certificate.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    /// The users' API token (`None`: the token-less loopback dev API).
    pub token: Option<String>,
    /// The operator token (`http.operator_token_file`).
    pub operator_token: Option<String>,
    /// The listener verifies client certificates (`http.tls.client_ca`): host-to-host
    /// routes take only a node certificate. Without it (no certificates to check) they take
    /// the operator token, never the users' credential.
    pub node_certificates: bool,
    /// `[auth]`'s users (`None`: no users; callers are anonymous as before).
    pub authenticator: Option<Arc<Authenticator>>,
}

impl Credentials {
    /// The API is open to whoever reaches it: no token and no users (loopback dev mode).
    pub fn open_api(&self) -> bool {
        self.token.is_none() && self.authenticator.is_none()
    }

    /// Who calls a users' route (see the module's summary).
    pub async fn caller(&self, presented: Presented) -> Result<Caller, Refusal> {
        let operator = |t: &str| self.operator_token.as_deref().is_some_and(|o| token_matches(t, o));
        let Some(auth) = &self.authenticator else {
            if presented.token.as_deref().is_some_and(operator) {
                return Ok(Caller::Operator);
            }
            return match (self.token.as_deref(), presented.token.as_deref()) {
                (None, _) => Ok(Caller::Anonymous),
                (Some(expected), Some(t)) if token_matches(t, expected) => Ok(Caller::Anonymous),
                // A wrong token is refused even with a certificate: the client meant the token.
                (Some(_), Some(_)) => Err(Refusal::WrongToken),
                (Some(_), None) if presented.cert.is_some() => Ok(Caller::Anonymous),
                (Some(_), None) => Err(Refusal::NoCredential),
            };
        };
        if let Some(t) = presented.token.as_deref() {
            if operator(t) {
                return Ok(Caller::Operator);
            }
            // The shared users' token names nobody: with users it is refused like any other.
            return match auth.identify(Some(t), None).await {
                Ok(Some(user)) => Ok(Caller::User(user)),
                Ok(None) | Err(AuthError::Refused(_)) => Err(Refusal::WrongToken),
                Err(AuthError::Unavailable(why)) => {
                    tracing::warn!(%why, "identity source unavailable");
                    Err(Refusal::SourceUnavailable)
                }
            };
        }
        if let Some(node) = presented.node {
            return Ok(Caller::Host(node));
        }
        let Some(cert) = presented.cert else { return Err(Refusal::NoCredential) };
        match auth.identify(None, Some(&cert.0)).await {
            Ok(Some(user)) => Ok(Caller::User(user)),
            Ok(None) | Err(AuthError::Refused(_)) => Err(Refusal::NotAUser),
            Err(AuthError::Unavailable(_)) => Err(Refusal::SourceUnavailable),
        }
    }

    /// A host-to-host route.
    pub fn node(&self, req: &Request) -> Result<(), Refusal> {
        if self.node_certificates {
            node_caller(req).map(drop)
        } else {
            self.operator(req)
        }
    }

    /// An operator route (membership, drain, re-placement).
    pub fn operator(&self, req: &Request) -> Result<(), Refusal> {
        check_operator(self.operator_token.as_deref(), self.open_api(), req)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use sha2::{Digest, Sha256};

    use super::*;
    use crate::users::file::UsersFile;

    const SHARED: &str = "shared-token-0123456789";
    const OPERATOR: &str = "operator-token-0123456789";
    const ALICE: &str = "alice-token-0123456789";

    fn presented(token: Option<&str>) -> Presented {
        Presented { token: token.map(str::to_owned), cert: None, node: None }
    }

    fn with_users() -> Credentials {
        let text = format!(
            "[[user]]\nname = \"alice\"\ntoken_sha256 = \"{}\"\ngroups = [\"admins\"]\n",
            hex::encode(Sha256::digest(ALICE.as_bytes()))
        );
        let file = Arc::new(UsersFile::parse(&text, Path::new("users.toml")).expect("users"));
        Credentials {
            token: Some(SHARED.into()),
            operator_token: Some(OPERATOR.into()),
            node_certificates: true,
            authenticator: Some(Arc::new(Authenticator::new(vec![file.clone()], Some(file), Some("admins".into())))),
        }
    }

    #[tokio::test]
    async fn with_users_a_token_names_a_user_and_the_shared_token_nobody() {
        let c = with_users();
        let alice = c.caller(presented(Some(ALICE))).await.expect("alice");
        assert_eq!(alice.owner(), Some("alice"));
        assert!(alice.sees_every_kernel(), "in the admin group");
        assert_eq!(c.caller(presented(Some(OPERATOR))).await, Ok(Caller::Operator));
        assert_eq!(c.caller(presented(Some(SHARED))).await, Err(Refusal::WrongToken), "the shared token");
        let hash = hex::encode(Sha256::digest(ALICE.as_bytes()));
        assert_eq!(c.caller(presented(Some(&hash))).await, Err(Refusal::WrongToken), "the hash");
        assert_eq!(c.caller(presented(None)).await, Err(Refusal::NoCredential));
        let node = Presented { node: Some(2), ..presented(None) };
        assert_eq!(c.caller(node).await, Ok(Caller::Host(2)));
        assert!(!c.open_api(), "users close the API even without a shared token");
        let no_token = Credentials { token: None, ..with_users() };
        assert!(!no_token.open_api());
        assert_eq!(no_token.caller(presented(None)).await, Err(Refusal::NoCredential));
    }

    #[tokio::test]
    async fn without_users_the_shared_token_is_everyone() {
        let c = Credentials { authenticator: None, ..with_users() };
        assert_eq!(c.caller(presented(Some(SHARED))).await, Ok(Caller::Anonymous));
        assert_eq!(c.caller(presented(Some(OPERATOR))).await, Ok(Caller::Operator));
        assert_eq!(c.caller(presented(Some(ALICE))).await, Err(Refusal::WrongToken));
        let open = Credentials::default();
        assert!(open.open_api());
        assert_eq!(open.caller(presented(None)).await, Ok(Caller::Anonymous));
    }
}
