//! `[observer]`: the GPU activity observer.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Which mechanism observes GPU activity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ObserverMode {
    /// eBPF when it can be loaded, else procfs (logged and exported as a metric).
    Auto,
    /// eBPF only; refuse to start if it cannot be loaded.
    Ebpf,
    /// procfs and the shim's own counters only.
    Procfs,
}

/// `[observer]`: the GPU activity observer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ObserverConfig {
    /// Which mechanism to use.
    pub mode: ObserverMode,
    /// Driver libraries to attach uprobes to; empty means discover (`ldconfig -p`).
    pub probe_libraries: Vec<PathBuf>,
}

impl Default for ObserverConfig {
    fn default() -> Self {
        Self { mode: ObserverMode::Auto, probe_libraries: Vec::new() }
    }
}
