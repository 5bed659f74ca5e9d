//! Three replicas per session on distinct hosts, GPUs bound only while a training runs.
//!
//! Both variants place a session's replicas with [`placement::place`] (least subscribed
//! hosts first), choose each training's executor with [`preselect`] (the previous
//! executor if its host can commit the GPUs now, else the replica whose host has most
//! available), and commit GPUs through each host's [`crate::HostScheduler`]. When
//! no replica's host can commit (all YIELD), a replica migrates to a host that can. With
//! no such host, the cell waits for a host to be provisioned (15 ± 2 s) or for GPUs to
//! free up, whichever comes first.
//!
//! Every move, on a cell's path or in the background (drain, cover), goes through
//! [`Replicated::move_replica`] and costs what the cost file says ([`crate::sim::costs`]):
//! a replica start on the target (pre-warmed if it has a warm container, else cold) plus
//! the state transfer of the session's namespace. A host runs at most
//! `max_moves_per_host` moves at once; more wait for a slot. A moving replica is not live
//! for the executor choice; a cell that finds no live replica able to run waits for a
//! moving one whose host can commit its GPUs (they are committed at once) rather than
//! moving another.
//!
//! - `notebookos-paper`, the authors' rules (ds2-lab/NotebookOS): a host's subscription
//!   is `placed GPUs ÷ host GPUs ÷ replicas`, refused above the cluster's ratio of demand
//!   to committed GPUs (capped at 7); a *random* replica migrates to the least subscribed
//!   host that can commit; GPUs are released when the training ends; 3 pre-warmed
//!   containers per host; the autoscaler is [`scale::paper`] every 30 s, releasing hosts
//!   by [`drain::choose`] after moving their idle replicas.
//! - `notebookos`, ours (the daemon's scheduler core): placement within the configured
//!   subscription ratio; the migration choice of [`migrate::choose`] (best fit, distinct
//!   hosts); idle-held GPUs released after `idle_release` as the daemon does; pre-warm
//!   pools sized by [`prewarm::pool_size`]; the autoscaler is [`scale::ours`] on the
//!   demand peak of the last `peak_window`.

use std::collections::VecDeque;

use super::api::Policy;
use crate::placement::{self, HostLoad, PlacementError};
use crate::preselect::{preselect, Candidate};
use crate::scale::{self, PeakTracker, Scale};
use crate::sim::cluster::HostState;
use crate::sim::ctx::Ctx;
use crate::sim::events::Ev;
use crate::{drain, executor, migrate, prewarm, Millis};

/// Which rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// The authors' rules.
    Paper,
    /// Ours.
    Ours,
}

const REPLICAS: usize = 3;

/// Why a replica moves (what it is counted as).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MoveKind {
    /// Every replica's host yields: to run a cell (`migrations`).
    Cell,
    /// Off a host being drained, or to cover an idle kernel (`background_moves`).
    Background,
}
const NONE: u32 = u32::MAX;

/// The policy's state.
#[derive(Debug)]
pub struct Replicated {
    variant: Variant,
    reps: Vec<[u32; REPLICAS]>,
    /// When each replica has finished moving (its start and state transfer).
    ready_at: Vec<[Millis; REPLICAS]>,
    /// Per host: when each of its move slots frees up.
    move_slots: Vec<Vec<Millis>>,
    ready: Vec<bool>,
    submitted: Vec<bool>,
    running: Vec<bool>,
    live: std::collections::BTreeSet<u32>,
    prev: Vec<Option<u32>>,
    pending_place: VecDeque<u32>,
    waiting: VecDeque<u32>,
    claims: u32,
    live_demand: u32,
    members: Vec<Vec<u32>>,
    peak: Option<PeakTracker>,
    takes: VecDeque<Millis>,
}

fn kernel(s: u32) -> String {
    format!("s{s}")
}

impl Replicated {
    /// For `n` sessions.
    pub fn new(n: usize, variant: Variant) -> Self {
        Self {
            variant,
            reps: vec![[NONE; REPLICAS]; n],
            ready_at: vec![[0; REPLICAS]; n],
            move_slots: Vec::new(),
            ready: vec![false; n],
            submitted: vec![false; n],
            running: vec![false; n],
            live: std::collections::BTreeSet::new(),
            prev: vec![None; n],
            pending_place: VecDeque::new(),
            waiting: VecDeque::new(),
            claims: 0,
            live_demand: 0,
            members: Vec::new(),
            peak: None,
            takes: VecDeque::new(),
        }
    }

