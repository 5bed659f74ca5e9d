//! What a front-end's cell does between its election rounds, as a pure state machine: no
//! I/O, no clock (the time comes with each call, the candidates and the kernel record's
//! facts come as a [`Snapshot`]). The cell worker ([`super::cell_driver`]) looks up a
//! snapshot, asks [`CellLoop::on_snapshot`] for the next [`Step`] and does it: wait for GPUs
//! (telling the clients once, asking the meta leader for a move at most every
//! [`MOVE_ASK_EVERY`]), wait for a replica, fail, or run a round (pre-selection, then
//! `execute_request` to every live replica, designee first). What a running round makes of
//! what it hears is [`super::election_round`]'s, through [`CellLoop::on`].

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::election_round::{Election, Failure, Heard, Next};
use super::kernel::NO_REPLICA_TIMEOUT;
use nbos_sched::preselect::{preselect, Candidate};

/// How long a round waits for its designee's outcome before asking again.
pub(super) const OUTCOME_TIMEOUT: Duration = Duration::from_secs(15);
/// Pause between retry rounds when every live replica yielded and no `load/` changed.
pub(super) const YIELD_RETRY: Duration = Duration::from_millis(500);
/// How often a waiting cell asks again for a replica to move (no host could take one; the
/// hosts' `load/` records it was decided on are up to 100 ms old).
pub(super) const MOVE_ASK_EVERY: Duration = Duration::from_secs(1);

/// What the driver looked up before a round: the kernel's replicas as candidates and the
/// facts of its record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Snapshot {
    /// The kernel's replicas, as [`super::kernel::FrontendKernel::candidates`] sees them.
    pub(super) cands: Vec<Candidate>,
    /// GPUs a cell of the kernel needs.
    pub(super) gpus: u32,
    /// The replica a move in the record creates, if one is under way.
    pub(super) moving: Option<u32>,
    /// The kernel's last executor (replica, host), from the group's record or this front-end.
    pub(super) last: Option<(u32, u64)>,
}

/// What the driver does next, before (or instead of) a round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Step {
    /// Every live replica yielded: the cell waits for GPUs. `tell_waiting`: first tell the
    /// clients this text; `tell_moving`: tell them the record's move; `ask_move`: ask the
    /// meta leader for a move. Then wait for a change until `until`.
    WaitForGpus { tell_waiting: Option<String>, tell_moving: bool, ask_move: bool, until: Instant },
    /// No replica is live: wait for a change, an event or `until`, then look again.
    WaitForReplica { until: Instant },
    /// The cell failed.
    Fail(Failure),
    /// Run a round.
    Round(Round),
}

/// One round the driver runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Round {
    /// The round's number.
    pub(super) round: u32,
    /// The designee: replica `lead` on host `lead_node`.
    pub(super) lead: u32,
    pub(super) lead_node: u64,
    /// The hosts to send the round to, the designee's first; `true` for the designee.
    pub(super) sends: Vec<(u64, bool)>,
    /// The cell fails over from the last executor's host (gone) to the designee's: (from, to).
    pub(super) failed_over: Option<(u64, u64)>,
    /// Without an outcome by then, the next round.
    pub(super) deadline: Instant,
}

/// One cell's rounds and what it told the clients and the meta leader so far.
#[derive(Debug, Clone)]
pub(super) struct CellLoop {
    /// The rounds so far and what they decided.
    pub(super) election: Election,
    /// Since when no replica was reachable, with no replica's answer in between: a cell that
    /// waited minutes for GPUs must not fail at a replica's first blink (a move's switch), and
    /// one whose replicas only seem live now and then, never answering, must still end.
    unreachable_since: Option<Instant>,
    told_waiting: bool,
    told_moving: Option<u32>,
    asked_to_move: Option<Instant>,
}

impl CellLoop {
    /// A cell that has not looked yet.
    pub(super) fn new() -> Self {
        Self {
            election: Election::new(),
            unreachable_since: None,
            told_waiting: false,
            told_moving: None,
            asked_to_move: None,
        }
    }

