//! What a front-end's election round makes of what it hears, as a pure state machine: no
//! I/O, no clock (a timeout is an event, facts the driver looked up come with the event).
//! The cell worker ([`super::cell_driver`]) sends the round's requests, waits, feeds each event
//! here and does what [`Next`] says.
//!
//! Only the round's designee speaks for the round: an outcome from another host is late
//! (an earlier round's) and changes nothing, except `taken`, which any host may report. A
//! round the designee did not decide (`yielded`, `stale`, `busy`, `error`, its link down,
//! no outcome in time) is followed by another with a higher number; a winner whose host is
//! gone fails the cell.

use crate::cluster::control::records::{ElectionRecord, RunningRecord};

/// Why a cell ended without an `executed` outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failure {
    /// The executor's host died or became unreachable.
    HostDied(u64),
    /// No replica host was reachable in time.
    NoReplica,
    /// The kernel was deleted.
    Deleted,
}

/// What the round heard, with the facts the driver looked up for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Heard {
    /// A replica host's election outcome for this cell.
    Outcome {
        /// The host that answered.
        node: u64,
        /// `yielded`, `stale`, `busy`, `taken`, `error`, …
        outcome: String,
        /// The election record it answered with.
        record: Option<ElectionRecord>,
        /// On `busy`: the kernel's lock.
        running: Option<RunningRecord>,
        /// On `busy` with a lock: its holder's host is in the cluster and still holds a
        /// replica of the kernel.
        holder_there: bool,
        /// On `taken` with a record: the winner's host is connected and live.
        winner_live: bool,
    },
    /// The link to `node` dropped; `executor`: the host executing the cell, if known.
    LinkDown { node: u64, executor: Option<u64> },
    /// No outcome came in time (the driver waits with a timeout only while no host executes).
    TimedOut,
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Next {
    /// Keep waiting for this round's outcome (or the execution it starts).
    KeepWaiting,
    /// `node` executes the cell: route it there and wait for its reply.
    Executing(u64),
    /// Start the next round, because of `why`; `tell_busy`: first tell the clients the cell
    /// waits for another cell of the kernel, `wait_for_change`: and wait for a change before it.
    NewRound { why: Why, tell_busy: bool, wait_for_change: bool },
    /// The cell failed.
    Fail(Failure),
    /// An outcome this front-end does not know (logged; it keeps waiting).
    Unknown(String),
}

/// Why a round ended undecided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Why {
    /// The designee yielded.
    Yielded,
    /// The designee's expected record was stale.
    Stale,
    /// Another cell of the kernel holds its lock, on a host that is there.
    Busy,
    /// The kernel's lock is held by a host that is gone: the next round takes it over.
    TakeOverLock,
    /// The designee answered an election error.
    DesigneeError,
    /// The designee's link dropped before it answered.
    DesigneeLost,
    /// No outcome came in time.
    TimedOut,
}

/// One cell's election: its rounds so far.
#[derive(Debug, Clone, Default)]
pub(super) struct Election {
    /// The current round's number.
    pub(super) round: u32,
    /// The last record the front-end knows (sent with the next round).
    pub(super) expected: Option<ElectionRecord>,
    /// Replicas that yielded (or failed to answer) since the last wait for GPUs.
    pub(super) yielded: Vec<u32>,
    /// The kernel's lock, held by a host that is gone: the next round takes it over.
    pub(super) steal: Option<RunningRecord>,
    told_busy: bool,
    designee: (u32, u64),
}

impl Election {
    /// A new cell's election, before its first round.
    pub(super) fn new() -> Self {
        Self::default()
    }

    /// This round's designee is replica `lead` on host `lead_node`.
    pub(super) fn designate(&mut self, lead: u32, lead_node: u64) {
        self.designee = (lead, lead_node);
    }

