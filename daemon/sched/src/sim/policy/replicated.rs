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
//! - `notebookos`, what `notebookosd` runs, with its parameters ([`crate::policy::PolicyConfig`],
//!   `Model::notebookos`) and its decisions, each recorded with [`Ctx::decided`] so that a
//!   test checks the daemon calls it too: placement within the configured subscription
//!   ratio; all YIELD: [`migrate::choose`] (best fit, distinct hosts); idle-held GPUs
//!   released after `idle_release`; each host's pre-warm pool sized by
//!   [`prewarm::pool_size`] between `prewarm_min` and `prewarm_max`; the autoscaler is the
//!   daemon's [`Decider`] (its configured rule) every `interval`, fed the unmet demand the
//!   daemon's meta leader notes (refused kernels, cells with no host to move to; it asks
//!   for no host otherwise); a scale-in drains the hosts [`drain::choose`] picks, their
//!   replicas re-placed by [`placement::replace`].
//!
//! Both account host memory: every replica holds an idle kernel plus the session's
//! namespace ([`Ctx::replica_memory_mib`]), and placement, replacement and the migration
//! target skip hosts that would exceed `Model::host_memory_mib`.

use std::collections::VecDeque;

use super::api::Policy;
use crate::autoscaler::{ClusterNow, Decider};
use crate::fairshare::{self, Ledger};
use crate::placement::{self, HostLoad, PlacementError};
use crate::preselect::{preselect, Candidate};
use crate::scale::{self, Scale};
use crate::sim::cluster::HostState;
use crate::sim::ctx::Ctx;
use crate::sim::events::Ev;
use crate::{drain, migrate, prewarm, Millis};

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
/// Unmet-demand entries kept per kind (the daemon's `control/meta/demand.rs` keeps 1024).
const NOTED: usize = 1024;

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
    prev: Vec<Option<u32>>,
    pending_place: VecDeque<u32>,
    waiting: VecDeque<u32>,
    claims: u32,
    live_demand: u32,
    members: Vec<Vec<u32>>,
    /// Ours: the daemon's autoscaler decision, with its peak of demand.
    decider: Option<Decider>,
    /// Ours: unmet demand as the daemon's meta leader notes it, `(when, GPUs)`: kernels
    /// placement refused (GPUs × replicas) and cells with no host to move to.
    refused: VecDeque<(Millis, u32)>,
    unmet_cells: VecDeque<(Millis, u32)>,
    /// Ours: pre-warmed containers taken per host (each daemon sizes its own pool).
    takes: Vec<VecDeque<Millis>>,
    /// Ours: each user's recent GPU time, from the GPUs committed to their cells.
    ledger: Ledger,
    /// Users' names in the ledger, by user number.
    user_names: Vec<String>,
    /// Per session: its waiting cell's place in arrival order.
    arrival: Vec<u64>,
    arrivals: u64,
    /// Per session: a cell of it holds GPUs now.
    running: Vec<bool>,
    /// Headroom by (user, host), valid while nothing it depends on changed: the time and
    /// `changes` it was computed at (a flood retries hundreds of cells on every host).
    headroom_cache: std::cell::RefCell<HeadroomCache>,
    /// Bumped whenever usage, running cells or a host's kernels change.
    changes: u64,
}

