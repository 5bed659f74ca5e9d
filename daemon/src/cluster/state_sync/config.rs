//! [`SyncConfig`]: namespace sync settings (from `[cluster]`).

use std::path::PathBuf;
use std::time::Duration;

/// Namespace sync settings (from `[cluster]`).
#[derive(Debug, Clone)]
pub struct SyncConfig {
    /// Payloads up to this size go through the raft log (`cluster.sync_inline_max_bytes`).
    pub inline_max_bytes: u64,
    /// Scratch space for manifest directories (under the state directory).
    pub work_dir: PathBuf,
    /// How long one export or apply may take in the kernel.
    pub kernel_timeout: Duration,
    /// Election records kept per kernel group (the most recent cells'); older ones are
    /// deleted with each cell's commit. A late proposal can only concern a recent cell:
    /// the front-end sends one kernel's cells in order over one connection per host.
    pub elect_history: usize,
}

impl SyncConfig {
    /// Defaults: 1 MiB inline, 10 minutes per export/apply, 256 election records.
    pub fn new(work_dir: PathBuf) -> Self {
        Self { inline_max_bytes: 1 << 20, work_dir, kernel_timeout: Duration::from_secs(600), elect_history: 256 }
    }
}