    /// The subscription ratio placement and migration keep, in subscribed GPUs per host GPU.
    fn ratio(&self, cx: &Ctx<'_>, extra_demand: u32) -> f64 {
        match self.variant {
            Variant::Ours => cx.m.subscription_ratio,
            Variant::Paper => {
                // Theirs is per replica: placed ÷ GPUs ÷ replicas <= demand ÷ committed.
                let d = f64::from(self.live_demand + extra_demand);
                let c = f64::from(cx.c.committed_now());
                let moving = if c > 0.0 { d / c } else { cx.m.paper_max_ratio };
                moving.clamp(1.0, cx.m.paper_max_ratio) * REPLICAS as f64
            }
        }
    }

    fn loads(cx: &Ctx<'_>, skip: &[u32]) -> Vec<HostLoad> {
        cx.c.up_hosts()
            .iter()
            .filter(|h| !skip.contains(h))
            .map(|&h| {
                let host = cx.c.host(h);
                HostLoad {
                    node_id: u64::from(h),
                    gpus_total: cx.c.gpus_per_host(),
                    subscribed_gpus: host.subscribed,
                    replicas: host.replicas,
                }
            })
            .collect()
    }

    fn member_add(&mut self, h: u32, s: u32) {
        let i = h as usize;
        if self.members.len() <= i {
            self.members.resize(i + 1, Vec::new());
        }
        self.members[i].push(s);
    }

    fn member_remove(&mut self, h: u32, s: u32) {
        if let Some(v) = self.members.get_mut(h as usize) {
            v.retain(|&x| x != s);
        }
    }

    fn place_pending(&mut self, cx: &mut Ctx<'_>) {
        while let Some(&s) = self.pending_place.front() {
            let g = cx.session_gpus(s);
            let ratio = self.ratio(cx, g);
            match placement::place(&Self::loads(cx, &[]), g, REPLICAS, ratio) {
                Ok(ids) => {
                    self.pending_place.pop_front();
                    let k = kernel(s);
                    for (r, id) in ids.into_iter().enumerate() {
                        let h = u32::try_from(id).unwrap_or(NONE);
                        cx.c.add_kernel(h, &k, g, cx.now);
                        self.reps[s as usize][r] = h;
                        self.member_add(h, s);
                    }
                    self.live_demand += g;
                    self.live.insert(s);
                    self.ready_at[s as usize] = [0; REPLICAS];
                    cx.q.push(cx.now + cx.m.costs.start_ms(false), Ev::Ready { session: s, host: 0 });
                }
                Err(e) => {
                    let need = match e {
                        PlacementError::TooFewHosts { needed, up, .. } => needed.saturating_sub(up),
                        PlacementError::NoRoom { needed, eligible, .. } => needed.saturating_sub(eligible),
                    };
                    let need = u32::try_from(need).unwrap_or(0);
                    let booting = cx.c.provisioning().saturating_sub(self.claims);
                    for _ in booting..need {
                        cx.request_host();
                    }
                    break;
                }
            }
        }
    }

    /// Per-host pre-warm target.
    fn pool_target(&mut self, cx: &Ctx<'_>) -> u32 {
        match self.variant {
            Variant::Paper => cx.m.prewarm_per_host,
            Variant::Ours => {
                let window = cx.m.peak_window_ms;
                while self.takes.front().is_some_and(|&t| cx.now.saturating_sub(t) > window) {
                    self.takes.pop_front();
                }
                let takes = u32::try_from(self.takes.len()).unwrap_or(u32::MAX);
                prewarm::pool_size(takes, window, cx.m.costs.start_ms(false), 1, cx.m.prewarm_per_host.max(1))
            }
        }
    }

    fn refill_pool(&mut self, cx: &mut Ctx<'_>, h: u32) {
        let target = self.pool_target(cx);
        let host = cx.c.host_mut(h);
        let have = host.warm + host.warming;
        if host.state == HostState::Up && have < target {
            host.warming += target - have;
            for _ in have..target {
                cx.q.push(cx.now + cx.m.costs.start_ms(false), Ev::Refill(h));
            }
        }
    }

