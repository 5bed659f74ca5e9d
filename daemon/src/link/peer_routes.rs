//! Where another host serves its replicas to this one: the internal routes
//! (`/internal/v1/replicas/{kernel_id}/…`, the gateway's `internal_router`), or the legacy
//! `/api/kernels/{kernel_id}/…?replica=local` form of hosts that predate them.
//!
//! Rolling upgrade: a host tries the internal route first. An old host has no such route
//! and answers 404 without [`INTERNAL_MARKER`] (every answer of the internal router
//! carries it, a "no such kernel" 404 included), so the host falls back to the legacy
//! form and remembers that peer, by URL, for the life of the process. Remove the fallback
//! (and the gateway's `legacy_replica_query`) one release after the internal routes.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

/// Prefix of the internal routes.
pub const INTERNAL_PREFIX: &str = "/internal/v1/replicas";

/// Header on every answer of the internal router: a 404 without it comes from a host that
/// has no internal routes.
pub const INTERNAL_MARKER: &str = "x-nbos-internal-route";

/// A host-to-host call on a peer's replica of a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaCall {
    /// The replica's channels (WebSocket).
    Channels,
    /// Interrupt the replica's kernel.
    Interrupt,
    /// Restart the replica's kernel.
    Restart,
}

impl ReplicaCall {
    fn name(self) -> &'static str {
        match self {
            ReplicaCall::Channels => "channels",
            ReplicaCall::Interrupt => "interrupt",
            ReplicaCall::Restart => "restart",
        }
    }

    /// Path (and query) of the call on a host with the internal routes.
    pub fn internal_path(self, kernel_id: &str) -> String {
        format!("{INTERNAL_PREFIX}/{kernel_id}/{}", self.name())
    }

    /// Path and query of the call on a host that predates the internal routes.
    pub fn legacy_path(self, kernel_id: &str) -> String {
        format!("/api/kernels/{kernel_id}/{}?replica=local", self.name())
    }
}

static LEGACY_PEERS: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// False once `url`'s host answered an internal route as a host without them.
pub fn speaks_internal(url: &str) -> bool {
    let peers = LEGACY_PEERS.lock().unwrap_or_else(PoisonError::into_inner);
    !peers.as_ref().is_some_and(|p| p.contains(url.trim_end_matches('/')))
}

/// Remembers that `url`'s host predates the internal routes.
pub fn remember_legacy(url: &str) {
    let mut peers = LEGACY_PEERS.lock().unwrap_or_else(PoisonError::into_inner);
    if peers.get_or_insert_with(HashSet::new).insert(url.trim_end_matches('/').to_owned()) {
        tracing::info!(peer = url, "peer has no internal replica routes (an older version): using ?replica=local");
    }
}

/// True when an answer (`status`, whether it carries [`INTERNAL_MARKER`]) to an internal
/// route says the host has no internal routes.
pub fn predates_internal_routes(status: u16, has_marker: bool) -> bool {
    status == 404 && !has_marker
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_of_both_forms() {
        assert_eq!(ReplicaCall::Channels.internal_path("k"), "/internal/v1/replicas/k/channels");
        assert_eq!(ReplicaCall::Interrupt.legacy_path("k"), "/api/kernels/k/interrupt?replica=local");
    }

    #[test]
    fn only_an_unmarked_404_means_an_old_host() {
        assert!(predates_internal_routes(404, false));
        assert!(!predates_internal_routes(404, true), "no such kernel on a new host");
        assert!(!predates_internal_routes(401, false));
    }

    #[test]
    fn peers_are_remembered_by_url() {
        let url = "http://legacy-peer.test:1/";
        assert!(speaks_internal(url));
        remember_legacy(url);
        assert!(!speaks_internal("http://legacy-peer.test:1"));
        assert!(speaks_internal("http://another-peer.test:1"));
    }
}
