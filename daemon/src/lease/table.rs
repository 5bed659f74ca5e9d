//! The lease table: which kernel process holds which GPUs, as a pure state machine.
//!
//! Per process: `Unbound -> Requested -> Bound -> IdleHeld -> Revoking -> Unbound`
//! (DESIGN.md). No I/O and no clock: the server passes `now` in and carries out the
//! [`Action`]s the table returns, so every scenario test is deterministic.
//!
//! Policy: a request is granted as soon as enough GPUs are free, preferring the GPUs the
//! process used last (no remapping on restore). A bound lease whose process made no
//! gated call for `idle_grace` becomes idle-held; an idle-held lease is revoked when a
//! waiting request needs its GPUs, or once it has been idle for `idle_release`.
//!
//! Fences: an eviction that was tried and left the process's memory on its GPUs (lock
//! timed out, checkpoint failed, or memory still there after a "successful" checkpoint)
//! fences those GPUs. A fenced GPU is granted to no process but its holder (whose memory
//! it is), until the server sees the memory gone and calls [`Table::unfence`]. So a grant
//! never hands a process a GPU with another process's memory on it.
//!
//! The scheduler core decides which GPUs a kernel's cell gets; the server passes that
//! decision in with [`Table::assign`]. A process with an assignment is granted exactly
//! those GPUs and waits while any of them is held (no fallback to other free GPUs), so
//! the scheduler and the lease table never disagree on who holds what.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::gpu::control::EvictionFailure;

/// Why a GPU is not granted: whose memory is still on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The process whose memory is on the GPU.
    pub holder: u32,
    /// Its kernel's id (for status: the process may be gone before its memory is).
    pub kernel_id: String,
    /// Why its eviction failed.
    pub reason: EvictionFailure,
    /// When the GPU was fenced.
    pub since: Instant,
}

/// A lease's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseState {
    /// No GPUs; nothing asked.
    Unbound,
    /// Asked for GPUs; waiting.
    Requested,
    /// GPUs bound and in use.
    Bound,
    /// GPUs bound, no recent activity.
    IdleHeld,
    /// Revoke sent; waiting for the shim's release and the eviction.
    Revoking,
}

/// What the server must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Restore (when `restore_from` is set) the process's memory onto `gpus`, then send Grant.
    Grant {
        /// The process.
        pid: u32,
        /// Lease number.
        lease: u64,
        /// GPU indices, in virtual ordinal order.
        gpus: Vec<usize>,
        /// GPUs the process's memory was checkpointed from, in the same order.
        restore_from: Option<Vec<usize>>,
    },
    /// Send Revoke.
    Revoke {
        /// The process.
        pid: u32,
        /// Lease number.
        lease: u64,
    },
}

/// One kernel process in the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// State.
    pub state: LeaseState,
    /// GPUs wanted.
    pub want: usize,
    /// Current (or last) lease number.
    pub lease: u64,
    /// GPUs bound (empty unless Bound/IdleHeld/Revoking).
    pub gpus: Vec<usize>,
    /// GPUs it held last (preferred at the next grant: no remapping).
    pub last_gpus: Vec<usize>,
    /// Its memory was checkpointed off `last_gpus` (a grant must restore it). False after
    /// a resident eviction (driver without the checkpoint API): memory stayed on `last_gpus`.
    pub checkpointed: bool,
    /// Last time its activity counter moved (or it was granted).
    pub last_active: Instant,
    /// Last activity counter seen.
    pub calls: u64,
    /// When it entered Requested (acquire latency).
    pub requested_at: Option<Instant>,
    /// A failed restore is retried no earlier than this.
    pub retry_after: Option<Instant>,
    /// Restores that failed in a row (0 after a grant that restored or needed no restore).
    pub restore_failures: u32,
    /// A request arrived while the revocation was still in flight (the shim unbinds,
    /// then reports `Released`; a call in between may already ask again).
    pub request_pending: bool,
    /// GPUs the scheduler assigned to this process: a grant uses exactly these.
    pub assigned: Option<Vec<usize>>,
}