    /// Runs the session's submitted training now if any replica's host, or a migration
    /// target, can commit its GPUs. False: it must wait.
    fn try_run(&mut self, cx: &mut Ctx<'_>, s: u32) -> bool {
        let g = cx.training(s).gpus;
        let sg = cx.session_gpus(s);
        let k = kernel(s);
        let cell = format!("s{s}c{}", cx.training_index(s));
        let reps = self.reps[s as usize];
        let cands = self.candidates(cx, s, false);
        let lead = match self.variant {
            Variant::Paper => preselect(&cands, g, self.prev[s as usize], &[]).map(|round| round.lead),
            Variant::Ours => executor::choose(&cands, g, self.prev[s as usize]),
        };
        if let Some(lead) = lead {
            let h = reps[lead as usize - 1];
            if cx.c.host(h).sched.available() >= g {
                cx.c.commit(h, &k, &cell, g, cx.now);
                cx.start_training(s, h, cx.m.election_ms);
                self.prev[s as usize] = Some(lead);
                self.submitted[s as usize] = false;
                self.running[s as usize] = true;
                self.cover(cx);
                return true;
            }
        }
        // No live replica can run it: wait for a moving one whose host can commit now.
        if let Some((r, ready)) = self.moving_replica_for(cx, s, g) {
            let h = reps[r];
            cx.c.commit(h, &k, &cell, g, cx.now);
            cx.start_training(s, h, ready - cx.now + cx.m.election_ms);
            self.prev[s as usize] = Some(u32::try_from(r + 1).unwrap_or(NONE));
            self.submitted[s as usize] = false;
            self.running[s as usize] = true;
            self.cover(cx);
            return true;
        }
        // Every replica yields: migrate one to a host that can commit now.
        let ratio = self.ratio(cx, 0);
        let choice = match self.variant {
            Variant::Ours => self.migration_for(cx, s, ratio),
            Variant::Paper => {
                let r = usize::try_from(cx.rng.below(REPLICAS as u64)).unwrap_or(0);
                let exclude: Vec<u64> = reps.iter().map(|&h| u64::from(h)).collect();
                let loads: Vec<HostLoad> = Self::loads(cx, &[])
                    .into_iter()
                    .filter(|l| cx.c.host(index(l.node_id)).sched.available() >= g)
                    .collect();
                placement::replace(&loads, sg, ratio, &exclude).map(|to| (r, index(to)))
            }
        };
        let Some((r, to)) = choice else { return false };
        let ready = self.move_replica(cx, s, r, to, MoveKind::Cell);
        // The GPUs are the cell's from now; it runs once the replica has moved.
        cx.c.commit(to, &k, &cell, g, cx.now);
        cx.start_training(s, to, ready - cx.now + cx.m.election_ms);
        self.prev[s as usize] = Some(u32::try_from(r + 1).unwrap_or(NONE));
        self.submitted[s as usize] = false;
        self.running[s as usize] = true;
        self.cover(cx);
        true
    }

    /// Moves replica `r` of session `s` to host `to`, charging what a move costs: a
    /// replica start there (a warm container if it has one, else cold) plus the transfer
    /// of the session's namespace, after a free move slot on `to`. Returns when the
    /// replica is ready; until then it is not live.
    fn move_replica(&mut self, cx: &mut Ctx<'_>, s: u32, r: usize, to: u32, kind: MoveKind) -> Millis {
        let from = self.reps[s as usize][r];
        let g = cx.session_gpus(s);
        let k = kernel(s);
        cx.c.remove_kernel(from, &k, g, cx.now);
        self.member_remove(from, s);
        cx.c.add_kernel(to, &k, g, cx.now);
        self.member_add(to, s);
        self.reps[s as usize][r] = to;
        let host = cx.c.host_mut(to);
        let prewarmed = host.warm > 0;
        if prewarmed {
            host.warm -= 1;
            self.takes.push_back(cx.now);
            self.refill_pool(cx, to);
        }
        let cost = cx.m.costs.move_ms(prewarmed, cx.namespace_mib(s));
        let ready = self.take_move_slot(cx, to, cost);
        self.ready_at[s as usize][r] = ready;
        cx.migration_ms += cost;
        match kind {
            MoveKind::Cell => cx.migrations += 1,
            MoveKind::Background => cx.background_moves += 1,
        }
        ready
    }