    /// What to do after `heard`.
    pub(super) fn on(&mut self, heard: Heard) -> Next {
        let (lead, lead_node) = self.designee;
        match heard {
            Heard::TimedOut => self.designee_failed(lead, Why::TimedOut),
            Heard::LinkDown { node, executor } => {
                if executor == Some(node) {
                    Next::Fail(Failure::HostDied(node))
                } else if executor.is_none() && node == lead_node {
                    // The designee went away before saying anything: ask again; the record
                    // (if it won before dying) answers `taken`.
                    self.designee_failed(lead, Why::DesigneeLost)
                } else {
                    Next::KeepWaiting
                }
            }
            Heard::Outcome { node, outcome, record, running, holder_there, winner_live } => match outcome.as_str() {
                "taken" => match record {
                    None => Next::KeepWaiting,
                    Some(rec) if !winner_live => Next::Fail(Failure::HostDied(rec.node_id)),
                    Some(rec) => Next::Executing(rec.node_id),
                },
                // Any other known outcome from a host other than the designee is an earlier
                // round's (an unknown one is reported whoever sent it).
                "busy" | "yielded" | "stale" | "error" if node != lead_node => Next::KeepWaiting,
                "busy" => {
                    let Some(held) = running else { return Next::KeepWaiting };
                    self.round += 1;
                    // The holder's host is gone from the cluster (its lease expired) or its
                    // replica from the kernel: its cell ended with it, so the next round takes
                    // the lock over. Otherwise wait: a link that is down here says nothing
                    // (and a partitioned holder cannot commit).
                    if holder_there {
                        self.steal = None;
                        let tell_busy = !std::mem::replace(&mut self.told_busy, true);
                        Next::NewRound { why: Why::Busy, tell_busy, wait_for_change: true }
                    } else {
                        self.steal = Some(held);
                        Next::NewRound { why: Why::TakeOverLock, tell_busy: false, wait_for_change: false }
                    }
                }
                "yielded" => {
                    self.yielded.push(lead);
                    self.expected = record;
                    self.round = self.expected.as_ref().map_or(self.round, |e| e.round.max(self.round)) + 1;
                    Next::NewRound { why: Why::Yielded, tell_busy: false, wait_for_change: false }
                }
                "stale" => {
                    self.round = record.as_ref().map_or(self.round, |e| e.round.max(self.round)) + 1;
                    self.expected = record;
                    Next::NewRound { why: Why::Stale, tell_busy: false, wait_for_change: false }
                }
                // The designee could not take part (no replica there yet, store failure): ask
                // another replica.
                "error" => self.designee_failed(lead, Why::DesigneeError),
                other => Next::Unknown(other.to_owned()),
            },
        }
    }

