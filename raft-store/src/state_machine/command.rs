//! Commands proposed to a group and what applying them returns.

use serde::{Deserialize, Serialize};

/// A state-changing command; the log carries these (postcard-encoded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Set `key` to `value`, optionally attached to a lease (deleted when the lease ends).
    Put {
        /// Key.
        key: Vec<u8>,
        /// Value.
        value: Vec<u8>,
        /// Lease to attach the key to.
        lease: Option<u64>,
    },
    /// Remove `key`.
    Delete {
        /// Key.
        key: Vec<u8>,
    },
    /// Set `key` to `value` only if its current value equals `expected` (`None`: key absent).
    Cas {
        /// Key.
        key: Vec<u8>,
        /// The value the key must have now (`None` = must not exist).
        expected: Option<Vec<u8>>,
        /// The new value.
        value: Vec<u8>,
    },
    /// Create lease `id` with a time-to-live.
    LeaseGrant {
        /// Lease id (chosen by the proposer).
        id: u64,
        /// Time to live in milliseconds, counted by the leader.
        ttl_ms: u64,
    },
    /// End lease `id` and delete its keys.
    LeaseRevoke {
        /// Lease id.
        id: u64,
    },
}

/// Result of a CAS.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CasOutcome {
    /// Whether the swap happened.
    pub succeeded: bool,
    /// The value before the command (the value that did not match, when it failed).
    pub previous: Option<Vec<u8>>,
}

/// What applying a command returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandOutput {
    /// Put done.
    Put,
    /// Delete done; whether the key existed.
    Delete {
        /// The key existed.
        existed: bool,
    },
    /// CAS evaluated.
    Cas(CasOutcome),
    /// Lease granted.
    LeaseGranted,
    /// Lease revoked; whether it existed.
    LeaseRevoked {
        /// The lease existed.
        existed: bool,
    },
    /// The command referred to a lease that does not exist; nothing changed.
    LeaseNotFound(u64),
}

/// One stored key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyValue {
    /// Key.
    pub key: Vec<u8>,
    /// Value.
    pub value: Vec<u8>,
    /// Revision (log index) that created the key.
    pub create_revision: u64,
    /// Revision (log index) of the last change.
    pub mod_revision: u64,
    /// Lease the key is attached to.
    pub lease: Option<u64>,
}

/// Kind of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WatchEventKind {
    /// The key was set.
    Put,
    /// The key was removed.
    Delete,
}

/// A committed change, delivered to watchers in revision order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchEvent {
    /// Revision (log index) of the change.
    pub revision: u64,
    /// What happened.
    pub kind: WatchEventKind,
    /// Key.
    pub key: Vec<u8>,
    /// New value (`None` for deletes).
    pub value: Option<Vec<u8>>,
}

/// What travels in a log entry: the command plus who proposed it, to answer the proposer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Proposal {
    pub origin: u64,
    pub request_id: u64,
    pub command: Command,
}
