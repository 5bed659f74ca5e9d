//! [`AppState`]: what every HTTP handler of a host shares.

use std::sync::Arc;
use std::time::Instant;

use crate::gpu::Inventory;
use crate::kernel::Kernels;
use crate::metrics::Metrics;

/// What the HTTP handlers share.
pub struct AppState {
    /// Host name.
    pub node: String,
    /// Base URL clients use.
    pub url: String,
    /// Durable state directory (shown in status).
    pub state_dir: String,
    /// Started with `--dev`.
    pub dev: bool,
    /// When the daemon started.
    pub started: Instant,
    /// The API token; `None` means the API is open (loopback `--dev` only).
    pub token: Option<String>,
    /// Who may call what (users, hosts, operators); its `token` is [`AppState::token`].
    pub credentials: crate::link::credential::Credentials,
    /// GPU inventory.
    pub inventory: Inventory,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The kernels hosted here.
    pub kernels: Arc<Kernels>,
    /// The lease server (hosts with GPUs).
    pub leases: Option<Arc<crate::lease::LeaseServer>>,
    /// `[limits]` and the counters behind them.
    pub limits: Arc<super::limits::Limits>,
    /// `auth.audit_log`.
    pub audit: Option<Arc<crate::users::audit::AuditLog>>,
}