    fn designee_failed(&mut self, lead: u32, why: Why) -> Next {
        self.yielded.push(lead);
        self.round += 1;
        Next::NewRound { why, tell_busy: false, wait_for_change: false }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn record(round: u32, node_id: u64) -> ElectionRecord {
        ElectionRecord { round, winner: None, node_id, reason: String::new() }
    }

    fn outcome(node: u64, outcome: &str, record: Option<ElectionRecord>) -> Heard {
        Heard::Outcome {
            node,
            outcome: outcome.to_owned(),
            record,
            running: None,
            holder_there: false,
            winner_live: true,
        }
    }

    const fn next(why: Why) -> Next {
        Next::NewRound { why, tell_busy: false, wait_for_change: false }
    }

    #[test]
    fn a_yield_moves_past_the_record_and_remembers_the_yielder() {
        let mut e = Election::new();
        e.designate(2, 20);
        assert_eq!(e.on(outcome(20, "yielded", Some(record(4, 20)))), next(Why::Yielded));
        assert_eq!((e.round, e.yielded.clone()), (5, vec![2]));
        assert_eq!(e.expected, Some(record(4, 20)));
    }

    #[test]
    fn only_the_designee_speaks_for_its_round_but_anyone_reports_a_winner() {
        let mut e = Election::new();
        e.designate(1, 10);
        assert_eq!(e.on(outcome(30, "yielded", None)), Next::KeepWaiting);
        assert_eq!(e.on(outcome(30, "error", None)), Next::KeepWaiting);
        assert_eq!(e.on(outcome(30, "taken", Some(record(0, 30)))), Next::Executing(30));
        assert_eq!(e.round, 0);
    }

    #[test]
    fn an_unknown_outcome_is_reported_whoever_sends_it() {
        let mut e = Election::new();
        e.designate(1, 10);
        assert_eq!(e.on(outcome(30, "maybe", None)), Next::Unknown("maybe".to_owned()));
        assert_eq!(e.on(outcome(10, "maybe", None)), Next::Unknown("maybe".to_owned()));
        assert_eq!(e.round, 0, "an unknown outcome decides nothing");
    }

    #[test]
    fn a_dead_winner_or_executor_fails_the_cell() {
        let mut e = Election::new();
        e.designate(1, 10);
        let taken = Heard::Outcome {
            node: 10,
            outcome: "taken".to_owned(),
            record: Some(record(0, 30)),
            running: None,
            holder_there: false,
            winner_live: false,
        };
        assert_eq!(e.on(taken), Next::Fail(Failure::HostDied(30)));
        assert_eq!(e.on(Heard::LinkDown { node: 30, executor: Some(30) }), Next::Fail(Failure::HostDied(30)));
        assert_eq!(e.on(Heard::LinkDown { node: 40, executor: Some(30) }), Next::KeepWaiting);
    }

    #[test]
    fn a_busy_kernel_waits_for_a_live_holder_and_takes_over_a_gone_one() {
        let held = RunningRecord { cell: "other".to_owned(), replica: 3, node_id: 30 };
        let busy = |holder_there| Heard::Outcome {
            node: 10,
            outcome: "busy".to_owned(),
            record: None,
            running: Some(held.clone()),
            holder_there,
            winner_live: false,
        };
        let mut e = Election::new();
        e.designate(1, 10);
        assert_eq!(e.on(busy(true)), Next::NewRound { why: Why::Busy, tell_busy: true, wait_for_change: true });
        assert_eq!(
            e.on(busy(true)),
            Next::NewRound { why: Why::Busy, tell_busy: false, wait_for_change: true },
            "told once"
        );
        assert_eq!(e.steal, None);
        assert_eq!(e.on(busy(false)), next(Why::TakeOverLock));
        assert_eq!(e.steal, Some(held));
        assert_eq!(e.round, 3);
    }

    #[test]
    fn silence_or_a_lost_designee_starts_the_next_round() {
        let mut e = Election::new();
        e.designate(1, 10);
        assert_eq!(e.on(Heard::TimedOut), next(Why::TimedOut));
        e.designate(2, 20);
        assert_eq!(e.on(Heard::LinkDown { node: 20, executor: None }), next(Why::DesigneeLost));
        assert_eq!((e.round, e.yielded.clone()), (2, vec![1, 2]));
    }

    fn heard() -> impl Strategy<Value = Heard> {
        let outcome = prop_oneof![
            Just("yielded"),
            Just("stale"),
            Just("busy"),
            Just("taken"),
            Just("error"),
            Just("executed-by-a-future-version")
        ];
        let record = proptest::option::of((0u32..20, 1u64..4).prop_map(|(r, n)| record(r, n)));
        let running = proptest::option::of((1u32..4, 1u64..4).prop_map(|(replica, node_id)| RunningRecord {
            cell: "x".into(),
            replica,
            node_id,
        }));
        prop_oneof![
            (1u64..4, outcome, record, running, any::<bool>(), any::<bool>()).prop_map(
                |(node, outcome, record, running, holder_there, winner_live)| Heard::Outcome {
                    node,
                    outcome: outcome.to_owned(),
                    record,
                    running,
                    holder_there,
                    winner_live,
                }
            ),
            (1u64..4, proptest::option::of(1u64..4)).prop_map(|(node, executor)| Heard::LinkDown { node, executor }),
            Just(Heard::TimedOut),
        ]
    }

    proptest! {
        /// Whatever a round hears: the cell goes on to a round with a higher number (never
        /// one it already ran), fails with a reason, learns its executor, or keeps waiting
        /// only on what does not speak for the round, and a timeout always moves it on, so a
        /// lost election re-runs or fails and never hangs.
        #[test]
        fn a_round_never_goes_back_and_never_hangs_on_its_designee(
            events in proptest::collection::vec((1u32..4, heard()), 1..60),
        ) {
            let mut e = Election::new();
            for (lead, h) in events {
                let lead_node = u64::from(lead);
                e.designate(lead, lead_node);
                let before = e.round;
                let from_designee = matches!(&h, Heard::Outcome { node, .. } if *node == lead_node);
                let next = e.on(h.clone());
                match &next {
                    Next::NewRound { .. } => prop_assert!(e.round > before, "{h:?} -> round {} after {before}", e.round),
                    _ => prop_assert_eq!(e.round, before),
                }
                if h == Heard::TimedOut {
                    let moved_on = matches!(next, Next::NewRound { .. });
                    prop_assert!(moved_on, "a timeout must start the next round");
                }
                if let Heard::Outcome { outcome, record, running, .. } = &h {
                    let decides = match outcome.as_str() {
                        "taken" => record.is_some(),
                        "busy" => from_designee && running.is_some(),
                        "yielded" | "stale" | "error" => from_designee,
                        _ => false,
                    };
                    prop_assert_eq!(decides, !matches!(next, Next::KeepWaiting | Next::Unknown(_)), "{:?} -> {:?}", h, next);
                }
                if let Next::Fail(f) = next {
                    prop_assert!(matches!(f, Failure::HostDied(_)));
                }
            }
        }
    }
}
