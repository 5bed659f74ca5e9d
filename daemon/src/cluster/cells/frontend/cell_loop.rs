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
    started: Instant,
    told_waiting: bool,
    told_moving: Option<u32>,
    asked_to_move: Option<Instant>,
}

impl CellLoop {
    /// A cell that starts at `now`.
    pub(super) fn new(now: Instant) -> Self {
        Self { election: Election::new(), started: now, told_waiting: false, told_moving: None, asked_to_move: None }
    }

    /// The next step, from what the driver looked up (`None`: the kernel's record is gone).
    pub(super) fn on_snapshot(&mut self, snapshot: Option<Snapshot>, now: Instant) -> Step {
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
        if !election.yielded.is_empty() && live.iter().all(|r| election.yielded.contains(r)) {
            // Every live replica said it cannot: the cell waits for GPUs.
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
            if now.saturating_duration_since(self.started) > NO_REPLICA_TIMEOUT {
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
        self.election.on(heard)
    }

    /// Until when the driver waits for a change before a round that asked to
    /// ([`Next::NewRound`]'s `wait_for_change`).
    pub(super) fn change_wait_until(now: Instant) -> Instant {
        now + YIELD_RETRY
    }
}