/// Wait before retrying a failed restore.
pub const RETRY: Duration = Duration::from_secs(1);

/// Tunables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// No gated call for this long: Bound -> IdleHeld.
    pub idle_grace: Duration,
    /// Idle-held this long: revoked even without a waiter.
    pub idle_release: Duration,
}

/// The table.
#[derive(Debug)]
pub struct Table {
    policy: Policy,
    gpus: usize,
    /// GPUs an operator (or a test) cordoned: never granted.
    cordoned: Vec<bool>,
    /// GPUs holding memory an eviction could not move off: granted to their holder only.
    fences: Vec<Option<Fence>>,
    /// Hold all grants (drain).
    paused: bool,
    procs: BTreeMap<u32, Entry>,
    next_lease: u64,
}

impl Table {
    /// A table for a host with `gpus` GPUs.
    pub fn new(gpus: usize, policy: Policy) -> Self {
        Self {
            policy,
            gpus,
            cordoned: vec![false; gpus],
            fences: vec![None; gpus],
            paused: false,
            procs: BTreeMap::new(),
            next_lease: 1,
        }
    }

    /// Adds a registered process (Unbound). Wanting more GPUs than the host has is capped.
    pub fn add(&mut self, pid: u32, want: usize, now: Instant) -> usize {
        let want = want.min(self.gpus);
        self.procs.entry(pid).or_insert(Entry {
            state: LeaseState::Unbound,
            want,
            lease: 0,
            gpus: Vec::new(),
            last_gpus: Vec::new(),
            checkpointed: false,
            last_active: now,
            calls: 0,
            requested_at: None,
            retry_after: None,
            restore_failures: 0,
            request_pending: false,
            assigned: None,
        });
        want
    }

    /// Forgets a process (exited or disconnected); its GPUs become free, except those it
    /// fenced: its memory may outlive its connection, so only [`Table::unfence`] frees them.
    pub fn remove(&mut self, pid: u32, now: Instant) -> Vec<Action> {
        self.procs.remove(&pid);
        self.schedule(now)
    }

    /// The entry of `pid`.
    pub fn get(&self, pid: u32) -> Option<&Entry> {
        self.procs.get(&pid)
    }

    /// All entries.
    pub fn entries(&self) -> impl Iterator<Item = (&u32, &Entry)> {
        self.procs.iter()
    }

    /// The shim asks for GPUs.
    pub fn request(&mut self, pid: u32, now: Instant) -> Vec<Action> {
        if let Some(e) = self.procs.get_mut(&pid) {
            match e.state {
                LeaseState::Unbound => {
                    e.state = LeaseState::Requested;
                    e.requested_at = Some(now);
                }
                LeaseState::Revoking => e.request_pending = true,
                _ => {}
            }
        }
        self.schedule(now)
    }

    /// The scheduler assigned `gpus` to `pid` (`None`: the assignment is withdrawn and
    /// any free GPUs do). Indices past the host's GPUs are dropped; a process is never
    /// granted more GPUs than it wants.
    pub fn assign(&mut self, pid: u32, gpus: Option<Vec<usize>>, now: Instant) -> Vec<Action> {
        if let Some(e) = self.procs.get_mut(&pid) {
            e.assigned = gpus.map(|g| {
                let mut kept: Vec<usize> = Vec::with_capacity(g.len());
                for i in g {
                    if i < self.gpus && !kept.contains(&i) {
                        kept.push(i);
                    }
                }
                kept
            });
        }
        self.schedule(now)
    }

    /// The shim reports its counters.
    pub fn activity(&mut self, pid: u32, calls: u64, now: Instant) {
        if let Some(e) = self.procs.get_mut(&pid) {
            if calls != e.calls {
                e.calls = calls;
                e.last_active = now;
                if e.state == LeaseState::IdleHeld {
                    e.state = LeaseState::Bound;
                }
            }
        }
    }

