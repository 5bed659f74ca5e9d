//! Who may call what on a host's HTTP API, decided from one request:
//!
//! - **users** (the Jupyter API, the operator's read-only views): the API token, *or* a
//!   client certificate the TLS handshake verified against `http.tls.client_ca` (that is
//!   how jupyter_server's `GatewayKernelClient` authenticates its channels WebSocket, which
//!   it opens without headers);
//! - **hosts** (cluster-internal routes): a verified certificate naming `node-<id>`
//!   (see [`node_caller`]); the users' token is refused there;
//! - **operators** (membership, drain, re-placement): the operator token.
//!
//! Every refusal is counted in `notebookos_http_auth_refusals_total{reason}`.

use axum::extract::{ConnectInfo, Request};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::tls::{cert_names_node, ClientCertificate, Peer};
use super::token::{presented_token, token_matches};

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
}

impl Refusal {
    /// The metric label.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::NoCredential => "no_credential",
            Refusal::WrongToken => "wrong_token",
            Refusal::NotANode => "not_a_node",
            Refusal::NotAnOperator => "not_an_operator",
        }
    }

    /// Counts it, logs it and answers.
    pub fn respond(self, path: &str) -> Response {
        crate::metrics::count_auth_refusal(self.reason());
        tracing::warn!(path, reason = self.reason(), "refused request");
        match self {
            Refusal::NoCredential | Refusal::WrongToken => (
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
        }
    }
}

/// The client certificate the connection's TLS handshake verified, if any.
pub fn client_certificate(req: &Request) -> Option<&ClientCertificate> {
    req.extensions().get::<ConnectInfo<Peer>>().and_then(|ConnectInfo(p)| p.client_cert.as_ref())
}

/// A user's request: the API token or a verified client certificate. `expected` `None`
/// is the token-less loopback API (dev mode): everyone is a user.
pub fn check_user(expected: Option<&str>, req: &Request) -> Result<(), Refusal> {
    let Some(expected) = expected else { return Ok(()) };
    match presented_token(req) {
        Some(t) if token_matches(&t, expected) => Ok(()),
        // A wrong token is refused even with a certificate: the client meant the token.
        Some(_) => Err(Refusal::WrongToken),
        None if client_certificate(req).is_some() => Ok(()),
        None => Err(Refusal::NoCredential),
    }
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
}

impl Credentials {
    /// A users' route.
    pub fn user(&self, req: &Request) -> Result<(), Refusal> {
        check_user(self.token.as_deref(), req)
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
        check_operator(self.operator_token.as_deref(), self.token.is_none(), req)
    }
}
