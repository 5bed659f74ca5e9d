//! How this host authenticates its calls to other hosts' HTTP APIs (forwarded cluster
//! calls, interrupt/restart and the channels of a replica, [`super::peer_routes`]).
//!
//! With an identity ([`set_identity`], done once by `node/cluster.rs` when the host serves HTTPS
//! with a client CA and has a node certificate): TLS with the node certificate and
//! [`NODE_HEADER`] naming this host. Without one (a cluster whose hosts verify no client
//! certificates): the operator token ([`set_fallback_token`]), as the receiving host then
//! expects. The users' token is never sent to another host.
//!
//! One identity per process (a daemon is one host), so the many places that call other
//! hosts need not each carry it.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::credential::NODE_HEADER;

/// This host's identity towards other hosts.
#[derive(Clone)]
pub struct HostIdentity {
    /// This host's cluster node id (its certificate names `node-<id>`).
    pub node_id: u64,
    /// TLS with the cluster CA as roots and the node certificate as client identity.
    pub tls: Arc<rustls::ClientConfig>,
}

static IDENTITY: OnceLock<HostIdentity> = OnceLock::new();
static FALLBACK_TOKEN: OnceLock<String> = OnceLock::new();
static OPERATOR_TOKEN: OnceLock<String> = OnceLock::new();

/// Sets this process's identity (once; later calls are ignored and return false).
pub fn set_identity(identity: HostIdentity) -> bool {
    IDENTITY.set(identity).is_ok()
}

/// The credential of calls to other hosts when this host has no node identity: the
/// operator token (set once by `node/credentials.rs`; later calls are ignored and return false).
pub fn set_fallback_token(operator_token: String) -> bool {
    FALLBACK_TOKEN.set(operator_token).is_ok()
}

/// The operator token this host sends with the membership calls it forwards for an
/// operator (set once by `node/credentials.rs` when `http.operator_token_file` is configured).
pub fn set_operator_token(operator_token: String) -> bool {
    OPERATOR_TOKEN.set(operator_token).is_ok()
}

/// This process's identity, when it has one.
pub fn identity() -> Option<&'static HostIdentity> {
    IDENTITY.get()
}

/// An HTTP agent for calls to other hosts.
pub fn agent(timeout: Duration) -> ureq::Agent {
    let builder = ureq::AgentBuilder::new().timeout(timeout);
    match identity() {
        Some(id) => builder.tls_config(id.tls.clone()).build(),
        None => builder.build(),
    }
}

/// Adds this host's credential to a call to another host.
pub fn authorize(req: ureq::Request) -> ureq::Request {
    match (identity(), FALLBACK_TOKEN.get()) {
        (Some(id), _) => req.set(NODE_HEADER, &id.node_id.to_string()),
        (None, Some(t)) => req.set("Authorization", &format!("token {t}")),
        (None, None) => req,
    }
}

/// Adds this host's credential and the operator token to a call this host forwards for an
/// operator (membership): the receiver checks both, so a node key alone cannot change the
/// cluster. Without a node identity the host's credential is the operator token already.
pub fn authorize_as_operator(req: ureq::Request) -> ureq::Request {
    let req = authorize(req);
    match (identity(), OPERATOR_TOKEN.get()) {
        (Some(_), Some(t)) => req.set("Authorization", &format!("token {t}")),
        _ => req,
    }
}

/// A gateway client for another host's API, with this host's credential.
pub fn gateway_client(url: &str) -> super::client::GatewayClient {
    match identity() {
        Some(id) => super::client::GatewayClient::new(url, None).with_tls(id.tls.clone()).as_node(id.node_id),
        None => super::client::GatewayClient::new(url, FALLBACK_TOKEN.get().cloned()),
    }
}