    /// The shim released lease `lease` and the server evicted its memory from its GPUs
    /// (`evicted` false: kept resident because the driver cannot checkpoint).
    pub fn released(&mut self, pid: u32, lease: u64, evicted: bool, now: Instant) -> Vec<Action> {
        if let Some(e) = self.procs.get_mut(&pid) {
            if e.lease == lease && matches!(e.state, LeaseState::Revoking | LeaseState::Bound | LeaseState::IdleHeld) {
                e.last_gpus = std::mem::take(&mut e.gpus);
                e.checkpointed = evicted;
                e.state = LeaseState::Unbound;
                if std::mem::take(&mut e.request_pending) {
                    e.state = LeaseState::Requested;
                    e.requested_at = Some(now);
                }
            }
        }
        self.schedule(now)
    }

    /// The shim released lease `lease` but the eviction left `pid`'s memory on its GPUs
    /// (`why`): they are fenced, granted to `pid` alone until [`Table::unfence`]. A
    /// process whose checkpoint "succeeded" (`MemoryLeft`) is still restored at its next grant.
    pub fn eviction_failed(
        &mut self,
        pid: u32,
        lease: u64,
        why: EvictionFailure,
        kernel_id: &str,
        now: Instant,
    ) -> Vec<Action> {
        if let Some(e) = self.procs.get(&pid) {
            if e.lease == lease && matches!(e.state, LeaseState::Revoking | LeaseState::Bound | LeaseState::IdleHeld) {
                for &g in &e.gpus {
                    if let Some(f) = self.fences.get_mut(g) {
                        *f = Some(Fence { holder: pid, kernel_id: kernel_id.to_owned(), reason: why, since: now });
                    }
                }
            }
        }
        self.released(pid, lease, why == EvictionFailure::MemoryLeft, now)
    }

    /// The memory that fenced `gpu` is gone (its process exited, or freed it): the GPU
    /// may be granted again.
    pub fn unfence(&mut self, gpu: usize, now: Instant) -> Vec<Action> {
        if let Some(f) = self.fences.get_mut(gpu) {
            *f = None;
        }
        self.schedule(now)
    }

    /// The fenced GPUs, by index.
    pub fn fences(&self) -> impl Iterator<Item = (usize, &Fence)> {
        self.fences.iter().enumerate().filter_map(|(g, f)| f.as_ref().map(|f| (g, f)))
    }

    /// Restoring `pid`'s memory onto the GPUs just granted failed (e.g. not enough free
    /// memory there): it waits again, still checkpointed, and is retried after `RETRY`.
    pub fn restore_failed(&mut self, pid: u32, now: Instant) -> Vec<Action> {
        if let Some(e) = self.procs.get_mut(&pid) {
            if e.state == LeaseState::Bound {
                e.state = LeaseState::Requested;
                e.gpus.clear();
                e.checkpointed = true;
                e.retry_after = Some(now + RETRY);
                e.restore_failures = e.restore_failures.saturating_add(1);
            }
        }
        self.schedule(now)
    }

    /// `pid`'s grant went through (its memory restored, or nothing to restore): it holds
    /// its own fenced GPUs under a lease again, a fence again only if its next eviction
    /// fails too.
    pub fn granted(&mut self, pid: u32) {
        if let Some(e) = self.procs.get_mut(&pid) {
            e.restore_failures = 0;
            for &g in &e.gpus {
                if let Some(f) = self.fences.get_mut(g) {
                    if f.as_ref().is_some_and(|f| f.holder == pid) {
                        *f = None;
                    }
                }
            }
        }
    }

    /// The host wants `pid`'s GPUs back now (operator, shutdown, migration).
    pub fn revoke(&mut self, pid: u32) -> Vec<Action> {
        match self.procs.get_mut(&pid) {
            Some(e) if matches!(e.state, LeaseState::Bound | LeaseState::IdleHeld) => {
                e.state = LeaseState::Revoking;
                vec![Action::Revoke { pid, lease: e.lease }]
            }
            _ => Vec::new(),
        }
    }