    /// Reserves the move slot on `h` that frees first for a move of `cost` ms; returns
    /// when that move ends (a slot is held from the move's start to its end).
    fn take_move_slot(&mut self, cx: &Ctx<'_>, h: u32, cost: Millis) -> Millis {
        let cap = cx.m.costs.max_moves_per_host.max(1) as usize;
        let i = h as usize;
        if self.move_slots.len() <= i {
            self.move_slots.resize(i + 1, Vec::new());
        }
        let slots = &mut self.move_slots[i];
        slots.resize(cap, 0);
        let (j, free) = slots.iter().copied().enumerate().min_by_key(|&(j, t)| (t, j)).unwrap_or((0, 0));
        let end = cx.now.max(free) + cost;
        slots[j] = end;
        end
    }

    /// A replica of `s` still moving onto a host that can commit `g` GPUs now: the one
    /// ready first, with when.
    fn moving_replica_for(&self, cx: &Ctx<'_>, s: u32, g: u32) -> Option<(usize, Millis)> {
        self.reps[s as usize]
            .iter()
            .zip(self.ready_at[s as usize])
            .enumerate()
            .filter(|&(_, (&h, at))| {
                at > cx.now && cx.c.host(h).state == HostState::Up && cx.c.host(h).sched.available() >= g
            })
            .map(|(r, (_, at))| (r, at))
            .min_by_key(|&(r, at)| (at, r))
    }

    /// The executor candidates; a replica still moving is live only when `moving_counts`
    /// (the cover check: it will be ready for the next cell).
    fn candidates(&self, cx: &Ctx<'_>, s: u32, moving_counts: bool) -> Vec<Candidate> {
        self.reps[s as usize]
            .iter()
            .zip(self.ready_at[s as usize])
            .enumerate()
            .map(|(r, (&h, at))| {
                let host = cx.c.host(h);
                Candidate {
                    replica: u32::try_from(r + 1).unwrap_or(NONE),
                    node_id: u64::from(h),
                    live: host.state == HostState::Up && (moving_counts || at <= cx.now),
                    gpus_idle: host.sched.available(),
                    local: false,
                }
            })
            .collect()
    }

    fn migration_for(&self, cx: &Ctx<'_>, s: u32, ratio: f64) -> Option<(usize, u32)> {
        let replicas: Vec<migrate::ReplicaAt> = self.reps[s as usize]
            .iter()
            .enumerate()
            .map(|(r, &h)| migrate::ReplicaAt {
                replica: u32::try_from(r + 1).unwrap_or(NONE),
                node_id: u64::from(h),
                host_subscribed: cx.c.host(h).subscribed,
            })
            .collect();
        let targets: Vec<migrate::CandidateHost> =
            cx.c.up_hosts()
                .iter()
                .map(|&h| {
                    let host = cx.c.host(h);
                    migrate::CandidateHost {
                        node_id: u64::from(h),
                        gpus_total: cx.c.gpus_per_host(),
                        gpus_available: host.sched.available(),
                        subscribed_gpus: host.subscribed,
                    }
                })
                .collect();
        migrate::choose(&replicas, &targets, cx.session_gpus(s), ratio)
            .map(|m| (m.replica as usize - 1, u32::try_from(m.to).unwrap_or(NONE)))
    }

    /// Ours: every idle kernel keeps a replica on a host that can run its next cell at
    /// once; one that has none gets an idle replica moved (in the background, during the
    /// user's think time) to the host [`migrate::choose`] picks. Largest kernels first:
    /// they are the hardest to fit.
    fn cover(&mut self, cx: &mut Ctx<'_>) {
        if self.variant != Variant::Ours {
            return;
        }
        let mut idle: Vec<u32> = self
            .live
            .iter()
            .copied()
            .filter(|&s| self.ready[s as usize] && !self.running[s as usize] && !self.submitted[s as usize])
            .collect();
        idle.sort_by_key(|&s| (std::cmp::Reverse(cx.session_gpus(s)), s));
        let ratio = cx.m.subscription_ratio;
        for s in idle {
            let g = cx.session_gpus(s);
            if executor::covered(&self.candidates(cx, s, true), g) {
                continue;
            }
            let Some((r, to)) = self.migration_for(cx, s, ratio) else { continue };
            self.move_replica(cx, s, r, to, MoveKind::Background);
            if self.prev[s as usize] == Some(u32::try_from(r + 1).unwrap_or(NONE)) {
                self.prev[s as usize] = None;
            }
        }
    }

