//! The event queue of virtual time: a binary heap ordered by (time, insertion
//! sequence), so events at the same millisecond run in the order they were scheduled
//! and every run of a seed takes the same path.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::Millis;

/// What happens. Indices are into the workload's sessions and the cluster's hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Ev {
    /// A session (notebook kernel) starts.
    SessionStart(u32),
    /// The session's next training is submitted.
    Submit(u32),
    /// The session's running training ends on this host.
    TrainingEnd {
        /// Session.
        session: u32,
        /// Host it ran on.
        host: u32,
    },
    /// The session is shut down.
    SessionStop(u32),
    /// A provisioned host is up.
    HostUp(u32),
    /// A container (or a session's replicas) is ready: policy-specific meaning.
    Ready {
        /// Session (or training container) it belongs to.
        session: u32,
        /// Host.
        host: u32,
    },
    /// A pre-warmed container finished starting on this host.
    Refill(u32),
    /// Idle-held GPUs on this host may be due for release.
    IdleCheck(u32),
    /// The autoscaler runs.
    ScaleTick,
    /// Record a point of the time series.
    Sample,
}

/// The queue.
#[derive(Debug, Default)]
pub struct Queue {
    heap: BinaryHeap<Reverse<(Millis, u64, Ev)>>,
    seq: u64,
}

impl Queue {
    /// Schedules `ev` at `at`.
    pub fn push(&mut self, at: Millis, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, ev)));
    }

    /// The next event.
    pub fn pop(&mut self) -> Option<(Millis, Ev)> {
        self.heap.pop().map(|Reverse((t, _, e))| (t, e))
    }

    /// Events still scheduled.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// No events left.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_order_then_insertion_order() {
        let mut q = Queue::default();
        q.push(10, Ev::Sample);
        q.push(5, Ev::ScaleTick);
        q.push(10, Ev::HostUp(1));
        q.push(10, Ev::HostUp(0));
        let got: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(got, vec![(5, Ev::ScaleTick), (10, Ev::Sample), (10, Ev::HostUp(1)), (10, Ev::HostUp(0))]);
        assert!(q.is_empty());
    }
}