    /// Cordons or uncordons a GPU.
    pub fn set_cordoned(&mut self, gpu: usize, cordoned: bool, now: Instant) -> Vec<Action> {
        if let Some(c) = self.cordoned.get_mut(gpu) {
            *c = cordoned;
        }
        self.schedule(now)
    }

    /// Holds or resumes all grants.
    pub fn set_paused(&mut self, paused: bool, now: Instant) -> Vec<Action> {
        self.paused = paused;
        self.schedule(now)
    }

    /// Time passes: idle detection and idle release.
    pub fn tick(&mut self, now: Instant) -> Vec<Action> {
        for e in self.procs.values_mut() {
            if e.state == LeaseState::Bound && now.saturating_duration_since(e.last_active) >= self.policy.idle_grace {
                e.state = LeaseState::IdleHeld;
            }
        }
        self.schedule(now)
    }

    /// GPUs `pid` may be granted now: unbound, not cordoned, not fenced by another's memory.
    fn free_gpus(&self, pid: u32) -> Vec<usize> {
        let mut used = vec![false; self.gpus];
        for e in self.procs.values() {
            for &g in &e.gpus {
                if let Some(u) = used.get_mut(g) {
                    *u = true;
                }
            }
        }
        let fenced = |g: usize| self.fences[g].as_ref().is_some_and(|f| f.holder != pid);
        (0..self.gpus).filter(|&g| !used[g] && !self.cordoned[g] && !fenced(g)).collect()
    }

