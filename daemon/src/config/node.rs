//! `[node]`: identity and directories of this host.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `[node]`: identity and directories of this host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeConfig {
    /// Host name in the cluster; empty means the machine's hostname.
    pub name: String,
    /// Durable state (Raft log, snapshots, large objects).
    pub state_dir: PathBuf,
    /// Sockets and other state that does not survive a reboot (the lease socket).
    pub runtime_dir: PathBuf,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            state_dir: PathBuf::from("/var/lib/notebookos"),
            runtime_dir: PathBuf::from("/run/notebookos"),
        }
    }
}