    fn run_or_wait(&mut self, cx: &mut Ctx<'_>, s: u32) {
        if !self.try_run(cx, s) {
            self.waiting.push_back(s);
            // A host is coming for it: claim a booting one, or request one.
            if self.claims >= cx.c.provisioning() {
                cx.request_host();
            }
            self.claims += 1;
        }
    }

    fn retry_waiting(&mut self, cx: &mut Ctx<'_>) {
        for _ in 0..self.waiting.len() {
            let Some(s) = self.waiting.pop_front() else { break };
            if self.try_run(cx, s) {
                self.claims = self.claims.saturating_sub(1);
            } else {
                self.waiting.push_back(s);
            }
        }
    }

    /// Releases up to `n` idle hosts whose replicas can all move elsewhere, never going
    /// below the model's minimum hosts.
    fn drain(&mut self, cx: &mut Ctx<'_>, n: u32) {
        let n = n.min(cx.c.alive().saturating_sub(cx.m.min_hosts));
        let cands: Vec<drain::Candidate> =
            cx.c.up_hosts()
                .iter()
                .map(|&h| {
                    let host = cx.c.host(h);
                    drain::Candidate {
                        node_id: u64::from(h),
                        committed_gpus: host.sched.committed(),
                        bound_gpus: host.sched.bound(),
                        replicas: host.replicas,
                    }
                })
                .collect();
        let mut released = 0;
        let mut gone: Vec<u32> = Vec::new();
        for id in drain::choose(&cands, cands.len()) {
            if released >= n {
                break;
            }
            let h = index(id);
            let ratio = self.ratio(cx, 0);
            // Dry run on a copy of the loads: every replica here needs a new host.
            let mut skip = gone.clone();
            skip.push(h);
            let mut loads = Self::loads(cx, &skip);
            let members = self.members.get(h as usize).cloned().unwrap_or_default();
            let mut plan = Vec::new();
            for &s in &members {
                let g = cx.session_gpus(s);
                let exclude: Vec<u64> = self.reps[s as usize].iter().map(|&x| u64::from(x)).collect();
                let Some(to) = placement::replace(&loads, g, ratio, &exclude) else {
                    plan.clear();
                    break;
                };
                if let Some(l) = loads.iter_mut().find(|l| l.node_id == to) {
                    l.subscribed_gpus += g;
                    l.replicas += 1;
                }
                plan.push((s, index(to)));
            }
            if plan.len() != members.len() {
                continue;
            }
            for (s, to) in plan {
                if let Some(r) = self.reps[s as usize].iter().position(|&x| x == h) {
                    self.move_replica(cx, s, r, to, MoveKind::Background);
                }
            }
            cx.c.release(h, cx.now);
            gone.push(h);
            released += 1;
        }
    }
}

fn index(id: u64) -> u32 {
    u32::try_from(id).unwrap_or(NONE)
}

impl Policy for Replicated {
    fn init(&mut self, cx: &mut Ctx<'_>) {
        if self.variant == Variant::Ours {
            self.peak = Some(PeakTracker::new(cx.m.peak_window_ms));
        }
    }

    fn session_start(&mut self, cx: &mut Ctx<'_>, s: u32) {
        self.pending_place.push_back(s);
        self.place_pending(cx);
    }

    fn submit(&mut self, cx: &mut Ctx<'_>, s: u32) {
        self.submitted[s as usize] = true;
        if self.ready[s as usize] {
            self.run_or_wait(cx, s);
        }
    }

    fn ready(&mut self, cx: &mut Ctx<'_>, s: u32, _host: u32) {
        self.ready[s as usize] = true;
        if self.submitted[s as usize] {
            self.run_or_wait(cx, s);
        }
    }