    /// Grants what can be granted (oldest request first), revokes what must be revoked.
    fn schedule(&mut self, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        let mut waiting: Vec<(Instant, u32)> = self
            .procs
            .iter()
            .filter(|(_, e)| e.state == LeaseState::Requested)
            .map(|(p, e)| (e.requested_at.unwrap_or(now), *p))
            .collect();
        waiting.sort();
        let mut blocked = false;
        if !self.paused {
            for (_, pid) in &waiting {
                let free = self.free_gpus(*pid);
                let Some(e) = self.procs.get(pid) else { continue };
                if e.retry_after.is_some_and(|t| now < t) {
                    continue;
                }
                let pick = if let Some(assigned) = &e.assigned {
                    // Exactly the scheduler's GPUs: wait until every one is free.
                    let pick: Vec<usize> = assigned.iter().copied().take(e.want).collect();
                    if !pick.iter().all(|g| free.contains(g)) {
                        blocked = true;
                        continue;
                    }
                    pick
                } else {
                    // want == 0 (a kernel without GPUs) gets an empty lease at once, so its
                    // CUDA calls fail on "no device" instead of waiting forever.
                    if free.len() < e.want {
                        blocked = true;
                        continue;
                    }
                    let mut pick: Vec<usize> = Vec::with_capacity(e.want);
                    pick.extend(e.last_gpus.iter().copied().filter(|g| free.contains(g)).take(e.want));
                    for g in free {
                        if pick.len() == e.want {
                            break;
                        }
                        if !pick.contains(&g) {
                            pick.push(g);
                        }
                    }
                    pick
                };
                let restore_from = e.checkpointed.then(|| e.last_gpus.clone());
                let lease = self.next_lease;
                self.next_lease += 1;
                // The holder's own fenced GPUs stay fenced until the grant goes through
                // ([`Table::granted`]): a restore that fails leaves its memory there.
                if let Some(e) = self.procs.get_mut(pid) {
                    e.state = LeaseState::Bound;
                    e.lease = lease;
                    e.gpus = pick.clone();
                    e.checkpointed = false;
                    e.retry_after = None;
                    e.last_active = now;
                }
                actions.push(Action::Grant { pid: *pid, lease, gpus: pick, restore_from });
            }
        } else {
            blocked = !waiting.is_empty();
        }
        let release_after = self.policy.idle_release;
        for (pid, e) in self.procs.iter_mut() {
            if e.state != LeaseState::IdleHeld {
                continue;
            }
            let idle = now.saturating_duration_since(e.last_active);
            if (blocked && !self.paused) || idle >= release_after {
                e.state = LeaseState::Revoking;
                actions.push(Action::Revoke { pid: *pid, lease: e.lease });
            }
        }
        actions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: Policy = Policy { idle_grace: Duration::from_millis(100), idle_release: Duration::from_secs(30) };

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn request_is_granted_when_free_and_prefers_nothing_special() {
        let t0 = Instant::now();
        let mut t = Table::new(2, POLICY);
        t.add(10, 1, t0);
        let a = t.request(10, t0);
        assert_eq!(a, vec![Action::Grant { pid: 10, lease: 1, gpus: vec![0], restore_from: None }]);
        assert_eq!(t.get(10).map(|e| e.state), Some(LeaseState::Bound));
    }

    #[test]
    fn oversubscribed_gpu_is_handed_over_only_after_the_holder_idles_and_releases() {
        let t0 = Instant::now();
        let mut t = Table::new(1, POLICY);
        t.add(1, 1, t0);
        t.add(2, 1, t0);
        assert_eq!(t.request(1, t0).len(), 1);
        assert!(t.request(2, at(t0, 1)).is_empty(), "GPU busy: no grant, no revoke of an active lease");
        t.activity(1, 5, at(t0, 50));
        assert!(t.tick(at(t0, 120)).is_empty(), "active 70 ms ago: still bound");
        let a = t.tick(at(t0, 151));
        assert_eq!(a, vec![Action::Revoke { pid: 1, lease: 1 }]);
        assert_eq!(t.get(1).map(|e| e.state), Some(LeaseState::Revoking));
        let a = t.released(1, 1, true, at(t0, 160));
        assert_eq!(a, vec![Action::Grant { pid: 2, lease: 2, gpus: vec![0], restore_from: None }]);
        assert_eq!(t.get(1).map(|e| (e.last_gpus.clone(), e.checkpointed)), Some((vec![0], true)));
        // Process 1 comes back: waits, then gets GPU 0 back with a restore from GPU 0.
        assert!(t.request(1, at(t0, 170)).is_empty());
        assert_eq!(t.tick(at(t0, 300)), vec![Action::Revoke { pid: 2, lease: 2 }]);
        let a = t.released(2, 2, true, at(t0, 310));
        assert_eq!(a, vec![Action::Grant { pid: 1, lease: 3, gpus: vec![0], restore_from: Some(vec![0]) }]);
    }

    #[test]
    fn cordoned_gpu_forces_restore_onto_another() {
        let t0 = Instant::now();
        let mut t = Table::new(2, POLICY);
        t.add(1, 1, t0);
        t.request(1, t0);
        assert_eq!(t.revoke(1), vec![Action::Revoke { pid: 1, lease: 1 }]);
        t.released(1, 1, true, t0);
        t.set_cordoned(0, true, t0);
        let a = t.request(1, t0);
        assert_eq!(a, vec![Action::Grant { pid: 1, lease: 2, gpus: vec![1], restore_from: Some(vec![0]) }]);
    }

    #[test]
    fn paused_table_holds_requests_and_resuming_grants_them() {
        let t0 = Instant::now();
        let mut t = Table::new(1, POLICY);
        t.add(1, 1, t0);
        t.set_paused(true, t0);
        assert!(t.request(1, t0).is_empty());
        assert_eq!(t.get(1).map(|e| e.state), Some(LeaseState::Requested));
        assert_eq!(t.set_paused(false, t0).len(), 1);
    }

    #[test]
    fn idle_lease_is_released_after_idle_release_without_contention() {
        let t0 = Instant::now();
        let mut t =
            Table::new(1, Policy { idle_grace: Duration::from_millis(10), idle_release: Duration::from_secs(1) });
        t.add(1, 1, t0);
        t.request(1, t0);
        assert!(t.tick(at(t0, 500)).is_empty());
        assert_eq!(t.get(1).map(|e| e.state), Some(LeaseState::IdleHeld));
        assert_eq!(t.tick(at(t0, 1000)), vec![Action::Revoke { pid: 1, lease: 1 }]);
    }

    #[test]
    fn stale_release_and_unknown_pids_change_nothing() {
        let t0 = Instant::now();
        let mut t = Table::new(1, POLICY);
        t.add(1, 1, t0);
        t.request(1, t0);
        assert!(t.released(1, 99, true, t0).is_empty());
        assert_eq!(t.get(1).map(|e| e.state), Some(LeaseState::Bound));
        assert!(t.request(42, t0).is_empty());
        assert!(t.revoke(42).is_empty());
    }

    #[test]
    fn a_failed_restore_waits_and_is_retried_from_the_same_checkpoint() {
        let t0 = Instant::now();
        let mut t = Table::new(2, POLICY);
        t.add(1, 1, t0);
        t.request(1, t0);
        t.revoke(1);
        t.released(1, 1, true, t0);
        let a = t.request(1, t0);
        assert_eq!(a, vec![Action::Grant { pid: 1, lease: 2, gpus: vec![0], restore_from: Some(vec![0]) }]);
        assert!(t.restore_failed(1, t0).is_empty(), "no immediate retry");
        assert_eq!(t.get(1).map(|e| e.state), Some(LeaseState::Requested));
        assert!(t.tick(at(t0, 500)).is_empty());
        let a = t.tick(t0 + RETRY);
        assert_eq!(a, vec![Action::Grant { pid: 1, lease: 3, gpus: vec![0], restore_from: Some(vec![0]) }]);
    }

    #[test]
    fn a_request_racing_ahead_of_the_release_is_not_lost() {
        let t0 = Instant::now();
        let mut t = Table::new(1, POLICY);
        t.add(1, 1, t0);
        t.request(1, t0);
        assert_eq!(t.revoke(1), vec![Action::Revoke { pid: 1, lease: 1 }]);
        assert!(t.request(1, t0).is_empty(), "still revoking");
        let a = t.released(1, 1, true, t0);
        assert_eq!(a, vec![Action::Grant { pid: 1, lease: 2, gpus: vec![0], restore_from: Some(vec![0]) }]);
    }

    #[test]
    fn a_process_without_gpus_gets_an_empty_lease_at_once() {
        let t0 = Instant::now();
        let mut t = Table::new(1, POLICY);
        t.add(1, 1, t0);
        t.request(1, t0);
        t.add(2, 0, t0);
        assert_eq!(t.request(2, t0), vec![Action::Grant { pid: 2, lease: 2, gpus: vec![], restore_from: None }]);
    }

    #[test]
    fn removing_a_holder_frees_its_gpus_for_a_waiter() {
        let t0 = Instant::now();
        let mut t = Table::new(1, POLICY);
        t.add(1, 1, t0);
        t.add(2, 1, t0);
        t.request(1, t0);
        t.request(2, t0);
        assert_eq!(t.remove(1, t0), vec![Action::Grant { pid: 2, lease: 2, gpus: vec![0], restore_from: None }]);
    }

    fn holders(t: &Table) -> Vec<usize> {
        let mut all: Vec<usize> = t.entries().flat_map(|(_, e)| e.gpus.clone()).collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "a GPU has two holders");
        all
    }

