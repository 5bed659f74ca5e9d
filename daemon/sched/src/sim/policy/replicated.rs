//! Three replicas per session on distinct hosts, GPUs bound only while a training runs.
//!
//! Both variants place a session's replicas with [`placement::place`] (least subscribed
//! hosts first), choose each training's executor with [`preselect`] (the previous
//! executor if its host can commit the GPUs now, else the replica whose host has most
//! available), and commit GPUs through each host's [`crate::HostScheduler`]. When
//! no replica's host can commit (all YIELD), a replica migrates to a host that can: it
//! loads the notebook's state (`state_load`), in a pre-warmed container if the target
//! has one (else `container_start` more). With no such host, the cell waits for a host
//! to be provisioned (15 ± 2 s) or for GPUs to free up, whichever comes first.
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
//!
//! Both account host memory: every replica holds an idle kernel plus the session's
//! namespace ([`Ctx::replica_memory_mib`]), and placement, replacement and the migration
//! target skip hosts that would exceed `Model::host_memory_mib`.

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
const NONE: u32 = u32::MAX;

/// The policy's state.
#[derive(Debug)]
pub struct Replicated {
    variant: Variant,
    reps: Vec<[u32; REPLICAS]>,
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
                    memory_capacity_mib: cx.m.host_memory_mib,
                    memory_used_mib: host.memory_mib,
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
            let mib = cx.replica_memory_mib(s);
            cx.c.size_kernel(&kernel(s), mib);
            match placement::place_with_memory(&Self::loads(cx, &[]), g, mib, REPLICAS, ratio) {
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
                    cx.q.push(cx.now + cx.m.container_start_ms, Ev::Ready { session: s, host: 0 });
                }
                Err(e) => {
                    let need = match e {
                        PlacementError::TooFewHosts { needed, up, .. } => needed.saturating_sub(up),
                        PlacementError::NoRoom { needed, eligible, .. } => needed.saturating_sub(eligible),
                        PlacementError::NoMemory { needed, eligible, .. } => {
                            cx.memory_refusals += 1;
                            needed.saturating_sub(eligible)
                        }
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
                prewarm::pool_size(takes, window, cx.m.container_start_ms, 1, cx.m.prewarm_per_host.max(1))
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
                cx.q.push(cx.now + cx.m.container_start_ms, Ev::Refill(h));
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
        let cands = self.candidates(cx, s);
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
                let mib = cx.replica_memory_mib(s);
                placement::replace_with_memory(&loads, sg, mib, ratio, &exclude).map(|to| (r, index(to)))
            }
        };
        let Some((r, to)) = choice else { return false };
        let from = reps[r];
        cx.c.remove_kernel(from, &k, sg, cx.now);
        self.member_remove(from, s);
        cx.c.add_kernel(to, &k, sg, cx.now);
        self.member_add(to, s);
        self.reps[s as usize][r] = to;
        cx.migrations += 1;
        let mut extra = cx.m.election_ms + cx.m.state_load_ms;
        let host = cx.c.host_mut(to);
        if host.warm > 0 {
            host.warm -= 1;
            self.takes.push_back(cx.now);
            self.refill_pool(cx, to);
        } else {
            extra += cx.m.container_start_ms;
        }
        cx.c.commit(to, &k, &cell, g, cx.now);
        cx.start_training(s, to, extra);
        self.prev[s as usize] = Some(u32::try_from(r + 1).unwrap_or(NONE));
        self.submitted[s as usize] = false;
        self.running[s as usize] = true;
        self.cover(cx);
        true
    }

    fn candidates(&self, cx: &Ctx<'_>, s: u32) -> Vec<Candidate> {
        self.reps[s as usize]
            .iter()
            .enumerate()
            .map(|(r, &h)| {
                let host = cx.c.host(h);
                Candidate {
                    replica: u32::try_from(r + 1).unwrap_or(NONE),
                    node_id: u64::from(h),
                    live: host.state == HostState::Up,
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
                        memory_capacity_mib: cx.m.host_memory_mib,
                        memory_used_mib: host.memory_mib,
                    }
                })
                .collect();
        migrate::choose_with_memory(&replicas, &targets, cx.session_gpus(s), cx.replica_memory_mib(s), ratio)
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
            if executor::covered(&self.candidates(cx, s), g) {
                continue;
            }
            let Some((r, to)) = self.migration_for(cx, s, ratio) else { continue };
            let from = self.reps[s as usize][r];
            let k = kernel(s);
            cx.c.remove_kernel(from, &k, g, cx.now);
            self.member_remove(from, s);
            cx.c.add_kernel(to, &k, g, cx.now);
            self.member_add(to, s);
            self.reps[s as usize][r] = to;
            if self.prev[s as usize] == Some(u32::try_from(r + 1).unwrap_or(NONE)) {
                self.prev[s as usize] = None;
            }
            cx.background_moves += 1;
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

    /// Releases up to `n` idle hosts whose replicas can all move elsewhere.
    fn drain(&mut self, cx: &mut Ctx<'_>, n: u32) {
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
                let mib = cx.replica_memory_mib(s);
                let Some(to) = placement::replace_with_memory(&loads, g, mib, ratio, &exclude) else {
                    plan.clear();
                    break;
                };
                if let Some(l) = loads.iter_mut().find(|l| l.node_id == to) {
                    l.subscribed_gpus += g;
                    l.replicas += 1;
                    l.memory_used_mib += mib;
                }
                plan.push((s, index(to)));
            }
            if plan.len() != members.len() {
                continue;
            }
            for (s, to) in plan {
                let g = cx.session_gpus(s);
                let k = kernel(s);
                cx.c.remove_kernel(h, &k, g, cx.now);
                cx.c.add_kernel(to, &k, g, cx.now);
                self.member_remove(h, s);
                self.member_add(to, s);
                if let Some(slot) = self.reps[s as usize].iter_mut().find(|x| **x == h) {
                    *slot = to;
                }
                cx.background_moves += 1;
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
            Variant::Paper => scale::paper(&scale::PaperRule::default(), cx.c.alive(), committed, g),
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