    /// The next step, from what the driver looked up (`None`: the kernel's record is gone).
    pub(super) fn on_snapshot(&mut self, snapshot: Option<Snapshot>, now: Instant) -> Step {
        // The stretch without a replica ends only with an answer ([`CellLoop::on`]): a replica
        // whose round timed out counts as yielded, so a wait for GPUs is no proof of one.
        self.next_step(snapshot, now)
    }

    fn next_step(&mut self, snapshot: Option<Snapshot>, now: Instant) -> Step {
        let Some(Snapshot { mut cands, gpus, moving, last }) = snapshot else { return Step::Fail(Failure::Deleted) };
        let previous = last.map(|(r, _)| r);
        // The kernel's own last cell is over (cells are serialised): GPUs its executor still
        // holds for it (idle-held, or not yet republished in `load/`, sampled every 100 ms) are
        // its own to take, so they do not count against the previous executor. Without this
        // a stale load moves every other cell to another replica (and its group leadership
        // with it). The replica host's binder decides for real.
        if let Some(p) = previous {
            for c in cands.iter_mut().filter(|c| c.replica == p) {
                c.gpus_idle = c.gpus_idle.saturating_add(gpus);
            }
        }
        let election = &mut self.election;
        let live: HashSet<u32> = cands.iter().filter(|c| c.live).map(|c| c.replica).collect();
        if !live.is_empty() && !election.yielded.is_empty() && live.iter().all(|r| election.yielded.contains(r)) {
            // Every live replica said it cannot: the cell waits for GPUs. (With none live,
            // it waits for a replica below, and that wait ends.)
            let tell_waiting = (!std::mem::replace(&mut self.told_waiting, true)).then(|| {
                let reason = election.expected.as_ref().map(|e| e.reason.clone()).filter(|r| !r.is_empty());
                format!(
                    "[NotebookOS] waiting for {} GPU(s): no replica's host can commit them now{}; the cell starts when GPUs free up\n",
                    gpus,
                    reason.map(|r| format!(" ({r})")).unwrap_or_default()
                )
            });
            // A replica moves to a host that can run the cell now (the meta leader decides).
            let (mut tell_moving, mut ask_move) = (false, false);
            match moving {
                Some(m) if self.told_moving != Some(m) => {
                    self.told_moving = Some(m);
                    tell_moving = true;
                }
                None if self.asked_to_move.is_none_or(|t| now.saturating_duration_since(t) >= MOVE_ASK_EVERY) => {
                    self.asked_to_move = Some(now);
                    ask_move = true;
                }
                _ => {}
            }
            election.yielded.clear();
            return Step::WaitForGpus { tell_waiting, tell_moving, ask_move, until: now + YIELD_RETRY };
        }
        let Some(plan) = preselect(&cands, gpus, previous, &election.yielded) else {
            let since = *self.unreachable_since.get_or_insert(now);
            if now.saturating_duration_since(since) > NO_REPLICA_TIMEOUT {
                return Step::Fail(Failure::NoReplica);
            }
            // Wait for a link or host to come back.
            return Step::WaitForReplica { until: now + YIELD_RETRY };
        };
        let lead_node = cands.iter().find(|c| c.replica == plan.lead).map_or(0, |c| c.node_id);
        election.designate(plan.lead, lead_node);
        let round = election.round;
        let failed_over = last
            .filter(|&(p, _)| round == 0 && p != plan.lead && !cands.iter().any(|c| c.replica == p && c.live))
            .map(|(_, prev_node)| (prev_node, lead_node));
        // The designee first: its swap is on the cell's path, the yield notes are not.
        let mut live_cands: Vec<&Candidate> = cands.iter().filter(|c| c.live).collect();
        live_cands.sort_by_key(|c| c.replica != plan.lead);
        let sends = live_cands.iter().map(|c| (c.node_id, c.replica == plan.lead)).collect();
        Step::Round(Round { round, lead: plan.lead, lead_node, sends, failed_over, deadline: now + OUTCOME_TIMEOUT })
    }

    /// What the running round makes of `heard` ([`Election::on`]).
    pub(super) fn on(&mut self, heard: Heard) -> Next {
        // A replica answered: the stretch without one ends (a round alone does not: a
        // replica that looks live but never answers would keep the cell waiting forever).
        if matches!(heard, Heard::Outcome { .. }) {
            self.unreachable_since = None;
        }
        self.election.on(heard)
    }