    #[test]
    fn an_assigned_process_gets_exactly_its_assigned_gpus() {
        let t0 = Instant::now();
        let mut t = Table::new(4, POLICY);
        t.add(1, 2, t0);
        assert!(t.assign(1, Some(vec![3, 1]), t0).is_empty());
        let a = t.request(1, t0);
        assert_eq!(a, vec![Action::Grant { pid: 1, lease: 1, gpus: vec![3, 1], restore_from: None }]);
        assert_eq!(holders(&t), vec![1, 3]);
    }

    #[test]
    fn an_assigned_process_waits_for_its_gpu_instead_of_taking_a_free_one() {
        let t0 = Instant::now();
        let mut t = Table::new(2, POLICY);
        t.add(1, 1, t0);
        t.add(2, 1, t0);
        t.assign(1, Some(vec![0]), t0);
        t.assign(2, Some(vec![0]), t0);
        assert_eq!(t.request(1, t0).len(), 1);
        assert!(t.request(2, t0).is_empty(), "GPU 1 is free but not assigned: no grant");
        assert_eq!(t.get(2).map(|e| e.state), Some(LeaseState::Requested));
        t.activity(1, 1, at(t0, 1));
        assert!(t.tick(at(t0, 50)).is_empty(), "holder active: no revoke, no second holder");
        assert_eq!(holders(&t), vec![0]);
        // The holder idles, is revoked because process 2 waits, and releases.
        assert_eq!(t.tick(at(t0, 200)), vec![Action::Revoke { pid: 1, lease: 1 }]);
        assert_eq!(holders(&t), vec![0]);
        let a = t.released(1, 1, true, at(t0, 210));
        assert_eq!(a, vec![Action::Grant { pid: 2, lease: 2, gpus: vec![0], restore_from: None }]);
        assert_eq!(holders(&t), vec![0]);
    }