/// Headroom by (user, host), computed at `at` after `changes` changes.
#[derive(Debug, Default)]
struct HeadroomCache {
    at: Millis,
    changes: u64,
    by: std::collections::HashMap<(u32, u32), u32>,
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
            prev: vec![None; n],
            pending_place: VecDeque::new(),
            waiting: VecDeque::new(),
            claims: 0,
            live_demand: 0,
            members: Vec::new(),
            decider: None,
            refused: VecDeque::new(),
            unmet_cells: VecDeque::new(),
            takes: Vec::new(),
            ledger: Ledger::new(fairshare::DEFAULT_HALF_LIFE_MS),
            user_names: Vec::new(),
            arrival: vec![0; n],
            arrivals: 0,
            running: vec![false; n],
            headroom_cache: std::cell::RefCell::new(HeadroomCache::default()),
            changes: 0,
        }
    }

    /// Ours with `gpu.fair_share`: waiting cells go in fair-share order.
    fn fair(&self, cx: &Ctx<'_>) -> bool {
        self.variant == Variant::Ours && cx.m.notebookos.fair_share
    }

    fn user_name(&self, cx: &Ctx<'_>, s: u32) -> &str {
        self.user_names.get(cx.w.user(s) as usize).map_or(fairshare::ANONYMOUS, String::as_str)
    }

    /// The band of session `s`'s owner now (every simulated user has weight 1).
    fn band(&self, cx: &Ctx<'_>, s: u32) -> u64 {
        let p = fairshare::Params { half_life_ms: cx.m.notebookos.fair_share_half_life_ms, ..Default::default() };
        fairshare::band(&self.ledger, self.user_name(cx, s), 1.0, cx.now, &p)
    }

    /// `g` GPUs are committed to session `s`'s cell from now: its owner's GPU time counts.
    fn committed(&mut self, cx: &mut Ctx<'_>, s: u32, g: u32) {
        let user = self.user_name(cx, s).to_owned();
        self.ledger.take(&user, g, cx.now);
        self.submitted[s as usize] = false;
        self.running[s as usize] = true;
        self.changes += 1;
    }

    /// GPUs of host `h` a cell of session `s` may take now: those available, less the
    /// headroom ([`fairshare::headroom`]) its owner must leave there when over their share.
    /// (Where fewer are available than the cell needs, the headroom changes nothing.)
    fn usable(&self, cx: &Ctx<'_>, s: u32, h: u32) -> u32 {
        let available = cx.c.host(h).sched.available();
        if !self.fair(cx) || !cx.m.notebookos.fair_share_headroom || available < cx.training(s).gpus.max(1) {
            return available;
        }
        let user = cx.w.user(s);
        let mut cache = self.headroom_cache.borrow_mut();
        if (cache.at, cache.changes) != (cx.now, self.changes) {
            *cache = HeadroomCache { at: cx.now, changes: self.changes, by: std::collections::HashMap::new() };
        }
        if let Some(&reserve) = cache.by.get(&(user, h)) {
            return available.saturating_sub(reserve);
        }
        let kernels: Vec<fairshare::OnHost<'_>> = self
            .members
            .get(h as usize)
            .map(|m| {
                m.iter()
                    .map(|&o| fairshare::OnHost {
                        user: self.user_name(cx, o),
                        weight: 1.0,
                        gpus: cx.session_gpus(o),
                        running: self.running[o as usize],
                    })
                    .collect()
            })
            .unwrap_or_default();
        let p = fairshare::Params { half_life_ms: cx.m.notebookos.fair_share_half_life_ms, ..Default::default() };
        let reserve = fairshare::headroom(self.user_name(cx, s), 1.0, &kernels, &self.ledger, cx.now, &p);
        cache.by.insert((user, h), reserve);
        available.saturating_sub(reserve)
    }

    /// The subscription ratio placement and migration keep, in subscribed GPUs per host GPU.
    fn ratio(&self, cx: &Ctx<'_>, extra_demand: u32) -> f64 {
        match self.variant {
            Variant::Ours => cx.m.notebookos.subscription_ratio,
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
        self.changes += 1;
        let i = h as usize;
        if self.members.len() <= i {
            self.members.resize(i + 1, Vec::new());
        }
        self.members[i].push(s);
    }

    fn member_remove(&mut self, h: u32, s: u32) {
        self.changes += 1;
        if let Some(v) = self.members.get_mut(h as usize) {
            v.retain(|&x| x != s);
        }
    }

    fn place_pending(&mut self, cx: &mut Ctx<'_>) {
        while let Some(&s) = self.pending_place.front() {
            let g = cx.session_gpus(s);
            let ratio = self.ratio(cx, g);
            cx.decided("placement::place_with_memory");
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
                    self.ready_at[s as usize] = [0; REPLICAS];
                    cx.q.push(cx.now + cx.m.costs.start_ms(false), Ev::Ready { session: s, host: 0 });
                }
                Err(e) if self.variant == Variant::Ours => {
                    if matches!(e, PlacementError::NoMemory { .. }) {
                        cx.memory_refusals += 1;
                    }
                    // As the daemon: the refusal is unmet demand the autoscaler sees.
                    note(&mut self.refused, cx.now, g.saturating_mul(REPLICAS as u32).max(1));
                    break;
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

    /// Host `h`'s pre-warm target.
    fn pool_target(&mut self, cx: &mut Ctx<'_>, h: u32) -> u32 {
        match self.variant {
            Variant::Paper => cx.m.prewarm_per_host,
            // The daemon's pool: `kernel.prewarm_max = 0` is no pool.
            Variant::Ours if cx.m.notebookos.prewarm_max == 0 => 0,
            Variant::Ours => {
                let takes = self.takes_on(h);
                while takes.front().is_some_and(|&t| cx.now.saturating_sub(t) > prewarm::WINDOW_MS) {
                    takes.pop_front();
                }
                let n = u32::try_from(takes.len()).unwrap_or(u32::MAX);
                let p = &cx.m.notebookos;
                let (min, max) = (p.prewarm_min, p.prewarm_max);
                cx.decided("prewarm::pool_size");
                prewarm::pool_size(n, prewarm::WINDOW_MS, cx.m.costs.start_ms(false), min, max)
            }
        }
    }

    fn takes_on(&mut self, h: u32) -> &mut VecDeque<Millis> {
        let i = h as usize;
        if self.takes.len() <= i {
            self.takes.resize(i + 1, VecDeque::new());
        }
        &mut self.takes[i]
    }

    fn refill_pool(&mut self, cx: &mut Ctx<'_>, h: u32) {
        let target = self.pool_target(cx, h);
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
        if self.fair(cx) && cx.m.notebookos.fair_share_headroom {
            cx.decided("fairshare::headroom");
        }
        let cands = self.candidates(cx, s);
        cx.decided("preselect::preselect");
        let lead = preselect(&cands, g, self.prev[s as usize], &[]).map(|round| round.lead);
        if let Some(lead) = lead {
            let h = reps[lead as usize - 1];
            if self.usable(cx, s, h) >= g {
                cx.c.commit(h, &k, &cell, g, cx.now);
                cx.start_training(s, h, cx.m.election_ms);
                self.prev[s as usize] = Some(lead);
                self.committed(cx, s, g);
                return true;
            }
        }
        // No live replica can run it: wait for a moving one whose host can commit now.
        if let Some((r, ready)) = self.moving_replica_for(cx, s, g) {
            let h = reps[r];
            cx.c.commit(h, &k, &cell, g, cx.now);
            cx.start_training(s, h, ready - cx.now + cx.m.election_ms);
            self.prev[s as usize] = Some(u32::try_from(r + 1).unwrap_or(NONE));
            self.committed(cx, s, g);
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
                let mib = cx.replica_memory_mib(s);
                placement::replace_with_memory(&loads, sg, mib, ratio, &exclude).map(|to| (r, index(to)))
            }
        };
        let Some((r, to)) = choice else {
            if self.variant == Variant::Ours {
                // As the daemon's meta leader: a cell with no host to move to is unmet demand.
                note(&mut self.unmet_cells, cx.now, g);
            }
            return false;
        };
        let ready = self.move_replica(cx, s, r, to, MoveKind::Cell);
        // The GPUs are the cell's from now; it runs once the replica has moved.
        cx.c.commit(to, &k, &cell, g, cx.now);
        cx.start_training(s, to, ready - cx.now + cx.m.election_ms);
        self.prev[s as usize] = Some(u32::try_from(r + 1).unwrap_or(NONE));
        self.committed(cx, s, g);
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
            let now = cx.now;
            self.takes_on(to).push_back(now);
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
        let reps = self.reps[s as usize];
        reps.iter()
            .zip(self.ready_at[s as usize])
            .enumerate()
            .filter(|&(_, (&h, at))| at > cx.now && cx.c.host(h).state == HostState::Up)
            .filter(|&(_, (&h, _))| self.usable(cx, s, h) >= g)
            .map(|(r, (_, at))| (r, at))
            .min_by_key(|&(r, at)| (at, r))
    }

    /// The executor candidates; a replica still moving is not live.
    fn candidates(&self, cx: &Ctx<'_>, s: u32) -> Vec<Candidate> {
        let reps = self.reps[s as usize];
        reps.iter()
            .zip(self.ready_at[s as usize])
            .enumerate()
            .map(|(r, (&h, at))| Candidate {
                replica: u32::try_from(r + 1).unwrap_or(NONE),
                node_id: u64::from(h),
                live: cx.c.host(h).state == HostState::Up && at <= cx.now,
                gpus_idle: self.usable(cx, s, h),
                local: false,
            })
            .collect()
    }

    fn migration_for(&self, cx: &mut Ctx<'_>, s: u32, ratio: f64) -> Option<(usize, u32)> {
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
                    let usable = self.usable(cx, s, h);
                    let host = cx.c.host(h);
                    migrate::CandidateHost {
                        node_id: u64::from(h),
                        gpus_total: cx.c.gpus_per_host(),
                        gpus_available: usable,
                        subscribed_gpus: host.subscribed,
                        memory_capacity_mib: cx.m.host_memory_mib,
                        memory_used_mib: host.memory_mib,
                    }
                })
                .collect();
        cx.decided("migrate::choose_with_memory");
        migrate::choose_with_memory(&replicas, &targets, cx.session_gpus(s), cx.replica_memory_mib(s), ratio)
            .map(|m| (m.replica as usize - 1, u32::try_from(m.to).unwrap_or(NONE)))
    }

    fn run_or_wait(&mut self, cx: &mut Ctx<'_>, s: u32) {
        self.arrival[s as usize] = self.arrivals;
        self.arrivals += 1;
        // Fair share: a cell does not pass a waiting cell of a user further below their share.
        if self.fair(cx) && !self.waiting.is_empty() {
            let mine = self.band(cx, s);
            if self.waiting.iter().any(|&o| self.band(cx, o) < mine) {
                note(&mut self.unmet_cells, cx.now, cx.training(s).gpus);
                self.waiting.push_back(s);
                self.retry_waiting(cx);
                return;
            }
        }
        if !self.try_run(cx, s) {
            self.waiting.push_back(s);
            if self.variant == Variant::Ours {
                return; // the autoscaler sees it as unmet demand
            }
            // A host is coming for it: claim a booting one, or request one.
            if self.claims >= cx.c.provisioning() {
                cx.request_host();
            }
            self.claims += 1;
        }
    }

    fn retry_waiting(&mut self, cx: &mut Ctx<'_>) {
        if self.fair(cx) {
            self.retry_in_fair_share_order(cx);
            return;
        }
        for _ in 0..self.waiting.len() {
            let Some(s) = self.waiting.pop_front() else { break };
            if self.try_run(cx, s) {
                self.claims = self.claims.saturating_sub(1);
            } else {
                self.waiting.push_back(s);
            }
        }
    }

    /// Ours with fair share, as the daemon's hosts serve their queues (head of line): the
    /// waiting cells in [`fairshare::order`]; once one cannot run, cells of users with more
    /// recent GPU time (a higher band) wait too rather than take the GPUs it waits for, so a
    /// light user's 8-GPU cell is not starved by a heavy user's stream of small ones (the
    /// GPUs freed meanwhile stay free until a host has its 8). Holding one host for it
    /// instead was tried and made light users wait longer (docs/simulator.md). With no GPU
    /// available anywhere nothing can run, and the rest wait without trying.
    fn retry_in_fair_share_order(&mut self, cx: &mut Ctx<'_>) {
        if self.waiting.is_empty() {
            return;
        }
        let waiting: Vec<u32> = self.waiting.drain(..).collect();
        let params = fairshare::Params { half_life_ms: cx.m.notebookos.fair_share_half_life_ms, ..Default::default() };
        let cells: Vec<fairshare::Waiting<'_>> = waiting
            .iter()
            .map(|&s| fairshare::Waiting {
                user: self.user_name(cx, s),
                weight: 1.0,
                arrival: self.arrival[s as usize],
            })
            .collect();
        cx.decided("fairshare::order");
        let order = fairshare::order(&cells, &self.ledger, cx.now, &params);
        let bands: Vec<u64> = order.iter().map(|&i| self.band(cx, waiting[i])).collect();
        let mut blocked_above: Option<u64> = None;
        for (i, band) in order.into_iter().zip(bands) {
            let s = waiting[i];
            let gpus_anywhere = cx.c.up_hosts().iter().any(|&h| cx.c.host(h).sched.available() > 0);
            let held_back = blocked_above.is_some_and(|b| band > b);
            if !held_back && gpus_anywhere && self.try_run(cx, s) {
                continue;
            }
            if held_back || !gpus_anywhere {
                // As `try_run` notes a cell that found no host: unmet demand.
                note(&mut self.unmet_cells, cx.now, cx.training(s).gpus);
            }
            blocked_above.get_or_insert(band);
            self.waiting.push_back(s);
        }
    }

    /// Releases up to `n` idle hosts whose replicas can all move elsewhere. Ours drains
    /// the `n` hosts [`drain::choose`] picks, as the daemon does (one whose replicas find
    /// no host stays: the daemon's release of it fails, and it never releases a seed);
    /// the paper's tries further hosts, seeds too.
    fn drain(&mut self, cx: &mut Ctx<'_>, n: u32) {
        let n = n.min(cx.c.alive().saturating_sub(cx.m.min_hosts()));
        let seeds = match self.variant {
            Variant::Ours => cx.c.seeds,
            Variant::Paper => 0,
        };
        let cands: Vec<drain::Candidate> =
            cx.c.up_hosts()
                .iter()
                .filter(|&&h| h >= seeds)
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
        let chosen = match self.variant {
            Variant::Ours => n as usize,
            Variant::Paper => cands.len(),
        };
        cx.decided("drain::choose");
        for id in drain::choose(&cands, chosen) {
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
                cx.decided("placement::replace_with_memory");
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

/// Notes unmet demand, keeping the last [`NOTED`] entries as the daemon's meta leader does.
fn note(q: &mut VecDeque<(Millis, u32)>, now: Millis, gpus: u32) {
    if q.len() >= NOTED {
        q.pop_front();
    }
    q.push_back((now, gpus));
}

fn index(id: u64) -> u32 {
    u32::try_from(id).unwrap_or(NONE)
}

impl Policy for Replicated {
    fn init(&mut self, cx: &mut Ctx<'_>) {
        if self.variant == Variant::Ours {
            self.decider = Some(Decider::new(&cx.m.notebookos.autoscale));
        }
        self.ledger = Ledger::new(cx.m.notebookos.fair_share_half_life_ms);
        let users = cx.w.users.iter().copied().max().map_or(1, |m| m + 1);
        self.user_names = (0..users).map(|u| format!("u{u}")).collect();
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
        let (user, g) = (self.user_name(cx, s).to_owned(), cx.training(s).gpus);
        self.ledger.give_back(&user, g, cx.now);
        self.running[s as usize] = false;
        self.changes += 1;
        match self.variant {
            Variant::Paper => {
                cx.c.tick(host, cx.now);
            }
            Variant::Ours => cx.q.push(cx.now + cx.m.notebookos.idle_release_ms, Ev::IdleCheck(host)),
        }
        self.retry_waiting(cx);
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
        self.place_pending(cx);
    }

    fn host_up(&mut self, cx: &mut Ctx<'_>, h: u32) {
        self.refill_pool(cx, h);
        self.place_pending(cx);
        self.retry_waiting(cx);
        // A booting host claimed by a cell that has run meanwhile is free for others.
        self.claims = self.claims.min(cx.c.provisioning());
    }

    fn scale_tick(&mut self, cx: &mut Ctx<'_>) {
        let decision = match self.variant {
            Variant::Paper => {
                let d = scale::PaperRule::default();
                let rule = scale::PaperRule { min_hosts: d.min_hosts.max(cx.m.min_hosts()), ..d };
                scale::paper(&rule, cx.c.alive(), cx.c.committed_now(), cx.c.gpus_per_host())
            }
            Variant::Ours => self.decide(cx),
        };
        match decision {
            Scale::Out(n) => {
                for _ in 0..n {
                    cx.request_host();
                }
            }
            Scale::In(n) if self.variant == Variant::Ours => self.drain(cx, n),
            Scale::In(n) if self.waiting.is_empty() && self.pending_place.is_empty() => self.drain(cx, n),
            Scale::In(_) | Scale::Hold => {}
        }
    }
}

impl Replicated {
    /// Ours: the daemon's autoscaler decision on the cluster as its meta leader sees it.
    fn decide(&mut self, cx: &mut Ctx<'_>) -> Scale {
        let p = cx.m.notebookos;
        // The daemon counts unmet demand noted over the last two intervals; waiting
        // cells and kernels ask again while they wait (as the daemon's do).
        let recent = 2 * p.autoscale.interval_ms;
        for &s in &self.pending_place {
            note(&mut self.refused, cx.now, cx.session_gpus(s).saturating_mul(REPLICAS as u32).max(1));
        }
        for &s in &self.waiting {
            note(&mut self.unmet_cells, cx.now, cx.training(s).gpus);
        }
        let now = cx.now;
        let peak = |q: &mut VecDeque<(Millis, u32)>| {
            while q.front().is_some_and(|&(t, _)| now.saturating_sub(t) > recent) {
                q.pop_front();
            }
            q.iter().map(|&(_, g)| g).max().unwrap_or(0)
        };
        let up = cx.c.up_hosts();
        let free = up.iter().filter(|&&h| cx.c.host(h).sched.committed() == 0).count();
        let c = ClusterNow {
            hosts: u32::try_from(up.len()).unwrap_or(u32::MAX),
            booting: cx.c.provisioning(),
            free_hosts: u32::try_from(free).unwrap_or(u32::MAX),
            committed_gpus: cx.c.committed_now(),
            subscribed_gpus: cx.c.subscribed_now(),
            gpus_per_host: cx.c.gpus_per_host(),
            refused_subscription: peak(&mut self.refused),
            waiting_gpus: peak(&mut self.unmet_cells),
        };
        let ratio = p.subscription_ratio;
        cx.decided("autoscaler::Decider::decide");
        self.decider.as_mut().map_or(Scale::Hold, |d| d.decide(now, &c, ratio))
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
            c: SimCluster::new(1, m.notebookos.idle_release_ms, 1e9),
            rng: Rng::new(1, 1),
            now: 0,
            next: vec![0; n],
            submitted_at: vec![0; n],
            waiting: vec![false; n],
            delays_ms: Vec::new(),
            delay_sessions: Vec::new(),
            served_gpu_ms: vec![0; n],
            migrations: 0,
            background_moves: 0,
            migration_ms: 0,
            memory_refusals: 0,
            decisions: std::collections::BTreeSet::new(),
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
