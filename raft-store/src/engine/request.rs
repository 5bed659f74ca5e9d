//! Messages into the driving loop, and what comes back.

use raft::eraftpb::Message;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::error::Result;
use crate::state_machine::{Command, CommandOutput, KeyValue, WatchEvent};

/// A read.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Query {
    Get { key: Vec<u8> },
    Range { prefix: Vec<u8>, limit: usize },
}

/// The answer to a read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadOutput {
    /// The matching keys (at most one for a get).
    pub kvs: Vec<KeyValue>,
    /// The log index the read reflects.
    pub applied_index: u64,
    /// True when served from local state without confirming leadership (may be behind).
    pub stale: bool,
}

/// One membership change; several together form a joint-consensus change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "node", rename_all = "snake_case")]
pub enum MembershipChange {
    /// Add a non-voting member that receives the log.
    AddLearner(u64),
    /// Add a voter (or promote a learner).
    AddVoter(u64),
    /// Remove a member.
    Remove(u64),
}

/// Current membership of a group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Membership {
    /// Voters.
    pub voters: Vec<u64>,
    /// Voters of the outgoing configuration while in joint consensus (empty otherwise).
    pub voters_outgoing: Vec<u64>,
    /// Learners.
    pub learners: Vec<u64>,
}

/// A snapshot of a group's raft state on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupStatus {
    /// Group id.
    pub group: u64,
    /// This node.
    pub node: u64,
    /// "leader", "follower", "candidate" or "pre_candidate".
    pub role: String,
    /// The leader as far as this node knows.
    pub leader: Option<u64>,
    /// Current term.
    pub term: u64,
    /// Commit index.
    pub commit: u64,
    /// Applied index.
    pub applied: u64,
    /// Last log index.
    pub last_index: u64,
    /// Index of the latest snapshot (log compacted up to it).
    pub snapshot_index: u64,
    /// Membership.
    pub membership: Membership,
    /// True while the group is hibernating (not ticking).
    pub hibernating: bool,
}

/// Requests addressed to one group.
pub(crate) enum GroupRequest {
    Propose { cmd: Command, reply: oneshot::Sender<Result<CommandOutput>> },
    Read { query: Query, linearizable: bool, reply: oneshot::Sender<Result<ReadOutput>> },
    ChangeMembership { changes: Vec<MembershipChange>, reply: oneshot::Sender<Result<Membership>> },
    TransferLeader { to: u64, reply: oneshot::Sender<Result<()>> },
    LeaseKeepAlive { id: u64, reply: oneshot::Sender<Result<u64>> },
    Watch { prefix: Vec<u8>, from_revision: u64, tx: mpsc::Sender<WatchEvent>, reply: oneshot::Sender<Result<u64>> },
    Status { reply: oneshot::Sender<Result<GroupStatus>> },
}

/// Control messages (from the API).
pub(crate) enum Control {
    Group { group: u64, req: GroupRequest },
    Create { group: u64, voters: Vec<u64>, join: bool, reply: oneshot::Sender<Result<()>> },
    Destroy { group: u64, reply: oneshot::Sender<Result<()>> },
    ListGroups { reply: oneshot::Sender<Vec<u64>> },
    Shutdown,
}

/// Network input (from the transport).
pub(crate) enum Inbound {
    Raft { group: u64, msg: Message },
    PeerConnected { peer: u64 },
}
