//! What a front-end kernel knows of its cells: the last executor, the cell being elected
//! or executed, and which replica host each recent request went to (for its IOPub and
//! replies); [`ExecutionInfo`] is what the kernel model shows of it.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

/// Request ids remembered per kernel to route late IOPub (bounded).
const MAX_ROUTED: usize = 4096;

/// A front-end kernel's knowledge of its cells.
#[derive(Default)]
pub(super) struct State {
    /// The kernel's last executor (replica number, node).
    pub(super) last_executor: Option<(u32, u64)>,
    /// The cell being elected or executed.
    pub(super) current: Option<Current>,
    /// Which node each recent request (cell or other) went to, for IOPub and replies.
    pub(super) routed: HashMap<String, u64>,
    routed_order: VecDeque<String>,
    /// Cells executed through this front-end.
    pub(super) executed: u64,
    /// The front-end was closed.
    pub(super) closed: bool,
}

/// The cell being elected or executed.
pub(super) struct Current {
    /// Its msg_id.
    pub(super) msg_id: String,
    /// Its election round.
    pub(super) round: u32,
    /// The host executing it, once known.
    pub(super) executor: Option<u64>,
    /// When this gateway got it.
    pub(super) submitted: Instant,
}

impl State {
    /// Remembers that request `msg_id` went to `node` (bounded: the oldest are forgotten).
    pub(super) fn route(&mut self, msg_id: &str, node: u64) {
        if self.routed.insert(msg_id.to_owned(), node).is_none() {
            self.routed_order.push_back(msg_id.to_owned());
        }
        while self.routed_order.len() > MAX_ROUTED {
            if let Some(old) = self.routed_order.pop_front() {
                self.routed.remove(&old);
            }
        }
    }
}

/// The execution facts of a front-end kernel (in the cluster kernel model).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExecutionInfo {
    /// Replica number of the last executor seen by this front-end.
    pub last_executor_replica: Option<u32>,
    /// Its host.
    pub last_executor_node: Option<u64>,
    /// The cell being elected or executed (msg id), and its round.
    pub current_cell: Option<String>,
    /// Round of the current cell.
    pub current_round: Option<u32>,
    /// Host executing the current cell, once known.
    pub current_executor_node: Option<u64>,
    /// Cells executed through this host's front-end.
    pub cells_executed: u64,
    /// Replica hosts whose internal WebSocket is connected.
    pub connected_nodes: Vec<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routed_requests_are_bounded() {
        let mut s = State::default();
        for i in 0..(MAX_ROUTED + 10) {
            s.route(&format!("m{i}"), 1);
        }
        assert_eq!(s.routed.len(), MAX_ROUTED);
        assert!(!s.routed.contains_key("m0"));
        assert_eq!(s.routed.get(&format!("m{}", MAX_ROUTED + 9)), Some(&1));
    }
}
