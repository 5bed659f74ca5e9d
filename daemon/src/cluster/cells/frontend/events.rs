//! What flows into a front-end kernel's cell worker: the clients' cells, and what the
//! replica links hear (election outcomes, replies, starts, links up and down).

use std::time::Instant;

use crate::cluster::control::records::{ElectionRecord, RunningRecord};
use crate::jupyter::Message;

/// What the cell worker hears from the replica links.
#[derive(Debug)]
pub(super) enum Event {
    /// The designee's election outcome for `cell` (`running`: the kernel's lock, on `busy`).
    Outcome { cell: String, node: u64, outcome: String, record: Option<ElectionRecord>, running: Option<RunningRecord> },
    /// The executor's final reply for `cell`.
    Executed { cell: String, node: u64, reply: Message },
    /// `node` produced the first IOPub of `cell`: it executes it.
    Started { cell: String },
    /// A link connected or dropped.
    Link { node: u64, up: bool },
}

/// A cell waiting for its turn.
pub(super) struct Cell {
    /// The client's `execute_request`.
    pub(super) request: Message,
    /// Its msg_id: the cell's id in the election.
    pub(super) msg_id: String,
    /// When this gateway got it.
    pub(super) submitted: Instant,
}
