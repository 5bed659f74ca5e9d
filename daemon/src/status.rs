//! What `GET /api/v1/status` returns and `nbos status` prints.

use serde::{Deserialize, Serialize};

use crate::gpu::Inventory;

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

/// A GPU not granted because an eviction left a process's memory on it (until the
/// memory is gone), as `/api/v1/status` and `nbos status` show it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FencedGpu {
    /// Host index.
    pub index: usize,
    /// The GPU's UUID.
    pub uuid: String,
    /// The process whose memory is on it.
    pub holder_pid: u32,
    /// Its kernel.
    pub kernel_id: String,
    /// Why its eviction failed: `lock_timeout`, `lock_failed`, `checkpoint_failed`, `memory_left`.
    pub reason: String,
    /// Seconds since the GPU was fenced.
    pub fenced_for_s: u64,
}
