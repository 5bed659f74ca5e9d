//! Configuration of one store (one process, one node id, many groups).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How the transport protects traffic between nodes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum TransportSecurity {
    /// Mutual TLS: every node presents a certificate signed by `ca_cert` naming `node-<id>`.
    MutualTls {
        /// PEM file of the cluster CA.
        ca_cert: PathBuf,
        /// PEM file of this node's certificate (SAN `node-<id>`, usable for server and client auth).
        cert: PathBuf,
        /// PEM file of this node's private key.
        key: PathBuf,
    },
    /// No encryption and no authentication. Only when the configuration says so explicitly.
    Plaintext,
}

/// Configuration of a [`crate::RaftStore`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// This node's id (non-zero, unique in the cluster). It is also the raft peer id in every group.
    pub node_id: u64,
    /// Directory of the durable log (raft-engine).
    pub data_dir: PathBuf,
    /// Address the transport listens on.
    pub listen: SocketAddr,
    /// Other nodes: id → transport address. More can be added at run time.
    #[serde(default)]
    pub peers: HashMap<u64, SocketAddr>,
    /// Transport protection.
    pub security: TransportSecurity,
    /// Raft tick.
    #[serde(with = "humantime_serde", default = "default_tick")]
    pub tick_interval: Duration,
    /// Election timeout in ticks (randomised in `[n, 2n)` by raft).
    #[serde(default = "default_election_ticks")]
    pub election_ticks: usize,
    /// Heartbeat interval in ticks.
    #[serde(default = "default_heartbeat_ticks")]
    pub heartbeat_ticks: usize,
    /// Ticks without activity after which a group hibernates (stops ticking). 0 disables hibernation.
    #[serde(default = "default_hibernate_after_ticks")]
    pub hibernate_after_ticks: u32,
    /// Take a state-machine snapshot and compact the log after this many applied entries.
    #[serde(default = "default_snapshot_interval")]
    pub snapshot_interval: u64,
    /// Largest transport frame accepted or sent, in bytes (also caps snapshots).
    #[serde(default = "default_max_frame_bytes")]
    pub max_frame_bytes: usize,
    /// Per-peer outbound queue depth (messages); beyond it messages are dropped and raft retries.
    #[serde(default = "default_peer_queue")]
    pub peer_queue_depth: usize,
    /// fsync the log once per loop iteration (turn off only for benchmarks that say so).
    #[serde(default = "default_true")]
    pub sync_log: bool,
    /// Default deadline of a call.
    #[serde(with = "humantime_serde", default = "default_request_timeout")]
    pub request_timeout: Duration,
}

fn default_tick() -> Duration {
    Duration::from_millis(100)
}
fn default_election_ticks() -> usize {
    10
}
fn default_heartbeat_ticks() -> usize {
    2
}
fn default_hibernate_after_ticks() -> u32 {
    30
}
fn default_snapshot_interval() -> u64 {
    10_000
}
fn default_max_frame_bytes() -> usize {
    16 << 20
}
fn default_peer_queue() -> usize {
    4096
}
fn default_true() -> bool {
    true
}
fn default_request_timeout() -> Duration {
    Duration::from_secs(5)
}

impl StoreConfig {
    /// A configuration with defaults for everything but identity, directory, address and security.
    pub fn new(node_id: u64, data_dir: PathBuf, listen: SocketAddr, security: TransportSecurity) -> Self {
        StoreConfig {
            node_id,
            data_dir,
            listen,
            peers: HashMap::new(),
            security,
            tick_interval: default_tick(),
            election_ticks: default_election_ticks(),
            heartbeat_ticks: default_heartbeat_ticks(),
            hibernate_after_ticks: default_hibernate_after_ticks(),
            snapshot_interval: default_snapshot_interval(),
            max_frame_bytes: default_max_frame_bytes(),
            peer_queue_depth: default_peer_queue(),
            sync_log: true,
            request_timeout: default_request_timeout(),
        }
    }

    /// The election timeout (lower bound) as a duration.
    pub fn election_timeout(&self) -> Duration {
        self.tick_interval * u32::try_from(self.election_ticks).unwrap_or(u32::MAX)
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.node_id == 0 {
            return Err(Error::Config("node_id must be non-zero".into()));
        }
        if self.peers.contains_key(&self.node_id) {
            return Err(Error::Config(format!("peers must not list this node ({})", self.node_id)));
        }
        if self.heartbeat_ticks == 0 || self.election_ticks <= self.heartbeat_ticks {
            return Err(Error::Config("need 0 < heartbeat_ticks < election_ticks".into()));
        }
        if self.tick_interval.is_zero() {
            return Err(Error::Config("tick_interval must be positive".into()));
        }
        if self.max_frame_bytes < 4096 {
            return Err(Error::Config("max_frame_bytes must be at least 4096".into()));
        }
        if self.peer_queue_depth == 0 {
            return Err(Error::Config("peer_queue_depth must be positive".into()));
        }
        Ok(())
    }
}
