//! `[limits]`: caps on what API clients may make the daemon hold.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::auth::{GroupLimits, Quota};

/// `[limits]`: caps on what API clients may make the daemon hold; a request over one is
/// refused with an error naming the key, and counted in `notebookos_refused_total`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Largest WebSocket message a client may send, bytes.
    pub websocket_max_message_bytes: usize,
    /// Bytes of client WebSocket messages being decoded and forwarded at once, all sockets
    /// of the host together; a message that finds no room within a few seconds closes its socket.
    pub websocket_inflight_bytes: usize,
    /// Messages queued to one WebSocket client before it is disconnected as stuck.
    pub websocket_queued_messages: usize,
    /// Open WebSocket connections to one kernel.
    pub websocket_connections_per_kernel: usize,
    /// Open WebSocket connections in all.
    pub websocket_connections: usize,
    /// Shell and control requests of one WebSocket connection awaiting their reply.
    pub pending_requests_per_connection: usize,
    /// Kernels created through one credential (today: the API token) that exist at once.
    pub kernels_per_token: usize,
    /// Kernels that exist at once (on this host; in the cluster in cluster mode).
    pub kernels: usize,
    /// Every user's quota (a users-file entry's own quota replaces it key by key).
    pub user: Quota,
    /// Groups' quotas (their members together) and fair-share weights, by group name.
    pub groups: BTreeMap<String, GroupLimits>,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            // Jupyter Server's (Tornado's) default websocket_max_message_size.
            websocket_max_message_bytes: 10 << 20,
            websocket_inflight_bytes: 128 << 20,
            websocket_queued_messages: 4096,
            websocket_connections_per_kernel: 64,
            websocket_connections: 1024,
            pending_requests_per_connection: 1024,
            kernels_per_token: 256,
            kernels: 1024,
            user: Quota::default(),
            groups: BTreeMap::new(),
        }
    }
}
