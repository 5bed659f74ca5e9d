//! Where another host serves its replicas to this one: the internal routes
//! (`/internal/v1/replicas/{kernel_id}/…`, the gateway's `internal_router`), or the legacy
//! `/api/kernels/{kernel_id}/…?replica=local` form of hosts that predate them.
//!
//! Rolling upgrade: a host tries the internal route first. An old host has no such route
//! and answers 404 without [`INTERNAL_MARKER`] (every answer of the internal router
//! carries it, a "no such kernel" 404 included), so the host falls back to the legacy
//! form and remembers that peer, by URL, for [`LEGACY_RECHECK`]: then it tries the internal
//! route again, so a peer upgraded meanwhile is reached the new way without a restart here.
//! Remove the fallback (and the gateway's `legacy_replica_query`) in the release after the
//! next one (docs/cluster.md, "Ports").

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long a peer found to predate the internal routes is called the legacy way before the
/// internal route is tried again.
pub const LEGACY_RECHECK: Duration = Duration::from_secs(300);

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

/// Peers found to predate the internal routes, by URL, with when that was found.
static LEGACY_PEERS: Mutex<Option<HashMap<String, Instant>>> = Mutex::new(None);

/// False while `url`'s host is known to predate the internal routes (found less than
/// [`LEGACY_RECHECK`] ago).
pub fn speaks_internal(url: &str) -> bool {
    speaks_internal_at(url, Instant::now())
}

fn speaks_internal_at(url: &str, now: Instant) -> bool {
    let peers = LEGACY_PEERS.lock().unwrap_or_else(PoisonError::into_inner);
    let found = peers.as_ref().and_then(|p| p.get(url.trim_end_matches('/')).copied());
    found.is_none_or(|at| now.saturating_duration_since(at) >= LEGACY_RECHECK)
}

/// Remembers that `url`'s host predates the internal routes (as of now).
pub fn remember_legacy(url: &str) {
    remember_legacy_at(url, Instant::now());
}

fn remember_legacy_at(url: &str, now: Instant) {
    let mut peers = LEGACY_PEERS.lock().unwrap_or_else(PoisonError::into_inner);
    let known = peers.get_or_insert_with(HashMap::new).insert(url.trim_end_matches('/').to_owned(), now);
    if known.is_none() {
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

    #[test]
    fn an_old_peer_is_tried_the_new_way_again_after_the_recheck_period() {
        let url = "http://upgraded-later.test:1";
        let t0 = Instant::now();
        remember_legacy_at(url, t0);
        assert!(!speaks_internal_at(url, t0 + LEGACY_RECHECK - Duration::from_secs(1)));
        assert!(speaks_internal_at(url, t0 + LEGACY_RECHECK), "an upgraded peer is reached by its internal routes");
        // Still old: a new 404 without the marker renews the memory.
        remember_legacy_at(url, t0 + LEGACY_RECHECK);
        assert!(!speaks_internal_at(url, t0 + LEGACY_RECHECK + Duration::from_secs(1)));
    }
}