    #[test]
    fn a_restore_goes_onto_the_assigned_gpu_not_the_last_one() {
        let t0 = Instant::now();
        let mut t = Table::new(2, POLICY);
        t.add(1, 1, t0);
        t.request(1, t0);
        t.revoke(1);
        t.released(1, 1, true, t0);
        t.assign(1, Some(vec![1]), t0);
        let a = t.request(1, t0);
        assert_eq!(a, vec![Action::Grant { pid: 1, lease: 2, gpus: vec![1], restore_from: Some(vec![0]) }]);
    }

    #[test]
    fn clearing_an_assignment_lets_any_free_gpu_do_and_bad_indices_are_dropped() {
        let t0 = Instant::now();
        let mut t = Table::new(2, POLICY);
        t.add(1, 1, t0);
        t.add(2, 1, t0);
        t.request(1, t0);
        t.assign(2, Some(vec![0, 0, 9]), t0);
        assert_eq!(t.get(2).and_then(|e| e.assigned.clone()), Some(vec![0]));
        assert!(t.request(2, t0).is_empty());
        let a = t.assign(2, None, t0);
        assert_eq!(a, vec![Action::Grant { pid: 2, lease: 2, gpus: vec![1], restore_from: None }]);
        assert_eq!(holders(&t), vec![0, 1]);
    }

    #[test]
    fn a_failed_eviction_fences_the_gpu_for_everyone_but_its_holder_until_unfenced() {
        let t0 = Instant::now();
        let mut t = Table::new(1, POLICY);
        t.add(1, 1, t0);
        t.add(2, 1, t0);
        t.request(1, t0);
        t.request(2, t0);
        assert_eq!(t.revoke(1), vec![Action::Revoke { pid: 1, lease: 1 }]);
        let a = t.eviction_failed(1, 1, EvictionFailure::CheckpointFailed, "k1", t0);
        assert!(a.is_empty(), "process 1's memory is on GPU 0: no grant to 2, got {a:?}");
        assert_eq!(t.get(2).map(|e| e.state), Some(LeaseState::Requested));
        let fences: Vec<_> = t.fences().map(|(g, f)| (g, f.holder, f.reason)).collect();
        assert_eq!(fences, vec![(0, 1, EvictionFailure::CheckpointFailed)]);
        // The holder going away does not free the GPU: its memory may outlive it.
        assert!(t.remove(1, t0).is_empty());
        assert_eq!(t.fences().count(), 1);
        assert_eq!(t.unfence(0, t0), vec![Action::Grant { pid: 2, lease: 2, gpus: vec![0], restore_from: None }]);
        assert_eq!(t.fences().count(), 0);
    }