    fn training_end(&mut self, cx: &mut Ctx<'_>, s: u32, host: u32) {
        let cell = format!("s{s}c{}", cx.training_index(s));
        cx.c.finish(host, &kernel(s), &cell, cx.now);
        self.running[s as usize] = false;
        match self.variant {
            Variant::Paper => {
                cx.c.tick(host, cx.now);
            }
            Variant::Ours => cx.q.push(cx.now + cx.m.idle_release_ms, Ev::IdleCheck(host)),
        }
        self.retry_waiting(cx);
        self.cover(cx);
    }

    fn idle_check(&mut self, cx: &mut Ctx<'_>, h: u32) {
        if cx.c.host(h).state == HostState::Up {
            cx.c.tick(h, cx.now);
        }
    }

    fn session_stop(&mut self, cx: &mut Ctx<'_>, s: u32) {
        let g = cx.session_gpus(s);
        let k = kernel(s);
        for h in std::mem::replace(&mut self.reps[s as usize], [NONE; REPLICAS]) {
            if h != NONE && cx.c.host(h).state != HostState::Released {
                cx.c.remove_kernel(h, &k, g, cx.now);
                self.member_remove(h, s);
            }
        }
        self.live_demand = self.live_demand.saturating_sub(g);
        self.live.remove(&s);
        self.place_pending(cx);
    }

    fn host_up(&mut self, cx: &mut Ctx<'_>, h: u32) {
        self.refill_pool(cx, h);
        self.place_pending(cx);
        self.retry_waiting(cx);
        // A booting host claimed by a cell that has run meanwhile is free for others.
        self.claims = self.claims.min(cx.c.provisioning());
        self.cover(cx);
    }

