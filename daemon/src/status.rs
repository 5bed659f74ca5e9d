//! What `GET /api/v1/status` returns and `nbos status` prints.

use serde::{Deserialize, Serialize};

use crate::gpu::Inventory;
use crate::lease::FencedGpu;

/// The state of one host, as served to operators.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// Host name.
    pub node: String,
    /// Daemon version.
    pub version: String,
    /// Seconds since the daemon started.
    pub uptime_s: u64,
    /// True when started with `--dev`.
    pub dev: bool,
    /// The HTTP base URL.
    pub url: String,
    /// Durable state directory.
    pub state_dir: String,
    /// Whether the API requires a token.
    pub auth: bool,
    /// GPU inventory.
    pub inventory: Inventory,
    /// Number of kernels hosted.
    pub kernels: u64,
    /// GPUs not granted because an eviction left a kernel's memory on them (until it is gone).
    #[serde(default)]
    pub fenced_gpus: Vec<FencedGpu>,
}