    /// Until when the driver waits for a change before a round that asked to
    /// ([`Next::NewRound`]'s `wait_for_change`).
    pub(super) fn change_wait_until(now: Instant) -> Instant {
        now + YIELD_RETRY
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::cluster::control::records::ElectionRecord;

    /// Replica `r` on host `10 * r`, the first one local.
    fn cand(replica: u32, live: bool, gpus_idle: u32) -> Candidate {
        Candidate { replica, node_id: u64::from(replica) * 10, live, gpus_idle, local: replica == 1 }
    }

    fn snap(cands: Vec<Candidate>, gpus: u32, moving: Option<u32>, last: Option<(u32, u64)>) -> Option<Snapshot> {
        Some(Snapshot { cands, gpus, moving, last })
    }

    fn round(step: Step) -> Round {
        match step {
            Step::Round(r) => r,
            other => panic!("expected a round, got {other:?}"),
        }
    }

    fn yielded(node: u64, reason: &str) -> Heard {
        Heard::Outcome {
            node,
            outcome: "yielded".to_owned(),
            record: Some(ElectionRecord { round: 0, winner: None, node_id: node, reason: reason.to_owned() }),
            running: None,
            holder_there: false,
            winner_live: false,
        }
    }

    #[test]
    fn a_deleted_kernel_fails_the_cell() {
        let t0 = Instant::now();
        assert_eq!(CellLoop::new().on_snapshot(None, t0), Step::Fail(Failure::Deleted));
    }

    #[test]
    fn without_a_live_replica_it_waits_until_the_no_replica_timeout_then_fails() {
        let t0 = Instant::now();
        let mut cl = CellLoop::new();
        let none_live = || snap(vec![cand(1, false, 1), cand(2, false, 1)], 1, None, None);
        assert_eq!(cl.on_snapshot(none_live(), t0), Step::WaitForReplica { until: t0 + YIELD_RETRY });
        let at_timeout = t0 + NO_REPLICA_TIMEOUT;
        assert_eq!(cl.on_snapshot(none_live(), at_timeout), Step::WaitForReplica { until: at_timeout + YIELD_RETRY });
        let after = at_timeout + Duration::from_millis(1);
        assert_eq!(cl.on_snapshot(none_live(), after), Step::Fail(Failure::NoReplica));
    }

    /// The timeout counts from the first look without a live replica, not from the cell's
    /// start: a cell that waited a minute for GPUs survives a replica's blink during a move
    /// (a trace replay under contention failed that way).
    #[test]
    fn a_cell_that_waited_for_gpus_does_not_fail_at_the_first_look_without_a_replica() {
        let t0 = Instant::now();
        let mut cl = CellLoop::new();
        let busy = || snap(vec![cand(1, true, 0), cand(2, false, 0)], 1, None, None);
        let none_live = || snap(vec![cand(1, false, 0), cand(2, false, 0)], 1, None, None);
        // A round; the live replica yields; the cell waits for GPUs for a minute.
        let r = round(cl.on_snapshot(busy(), t0));
        assert!(matches!(cl.on(yielded(r.lead_node, "busy")), Next::NewRound { .. }));
        let later = t0 + Duration::from_secs(60);
        assert!(matches!(cl.on_snapshot(busy(), later), Step::WaitForGpus { .. }));
        // Then neither replica is reachable: it waits, for NO_REPLICA_TIMEOUT from there.
        let blink = later + Duration::from_secs(1);
        assert_eq!(cl.on_snapshot(none_live(), blink), Step::WaitForReplica { until: blink + YIELD_RETRY });
        let edge = blink + NO_REPLICA_TIMEOUT;
        assert_eq!(cl.on_snapshot(none_live(), edge), Step::WaitForReplica { until: edge + YIELD_RETRY });
        // A replica back, and answering, ends the stretch; the next stretch starts its own count.
        let r = round(cl.on_snapshot(busy(), edge));
        assert!(matches!(cl.on(yielded(r.lead_node, "busy")), Next::NewRound { .. }));
        let again = edge + Duration::from_secs(1);
        assert_eq!(cl.on_snapshot(none_live(), again), Step::WaitForReplica { until: again + YIELD_RETRY });
        let past = again + NO_REPLICA_TIMEOUT + Duration::from_millis(1);
        assert_eq!(cl.on_snapshot(none_live(), past), Step::Fail(Failure::NoReplica));
    }

    /// A replica that seems live now and then but never answers (its link flickers) does not
    /// reset the count: rounds to it time out, and the cell fails NO_REPLICA_TIMEOUT after
    /// the first look that found none.
    #[test]
    fn a_replica_that_flickers_live_but_never_answers_does_not_keep_the_cell_forever() {
        let t0 = Instant::now();
        let mut cl = CellLoop::new();
        let blinking = || snap(vec![cand(1, true, 1), cand(2, false, 1)], 1, None, None);
        let none_live = || snap(vec![cand(1, false, 1), cand(2, false, 1)], 1, None, None);
        assert!(matches!(cl.on_snapshot(none_live(), t0), Step::WaitForReplica { .. }));
        let mut now = t0;
        while now - t0 <= NO_REPLICA_TIMEOUT {
            now += Duration::from_secs(1);
            // A round to it, or (it timed out: counted as yielded) a wait for GPUs.
            match cl.on_snapshot(blinking(), now) {
                Step::Round(_) => assert!(matches!(cl.on(Heard::TimedOut), Next::NewRound { .. })),
                step => assert!(matches!(step, Step::WaitForGpus { .. }), "{step:?}"),
            }
            now += Duration::from_secs(1);
            if now - t0 <= NO_REPLICA_TIMEOUT {
                assert!(matches!(cl.on_snapshot(none_live(), now), Step::WaitForReplica { .. }));
            }
        }
        assert_eq!(cl.on_snapshot(none_live(), now), Step::Fail(Failure::NoReplica));
    }

    #[test]
    fn a_round_goes_to_every_live_replica_designee_first() {
        let t0 = Instant::now();
        let mut cl = CellLoop::new();
        let cands = vec![cand(1, true, 0), cand(2, false, 4), cand(3, true, 2)];
        let r = round(cl.on_snapshot(snap(cands, 1, None, None), t0));
        assert_eq!((r.round, r.lead, r.lead_node), (0, 3, 30));
        assert_eq!(r.sends, vec![(30, true), (10, false)]);
        assert_eq!(r.deadline, t0 + OUTCOME_TIMEOUT);
        assert_eq!(r.failed_over, None);
    }

    #[test]
    fn the_previous_executor_counts_the_gpus_it_still_holds_for_the_kernel() {
        let t0 = Instant::now();
        let mut cl = CellLoop::new();
        // Replica 2 ran the last cell and still holds its 2 GPUs (its load says 0 idle).
        let cands = vec![cand(1, true, 1), cand(2, true, 0)];
        let r = round(cl.on_snapshot(snap(cands, 2, None, Some((2, 20))), t0));
        assert_eq!((r.lead, r.failed_over), (2, None));
    }

    #[test]
    fn a_gone_last_executor_fails_over_in_the_first_round_only() {
        let t0 = Instant::now();
        let mut cl = CellLoop::new();
        let cands = || vec![cand(1, true, 1), cand(2, false, 1), cand(3, true, 1)];
        let r = round(cl.on_snapshot(snap(cands(), 1, None, Some((2, 20))), t0));
        assert_eq!(r.failed_over, Some((20, r.lead_node)));
        assert!(matches!(cl.on(Heard::TimedOut), Next::NewRound { .. }));
        let r = round(cl.on_snapshot(snap(cands(), 1, None, Some((2, 20))), t0));
        assert_eq!((r.round, r.failed_over), (1, None));
    }

    #[test]
    fn when_every_live_replica_yielded_it_tells_once_and_asks_for_a_move_every_second() {
        let t0 = Instant::now();
        let mut cl = CellLoop::new();
        let cands = || vec![cand(1, true, 0), cand(2, false, 0)];
        let r = round(cl.on_snapshot(snap(cands(), 2, None, None), t0));
        assert!(matches!(cl.on(yielded(r.lead_node, "2 GPUs busy")), Next::NewRound { .. }));
        let text = "[NotebookOS] waiting for 2 GPU(s): no replica's host can commit them now (2 GPUs busy); the cell starts when GPUs free up\n";
        assert_eq!(
            cl.on_snapshot(snap(cands(), 2, None, None), t0),
            Step::WaitForGpus {
                tell_waiting: Some(text.to_owned()),
                tell_moving: false,
                ask_move: true,
                until: t0 + YIELD_RETRY
            }
        );
        // The wait forgot who yielded: the next look runs a round again.
        let r = round(cl.on_snapshot(snap(cands(), 2, None, None), t0 + YIELD_RETRY));
        assert_eq!(r.round, 1, "past the yield's record (round 0)");
        let t1 = t0 + YIELD_RETRY;
        assert!(matches!(cl.on(yielded(r.lead_node, "")), Next::NewRound { .. }));
        assert_eq!(
            cl.on_snapshot(snap(cands(), 2, None, None), t1),
            Step::WaitForGpus { tell_waiting: None, tell_moving: false, ask_move: false, until: t1 + YIELD_RETRY },
            "asked less than a second ago"
        );
        // A move is under way: the clients hear of it once, and nobody asks for another.
        for (at, tell) in [(t0 + MOVE_ASK_EVERY, true), (t0 + 2 * MOVE_ASK_EVERY, false)] {
            let r = round(cl.on_snapshot(snap(cands(), 2, Some(7), None), at));
            assert!(matches!(cl.on(yielded(r.lead_node, "")), Next::NewRound { .. }));
            assert_eq!(
                cl.on_snapshot(snap(cands(), 2, Some(7), None), at),
                Step::WaitForGpus { tell_waiting: None, tell_moving: tell, ask_move: false, until: at + YIELD_RETRY }
            );
        }
    }

    /// What a simulated round hears: only what ends the round undecided, so the cell goes on.
    fn undecided(choice: u8, lead_node: u64) -> Heard {
        match choice % 5 {
            0 => yielded(lead_node, ""),
            1 => Heard::Outcome {
                node: lead_node,
                outcome: "stale".to_owned(),
                record: Some(ElectionRecord { round: 3, winner: None, node_id: lead_node, reason: String::new() }),
                running: None,
                holder_there: false,
                winner_live: false,
            },
            2 => Heard::Outcome {
                node: lead_node,
                outcome: "error".to_owned(),
                record: None,
                running: None,
                holder_there: false,
                winner_live: false,
            },
            3 => Heard::LinkDown { node: lead_node, executor: None },
            _ => Heard::TimedOut,
        }
    }

    prop_compose! {
        /// One look at the kernel: up to 4 replicas (live or not, with some idle GPUs), a
        /// move under way or not, the time since the last look, what its round hears.
        fn look()(
            replicas in proptest::collection::vec((any::<bool>(), 0u32..3), 0..4),
            moving in proptest::option::of(5u32..7),
            dt_ms in 0u64..3_000,
            heard in any::<u8>(),
        ) -> (Vec<Candidate>, Option<u32>, Duration, u8) {
            let cands = replicas.iter().zip(1u32..).map(|(&(live, idle), r)| cand(r, live, idle)).collect();
            (cands, moving, Duration::from_millis(dt_ms), heard)
        }
    }

    proptest! {
        /// Whatever the kernel looks like at each look: a round goes to every live replica
        /// once and to nobody else, its designee first and only it designated; no round
        /// number repeats; the clients hear that the cell waits for GPUs at most once and of
        /// each move at most once; the meta leader is asked for a move only while none is
        /// under way and at most once per [`MOVE_ASK_EVERY`]; a failover is only ever the
        /// first round's; and a cell fails for want of a replica only with none live, and
        /// only after [`NO_REPLICA_TIMEOUT`].
        #[test]
        fn the_cell_loop_keeps_its_promises(
            gpus in 0u32..3,
            last in proptest::option::of(1u32..5),
            looks in proptest::collection::vec(look(), 1..80),
        ) {
            let t0 = Instant::now();
            let mut cl = CellLoop::new();
            let mut now = t0;
            let (mut rounds, mut told_waiting, mut told_moving, mut last_ask) = (Vec::new(), 0, None, None::<Instant>);
            // The first look of the current stretch without a reachable replica.
            let mut stretch = None::<Instant>;
            for (cands, moving, dt, heard) in looks {
                now += dt;
                let live: Vec<u64> = cands.iter().filter(|c| c.live).map(|c| c.node_id).collect();
                let last = last.map(|r| (r, u64::from(r) * 10));
                let step = cl.on_snapshot(snap(cands.clone(), gpus, moving, last), now);
                match step {
                    Step::Round(r) => {
                        let mut sent: Vec<u64> = r.sends.iter().map(|&(n, _)| n).collect();
                        prop_assert_eq!(r.sends.first(), Some(&(r.lead_node, true)));
                        prop_assert_eq!(r.sends.iter().filter(|s| s.1).count(), 1);
                        sent.sort_unstable();
                        prop_assert_eq!(&sent, &live, "sent to exactly the live replicas");
                        prop_assert!(cands.iter().any(|c| c.live && c.replica == r.lead && c.node_id == r.lead_node));
                        prop_assert!(!rounds.contains(&r.round), "round {} ran twice", r.round);
                        prop_assert_eq!(r.deadline, now + OUTCOME_TIMEOUT);
                        if r.failed_over.is_some() {
                            prop_assert!(rounds.is_empty() && r.round == 0);
                        }
                        rounds.push(r.round);
                        let heard = undecided(heard, r.lead_node);
                        if matches!(heard, Heard::Outcome { .. }) {
                            stretch = None;
                        }
                        let next = cl.on(heard);
                        prop_assert!(matches!(next, Next::NewRound { .. }), "{:?}", next);
                    }
                    Step::WaitForGpus { tell_waiting, tell_moving, ask_move, until } => {
                        prop_assert_eq!(until, now + YIELD_RETRY);
                        told_waiting += usize::from(tell_waiting.is_some());
                        prop_assert!(told_waiting <= 1);
                        if tell_moving {
                            prop_assert!(moving.is_some() && moving != told_moving);
                            told_moving = moving;
                        }
                        if ask_move {
                            prop_assert!(moving.is_none());
                            prop_assert!(last_ask.is_none_or(|t| now - t >= MOVE_ASK_EVERY));
                            last_ask = Some(now);
                        }
                    }
                    Step::WaitForReplica { until } => {
                        prop_assert!(live.is_empty());
                        prop_assert!(now - *stretch.get_or_insert(now) <= NO_REPLICA_TIMEOUT);
                        prop_assert_eq!(until, now + YIELD_RETRY);
                    }
                    Step::Fail(f) => {
                        prop_assert_eq!(f, Failure::NoReplica);
                        prop_assert!(live.is_empty() && now - stretch.unwrap_or(now) > NO_REPLICA_TIMEOUT);
                        break;
                    }
                }
            }
        }

        /// With no replica ever live, a cell always ends: it waits, a [`YIELD_RETRY`] at a
        /// time, and fails with [`Failure::NoReplica`] at its first look after the timeout.
        #[test]
        fn with_no_replica_ever_live_the_cell_fails_after_the_timeout(
            replicas in 0u32..4,
            gpus in 0u32..3,
        ) {
            let t0 = Instant::now();
            let mut cl = CellLoop::new();
            let cands: Vec<Candidate> = (1..=replicas).map(|r| cand(r, false, 2)).collect();
            let mut now = t0;
            let mut looks = 0u32;
            let failed_at = loop {
                match cl.on_snapshot(snap(cands.clone(), gpus, None, None), now) {
                    Step::WaitForReplica { until } => now = until,
                    Step::Fail(f) => break (f, now),
                    other => prop_assert!(false, "{:?}", other),
                }
                looks += 1;
                prop_assert!(looks < 1_000);
            };
            prop_assert_eq!(failed_at.0, Failure::NoReplica);
            prop_assert!(failed_at.1 - t0 > NO_REPLICA_TIMEOUT);
            prop_assert!(failed_at.1 - t0 <= NO_REPLICA_TIMEOUT + YIELD_RETRY);
        }
    }
}
