//! [`ClusterError`]: why a cluster call failed, in the words the HTTP answers and the
//! CLI show.

use nbos_sched::placement::PlacementError;

/// How a placement refusal's message begins (a forwarded one arrives as text).
pub const PLACEMENT_REFUSAL: &str = "cannot place the kernel";

/// Why a cluster call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The raft store refused or failed.
    #[error("meta store: {0}")]
    Store(#[from] raft_store::Error),
    /// The kernel cannot be placed.
    #[error("cannot place the kernel: {0}")]
    Placement(#[from] PlacementError),
    /// The meta group has no leader (yet), or the leader cannot be reached.
    #[error("the cluster is not ready: {0}")]
    NotReady(String),
    /// This host is not the meta leader (a forwarded call arrived at a former leader).
    #[error("host {me} is not the meta leader (leader: {leader:?})")]
    NotLeader {
        /// This host.
        me: u64,
        /// The leader this host believes in.
        leader: Option<u64>,
    },
    /// No such kernel.
    #[error("no kernel {0} in the cluster")]
    NoSuchKernel(String),
    /// The request contradicts the cluster's state.
    #[error("{0}")]
    Conflict(String),
    /// The request is malformed.
    #[error("{0}")]
    BadRequest(String),
    /// Another host answered a forwarded call with an error.
    #[error("host at {url} answered HTTP {status}: {message}")]
    Remote {
        /// The host's URL.
        url: String,
        /// HTTP status.
        status: u16,
        /// Its error message.
        message: String,
    },
}

/// Result of cluster calls.
pub type Result<T, E = ClusterError> = std::result::Result<T, E>;
