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
    /// An atomic multi-key transaction (appended last: the log's encoding of the older variants
    /// stays as it was).
    Txn(Txn),
}

impl Command {
    /// Bytes of keys and values the command carries (its log entry is a little larger).
    pub fn payload_len(&self) -> usize {
        let op_len = |op: &TxnOp| match op {
            TxnOp::Put { key, value, .. } => key.len() + value.len(),
            TxnOp::Delete { key } => key.len(),
            TxnOp::DeletePrefix { prefix } => prefix.len(),
        };
        match self {
            Command::Put { key, value, .. } => key.len() + value.len(),
            Command::Delete { key } => key.len(),
            Command::Cas { key, expected, value } => key.len() + value.len() + expected.as_ref().map_or(0, Vec::len),
            Command::LeaseGrant { .. } | Command::LeaseRevoke { .. } => 0,
            Command::Txn(t) => {
                let compares: usize = t
                    .compares
                    .iter()
                    .map(|c| {
                        c.key.len()
                            + match &c.target {
                                CompareTarget::ValueEquals(v) => v.len(),
                                _ => 0,
                            }
                    })
                    .sum();
                compares + t.success.iter().chain(&t.failure).map(op_len).sum::<usize>()
            }
        }
    }
}

/// An atomic multi-key transaction, etcd style: if every compare holds, apply `success`, else
/// `failure`. The whole transaction is one log entry, so its changes share one revision.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Txn {
    /// Conditions on the current state; all must hold (an empty list holds).
    pub compares: Vec<Compare>,
    /// Operations applied, in order, when every compare holds.
    pub success: Vec<TxnOp>,
    /// Operations applied, in order, otherwise.
    pub failure: Vec<TxnOp>,
}

impl Txn {
    /// An empty transaction (no compares: `success` applies).
    pub fn new() -> Self {
        Txn::default()
    }

    /// Adds a compare.
    pub fn when(mut self, compare: Compare) -> Self {
        self.compares.push(compare);
        self
    }

    /// Adds an operation to the success branch.
    pub fn and_then(mut self, op: TxnOp) -> Self {
        self.success.push(op);
        self
    }

    /// Adds an operation to the failure branch.
    pub fn or_else(mut self, op: TxnOp) -> Self {
        self.failure.push(op);
        self
    }
}

/// One condition of a [`Txn`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compare {
    /// The key compared.
    pub key: Vec<u8>,
    /// What the key must be.
    pub target: CompareTarget,
}

impl Compare {
    /// The key's value equals `value` (an absent key never equals anything).
    pub fn value_equals(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        Compare { key: key.into(), target: CompareTarget::ValueEquals(value.into()) }
    }

    /// The key does not exist.
    pub fn absent(key: impl Into<Vec<u8>>) -> Self {
        Compare { key: key.into(), target: CompareTarget::Absent }
    }

    /// The key exists (any value).
    pub fn present(key: impl Into<Vec<u8>>) -> Self {
        Compare { key: key.into(), target: CompareTarget::Present }
    }
}

/// What a [`Compare`] checks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareTarget {
    /// The key exists with exactly this value.
    ValueEquals(Vec<u8>),
    /// The key does not exist.
    Absent,
    /// The key exists.
    Present,
}

/// One operation of a [`Txn`] branch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnOp {
    /// Set a key, optionally attached to a lease.
    Put {
        /// Key.
        key: Vec<u8>,
        /// Value.
        value: Vec<u8>,
        /// Lease to attach the key to (it must exist, or the whole transaction is refused).
        lease: Option<u64>,
    },
    /// Remove a key.
    Delete {
        /// Key.
        key: Vec<u8>,
    },
    /// Remove every key starting with `prefix`.
    DeletePrefix {
        /// Prefix.
        prefix: Vec<u8>,
    },
}

impl TxnOp {
    /// A put without a lease.
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        TxnOp::Put { key: key.into(), value: value.into(), lease: None }
    }

    /// A put attached to a lease.
    pub fn put_with_lease(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, lease: u64) -> Self {
        TxnOp::Put { key: key.into(), value: value.into(), lease: Some(lease) }
    }

    /// A delete.
    pub fn delete(key: impl Into<Vec<u8>>) -> Self {
        TxnOp::Delete { key: key.into() }
    }

    /// A delete of every key under a prefix.
    pub fn delete_prefix(prefix: impl Into<Vec<u8>>) -> Self {
        TxnOp::DeletePrefix { prefix: prefix.into() }
    }
}

/// What one applied [`TxnOp`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnOpResult {
    /// Put done.
    Put,
    /// Delete done; whether the key existed.
    Delete {
        /// The key existed.
        existed: bool,
    },
    /// Prefix delete done; how many keys went.
    DeletePrefix {
        /// Keys removed.
        deleted: u64,
    },
}

/// The outcome of a [`Txn`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnResponse {
    /// Whether every compare held (`success` was applied) or not (`failure` was).
    pub succeeded: bool,
    /// One result per operation of the branch applied, in order.
    pub results: Vec<TxnOpResult>,
    /// The revision (log index) of the transaction; its changes all carry it.
    pub revision: u64,
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
    /// Transaction evaluated and its branch applied.
    Txn(TxnResponse),
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