    #[test]
    fn the_holder_of_a_fenced_gpu_gets_it_back_without_a_restore_and_others_get_another_gpu() {
        let t0 = Instant::now();
        let mut t = Table::new(2, POLICY);
        t.add(1, 1, t0);
        t.add(2, 1, t0);
        t.add(3, 1, t0);
        t.request(1, t0);
        t.revoke(1);
        assert!(t.eviction_failed(1, 1, EvictionFailure::LockTimeout, "k1", t0).is_empty());
        assert_eq!(t.request(2, t0), vec![Action::Grant { pid: 2, lease: 2, gpus: vec![1], restore_from: None }]);
        assert!(t.request(3, t0).is_empty(), "GPU 0 fenced, GPU 1 held: 3 waits");
        // Memory resident (not checkpointed): the holder is granted its GPU, no restore.
        assert_eq!(t.request(1, t0), vec![Action::Grant { pid: 1, lease: 3, gpus: vec![0], restore_from: None }]);
        t.granted(1);
        assert_eq!(t.fences().count(), 0, "held under a lease again, not fenced");
        assert_eq!(holders(&t), vec![0, 1]);
    }

    #[test]
    fn memory_left_after_a_checkpoint_fences_and_the_holder_is_still_restored() {
        let t0 = Instant::now();
        let mut t = Table::new(1, POLICY);
        t.add(1, 1, t0);
        t.request(1, t0);
        t.revoke(1);
        assert!(t.eviction_failed(1, 1, EvictionFailure::MemoryLeft, "k1", t0).is_empty());
        assert_eq!(t.fences().map(|(g, _)| g).collect::<Vec<_>>(), vec![0]);
        let a = t.request(1, t0);
        assert_eq!(a, vec![Action::Grant { pid: 1, lease: 2, gpus: vec![0], restore_from: Some(vec![0]) }]);
    }

    #[test]
    fn a_failed_restore_after_memory_left_keeps_the_gpu_fenced_from_the_next_waiter() {
        let t0 = Instant::now();
        let mut t = Table::new(1, POLICY);
        t.add(1, 1, t0);
        t.add(2, 1, t0);
        t.request(1, t0);
        t.revoke(1);
        t.eviction_failed(1, 1, EvictionFailure::MemoryLeft, "k1", t0);
        let a = t.request(1, t0);
        assert_eq!(a, vec![Action::Grant { pid: 1, lease: 2, gpus: vec![0], restore_from: Some(vec![0]) }]);
        assert!(t.request(2, t0).is_empty(), "GPU 0 is bound to 1");
        // The restore fails: 1 waits again, and its memory is still on GPU 0.
        let a = t.restore_failed(1, t0);
        assert!(!a.iter().any(|x| matches!(x, Action::Grant { pid: 2, .. })), "{a:?}");
        assert_eq!(t.fences().map(|(g, f)| (g, f.holder)).collect::<Vec<_>>(), vec![(0, 1)]);
    }

    #[test]
    fn an_assigned_process_waits_for_a_fenced_gpu() {
        let t0 = Instant::now();
        let mut t = Table::new(2, POLICY);
        t.add(1, 1, t0);
        t.add(2, 1, t0);
        t.request(1, t0);
        t.revoke(1);
        t.eviction_failed(1, 1, EvictionFailure::LockFailed, "k1", t0);
        t.assign(2, Some(vec![0]), t0);
        assert!(t.request(2, t0).is_empty(), "assigned the fenced GPU: waits");
        assert_eq!(t.unfence(0, t0), vec![Action::Grant { pid: 2, lease: 2, gpus: vec![0], restore_from: None }]);
    }
}
