//! The lease server's settings ([`LeaseServerConfig`], [`ConnectionLimits`]) and why it
//! could not start ([`LeaseServerError`]).

use std::path::PathBuf;
use std::time::Duration;

use crate::lease::table::Policy;

/// Most connections served at once (one thread each): far above the kernel processes a
/// host runs, low enough that a connection flood cannot exhaust threads.
pub const MAX_CONNECTIONS: usize = 1024;
/// Most connections served at once for one peer uid, so that one local user cannot take
/// every slot. Kernel processes all run as the daemon's uid, so this also bounds the
/// host's legitimate shims: kept well above a host's kernel processes.
pub const MAX_CONNECTIONS_PER_UID: usize = 256;

/// Caps on lease-socket connections served at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// In total.
    pub total: usize,
    /// Per peer uid (`SO_PEERCRED`).
    pub per_uid: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self { total: MAX_CONNECTIONS, per_uid: MAX_CONNECTIONS_PER_UID }
    }
}

/// Settings of the lease server.
#[derive(Debug, Clone)]
pub struct LeaseServerConfig {
    /// The socket path (created; an existing socket file is replaced).
    pub socket: PathBuf,
    /// Idle detection and release.
    pub policy: Policy,
    /// How often shims report activity while bound.
    pub activity_interval: Duration,
    /// Device memory limit per kernel process told to shims, bytes (0: none).
    pub memory_limit_bytes: u64,
    /// The real CUDA driver library told to shims in `Registered` (the kernel's environment
    /// does not name it). At most `nbos_lease_proto::MAX_PATH` bytes (checked at start).
    pub driver_path: PathBuf,
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum LeaseServerError {
    /// Binding the socket failed.
    #[error("cannot listen on lease socket {path}: {source}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Starting a thread failed.
    #[error("cannot start lease server thread: {0}")]
    Thread(std::io::Error),
    /// The driver path cannot be told to shims (not UTF-8 or longer than the protocol's cap).
    #[error("the CUDA driver path {0} cannot be sent to shims: it must be UTF-8 and at most {max} bytes", max = nbos_lease_proto::MAX_PATH)]
    DriverPath(PathBuf),
}