    fn scale_tick(&mut self, cx: &mut Ctx<'_>) {
        let g = cx.c.gpus_per_host();
        let committed = cx.c.committed_now();
        let decision = match self.variant {
            Variant::Paper => {
                let d = scale::PaperRule::default();
                let rule = scale::PaperRule { min_hosts: d.min_hosts.max(cx.m.min_hosts), ..d };
                scale::paper(&rule, cx.c.alive(), committed, g)
            }
            Variant::Ours => {
                let waiting: u32 = self.waiting.iter().map(|&s| cx.training(s).gpus).sum();
                let now = cx.now;
                let peak = self.peak.as_mut().map_or(0, |p| {
                    p.record(now, committed + waiting);
                    p.peak(now)
                });
                let rule = scale::OursRule { spare_hosts: cx.m.spare_hosts, ..scale::OursRule::default() };
                let free = cx.c.provisioning()
                    + u32::try_from(cx.c.up_hosts().iter().filter(|&&h| cx.c.host(h).sched.committed() == 0).count())
                        .unwrap_or(u32::MAX);
                scale::ours(&rule, cx.c.alive(), free, peak, cx.c.subscribed_now(), cx.m.subscription_ratio, g)
            }
        };
        match decision {
            Scale::Out(n) => {
                for _ in 0..n {
                    cx.request_host();
                }
            }
            Scale::In(n) if self.waiting.is_empty() && self.pending_place.is_empty() => self.drain(cx, n),
            Scale::In(_) | Scale::Hold => {}
        }
        self.cover(cx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::cluster::SimCluster;
    use crate::sim::costs::{Costs, StartKind};
    use crate::sim::events::Queue;
    use crate::sim::rng::Rng;
    use crate::sim::workload::{Session, Training, Workload};
    use crate::sim::Model;

    /// Cold start 3 s, pre-warmed 0.2 s, transfer 1 s + 10 ms/MiB, `cap` moves per host.
    fn model(cap: u32) -> Model {
        let mut c = Costs::measured();
        c.replica_start.cold_ms = 3_000.0;
        c.replica_start.prewarmed_ms = 200.0;
        c.state_transfer.move_base_ms = 1_200.0;
        c.state_transfer.bench_start = StartKind::Prewarmed;
        c.state_transfer.per_mib_ms = 10.0;
        c.max_moves_per_host = cap;
        Model { gpus_per_host: 1, costs: c, ..Model::default() }
    }

    /// `n` one-GPU sessions of 100 MiB, one 60 s training each.
    fn workload(n: usize) -> Workload {
        let s = Session {
            start: 0,
            stop: 3_600_000,
            gpus: 1,
            trainings: vec![Training { submit: 0, duration: 60_000, gpus: 1 }],
            namespace_mib: 100,
        };
        Workload::new("t".into(), vec![s; n])
    }

    /// A cluster of `hosts` one-GPU hosts, all up, the sessions placed and ready.
    fn setup<'a>(w: &'a Workload, m: &'a Model, hosts: u32) -> (Replicated, Ctx<'a>) {
        let n = w.sessions.len();
        let mut cx = Ctx {
            w,
            m,
            q: Queue::default(),
            c: SimCluster::new(1, m.idle_release_ms, 1e9),
            rng: Rng::new(1, 1),
            now: 0,
            next: vec![0; n],
            submitted_at: vec![0; n],
            delays_ms: Vec::new(),
            migrations: 0,
            background_moves: 0,
            migration_ms: 0,
            completed: 0,
        };
        let mut p = Replicated::new(n, Variant::Ours);
        p.init(&mut cx);
        for _ in 0..hosts {
            let h = cx.c.request(0);
            cx.c.up(h);
        }
        for s in 0..n {
            p.session_start(&mut cx, index(s as u64));
            p.ready[s] = true;
        }
        (p, cx)
    }

    /// A host of none of session 0's replicas.
    fn other_host(p: &Replicated, cx: &Ctx<'_>) -> u32 {
        cx.c.up_hosts().iter().copied().find(|h| !p.reps[0].contains(h)).expect("a free host")
    }

    #[test]
    fn a_move_charges_a_replica_start_and_the_state_transfer() {
        let (w, m) = (workload(1), model(2));
        let (mut p, mut cx) = setup(&w, &m, 4);
        let to = other_host(&p, &cx);
        cx.now = 10_000;
        // Cold: 3 s start + 1 s + 100 MiB × 10 ms.
        assert_eq!(p.move_replica(&mut cx, 0, 0, to, MoveKind::Background), 10_000 + 5_000);
        assert_eq!((cx.background_moves, cx.migration_ms), (1, 5_000));
        // Back onto a host with a warm container: 0.2 s start.
        let back = other_host(&p, &cx);
        cx.c.host_mut(back).warm = 1;
        assert_eq!(p.move_replica(&mut cx, 0, 1, back, MoveKind::Cell), 10_000 + 2_200);
        assert_eq!((cx.migrations, cx.migration_ms, cx.c.host(back).warm), (1, 7_200, 0));
    }

    #[test]
    fn a_cell_waits_for_its_moving_replica() {
        let (w, m) = (workload(1), model(2));
        let (mut p, mut cx) = setup(&w, &m, 4);
        let to = other_host(&p, &cx);
        let ready = p.move_replica(&mut cx, 0, 0, to, MoveKind::Background);
        // The other two replicas' hosts are busy; the moving one's host is free.
        for r in 1..REPLICAS {
            let h = p.reps[0][r];
            cx.c.add_kernel(h, "x", 1, 0);
            assert!(cx.c.commit(h, "x", "x1", 1, 0));
        }
        cx.now = 1_000;
        cx.submitted_at[0] = 1_000;
        p.submit(&mut cx, 0);
        assert_eq!(cx.delays_ms, vec![ready - 1_000 + m.election_ms], "starts once the move is done");
        assert_eq!(cx.migrations, 0, "no second replica moved");
        assert_eq!(cx.c.host(to).sched.committed(), 1, "its GPU held for it meanwhile");
    }

    #[test]
    fn the_per_host_cap_delays_the_extra_move() {
        let (w, m) = (workload(3), model(2));
        let (mut p, mut cx) = setup(&w, &m, 10);
        // One host that holds none of the three sessions' replicas.
        let to = cx.c.up_hosts().iter().copied().find(|h| p.reps.iter().all(|r| !r.contains(h))).expect("a host");
        let ends: Vec<Millis> = (0..3).map(|s| p.move_replica(&mut cx, s, 0, to, MoveKind::Background)).collect();
        assert_eq!(ends, vec![5_000, 5_000, 10_000], "two at once, the third after the first slot frees");
        assert_eq!(cx.migration_ms, 15_000, "the wait is not charged as move time");
    }
}
