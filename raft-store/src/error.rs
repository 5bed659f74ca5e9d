//! Typed errors of the store. Callers match on these (e.g. retry at the hinted leader).

use std::time::Duration;

/// Everything that can go wrong in a store call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// This node is not the leader of the group; `hint` names the leader this node believes in.
    #[error("this node is not the leader of group {group}; leader hint: {hint:?}")]
    NotLeader {
        /// The group.
        group: u64,
        /// The node id of the leader as far as this node knows, if any.
        hint: Option<u64>,
    },
    /// The call did not complete in time; for writes the outcome is unknown.
    #[error("group {group}: no answer within {after:?} (a write may or may not have been applied)")]
    Timeout {
        /// The group.
        group: u64,
        /// How long we waited.
        after: Duration,
    },
    /// The leader lost leadership before the proposal was applied; it may still be applied later.
    #[error("group {group}: leadership changed before the proposal was applied (outcome unknown)")]
    LeadershipLost {
        /// The group.
        group: u64,
    },
    /// A request was to be forwarded to the group's leader, but no connection to that node was up
    /// until the deadline; nothing was proposed.
    #[error("group {group}: leader {leader} was unreachable (no connection) for {after:?}; nothing was proposed")]
    LeaderUnreachable {
        /// The group.
        group: u64,
        /// The node believed to lead the group.
        leader: u64,
        /// How long we tried.
        after: Duration,
    },
    /// A request forwarded to the leader got no answer: the connection broke, or leadership moved
    /// elsewhere, after it was sent. A write may or may not have been applied.
    #[error("group {group}: request forwarded to leader {leader} got no answer ({reason}; a write may or may not have been applied)")]
    ForwardLost {
        /// The group.
        group: u64,
        /// The node the request was forwarded to.
        leader: u64,
        /// What happened.
        reason: &'static str,
    },
    /// The leader answered a forwarded request with an error this node has no variant for.
    #[error("node {node} answered: {kind}: {message}")]
    Remote {
        /// The answering node.
        node: u64,
        /// [`Error::kind`] there.
        kind: String,
        /// Its message.
        message: String,
    },
    /// No such group on this node.
    #[error("group {0} not found on this node")]
    GroupNotFound(u64),
    /// The group already exists on this node.
    #[error("group {0} already exists on this node")]
    GroupExists(u64),
    /// This node's replica of the group hit a broken invariant (the raft library panicked,
    /// e.g. its log was lost while the group still counted it as a member) and was stopped
    /// here; the node's other groups go on. Destroy it and join again to repair.
    #[error("group {group} is stopped on this node: {reason}")]
    GroupFailed {
        /// The group.
        group: u64,
        /// What broke.
        reason: String,
    },
    /// A watch asked for history that is no longer kept.
    #[error("revision {requested} is compacted; the oldest watchable revision is {oldest}")]
    Compacted {
        /// The revision asked for.
        requested: u64,
        /// The oldest revision still available.
        oldest: u64,
    },
    /// The lease does not exist (never granted, revoked or expired).
    #[error("lease {0:#x} not found")]
    LeaseNotFound(u64),
    /// A membership change or leader transfer was refused.
    #[error("membership change refused: {0}")]
    ConfChange(String),
    /// The raft library refused an operation.
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    /// The durable log failed.
    #[error("raft log at {path}: {source}")]
    Log {
        /// Directory of the log.
        path: String,
        /// The failure.
        #[source]
        source: raft_engine::Error,
    },
    /// Encoding or decoding our own records failed (a bug or a corrupt log).
    #[error("corrupt record: {0}")]
    Corrupt(String),
    /// A request argument is out of range; nothing was proposed.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The configuration is not usable.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// TLS material could not be loaded.
    #[error("TLS: {0}")]
    Tls(String),
    /// An I/O operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What we were doing.
        context: String,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// The store's request queue is full; nothing was proposed. Retry later.
    #[error("the raft store is overloaded (request queue full); nothing was proposed")]
    Overloaded,
    /// The store has been shut down.
    #[error("the raft store is shut down")]
    Stopped,
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { context: context.into(), source }
    }

    /// A short stable name of the error kind (used by the node service protocol and metrics).
    pub fn kind(&self) -> &'static str {
        match self {
            Error::NotLeader { .. } => "not_leader",
            Error::Timeout { .. } => "timeout",
            Error::LeadershipLost { .. } => "leadership_lost",
            Error::LeaderUnreachable { .. } => "leader_unreachable",
            Error::ForwardLost { .. } => "forward_lost",
            Error::Remote { .. } => "remote",
            Error::GroupNotFound(_) => "group_not_found",
            Error::GroupExists(_) => "group_exists",
            Error::GroupFailed { .. } => "group_failed",
            Error::Compacted { .. } => "compacted",
            Error::LeaseNotFound(_) => "lease_not_found",
            Error::ConfChange(_) => "conf_change",
            Error::Raft(_) => "raft",
            Error::Log { .. } => "log",
            Error::Corrupt(_) => "corrupt",
            Error::InvalidArgument(_) => "invalid_argument",
            Error::Config(_) => "config",
            Error::Tls(_) => "tls",
            Error::Io { .. } => "io",
            Error::Overloaded => "overloaded",
            Error::Stopped => "stopped",
        }
    }

    /// True when a write that failed with this error may nevertheless have been applied.
    /// `NotLeader`, `LeaderUnreachable`, `Overloaded` and argument errors mean "not proposed".
    pub fn outcome_unknown(&self) -> bool {
        match self {
            Error::Timeout { .. } | Error::LeadershipLost { .. } | Error::ForwardLost { .. } | Error::Stopped => true,
            // An error this node cannot interpret: assume the worst, except for a leader that
            // does not host the group or stopped it (it proposed nothing).
            Error::Remote { kind, .. } => kind != "group_not_found" && kind != "group_failed",
            _ => false,
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
