//! The cluster model: hosts that are provisioned (after a delay), up, or released, each
//! with the daemon's own [`HostScheduler`] deciding which GPUs a cell commits. Every
//! action the schedulers return goes through an independent ledger (as in
//! `sched::replay`), so a GPU committed twice is caught, not trusted away. The cluster
//! also integrates GPU-hours provisioned (hosts alive × GPUs, from the request to the
//! release: a cloud bills a booting host) and committed.

use crate::host::{Action, HostScheduler};
use crate::Millis;

/// A host's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostState {
    /// Requested; up at a later event.
    Provisioning,
    /// Serving.
    Up,
    /// Given back.
    Released,
}

/// One host.
#[derive(Debug, Clone)]
pub struct SimHost {
    /// The daemon's scheduler for this host's GPUs.
    pub sched: HostScheduler,
    /// Its state.
    pub state: HostState,
    /// GPUs declared by the replicas or containers placed here.
    pub subscribed: u32,
    /// Replicas or containers placed here.
    pub replicas: u32,
    /// Host memory the replicas or containers placed here use, MiB (see [`SimCluster::size_kernel`]).
    pub memory_mib: u64,
    /// Pre-warmed containers ready.
    pub warm: u32,
    /// Pre-warmed containers starting.
    pub warming: u32,
    /// Per GPU: who holds it, and whether committed (else idle-held).
    ledger: Vec<Option<(String, bool)>>,
}

/// The cluster.
#[derive(Debug)]
pub struct SimCluster {
    hosts: Vec<SimHost>,
    up: Vec<u32>,
    gpus_per_host: u32,
    idle_release: Millis,
    host_ratio: f64,
    alive: u32,
    provisioning: u32,
    last: Millis,
    provisioned_gpu_ms: u128,
    committed_gpu_ms: u128,
    committed_now: u32,
    released_bound_gpu_ms: u128,
    kernel_memory_mib: std::collections::HashMap<String, u64>,
    memory_peak_mib: u64,
    /// Hosts requested.
    pub hosts_added: u64,
    /// Hosts released.
    pub hosts_released: u64,
    /// Hosts `0..seeds` are the founding ones, which NotebookOS's scale-in never releases
    /// (the daemon's seeds: the meta group's voters).
    pub seeds: u32,
    /// Broken promises (a GPU committed twice, a refused registration...): must stay empty.
    pub violations: Vec<String>,
}

impl SimCluster {
    /// An empty cluster of hosts with `gpus_per_host` GPUs; each host's scheduler
    /// releases idle-held GPUs after `idle_release` and admits kernels up to `host_ratio`.
    pub fn new(gpus_per_host: u32, idle_release: Millis, host_ratio: f64) -> Self {
        Self {
            hosts: Vec::new(),
            up: Vec::new(),
            gpus_per_host,
            idle_release,
            host_ratio,
            alive: 0,
            provisioning: 0,
            last: 0,
            provisioned_gpu_ms: 0,
            committed_gpu_ms: 0,
            committed_now: 0,
            released_bound_gpu_ms: 0,
            kernel_memory_mib: std::collections::HashMap::new(),
            memory_peak_mib: 0,
            hosts_added: 0,
            hosts_released: 0,
            seeds: 0,
            violations: Vec::new(),
        }
    }

    /// GPUs per host.
    pub fn gpus_per_host(&self) -> u32 {
        self.gpus_per_host
    }

    /// Integrates the time since the last call.
    pub fn advance(&mut self, now: Millis) {
        let dt = u128::from(now.saturating_sub(self.last));
        self.provisioned_gpu_ms += dt * u128::from(self.alive) * u128::from(self.gpus_per_host);
        self.committed_gpu_ms += dt * u128::from(self.committed_now);
        self.last = self.last.max(now);
    }

    /// Requests a host; it is up when the caller says so ([`SimCluster::up`]).
    pub fn request(&mut self, now: Millis) -> u32 {
        self.advance(now);
        let id = u32::try_from(self.hosts.len()).unwrap_or(u32::MAX);
        let mut sched = HostScheduler::new(self.gpus_per_host, self.idle_release, self.host_ratio);
        sched.advance(now);
        self.hosts.push(SimHost {
            sched,
            state: HostState::Provisioning,
            subscribed: 0,
            replicas: 0,
            memory_mib: 0,
            warm: 0,
            warming: 0,
            ledger: vec![None; self.gpus_per_host as usize],
        });
        self.alive += 1;
        self.provisioning += 1;
        self.hosts_added += 1;
        id
    }

    /// A provisioned host comes up.
    pub fn up(&mut self, h: u32) {
        if let Some(host) = self.hosts.get_mut(h as usize) {
            if host.state == HostState::Provisioning {
                host.state = HostState::Up;
                self.provisioning -= 1;
                let at = self.up.partition_point(|&x| x < h);
                self.up.insert(at, h);
            }
        }
    }

    /// Releases a host; whatever is still registered on it is dropped first.
    pub fn release(&mut self, h: u32, now: Millis) {
        self.advance(now);
        let Some(host) = self.hosts.get_mut(h as usize) else { return };
        if host.state == HostState::Released {
            return;
        }
        if host.state == HostState::Provisioning {
            self.provisioning -= 1;
        }
        let held = host.ledger.iter().filter(|g| matches!(g, Some((_, true)))).count();
        if held > 0 {
            self.violations.push(format!("host {h} released at {now} ms with {held} GPUs committed"));
        }
        host.sched.advance(now);
        self.released_bound_gpu_ms += host.sched.bound_gpu_ms();
        host.state = HostState::Released;
        host.warm = 0;
        host.warming = 0;
        self.up.retain(|&x| x != h);
        self.alive -= 1;
        self.hosts_released += 1;
    }

    /// The host.
    pub fn host(&self, h: u32) -> &SimHost {
        &self.hosts[h as usize]
    }

    /// The host, mutably (pool counters; GPU state only through the methods below).
    pub fn host_mut(&mut self, h: u32) -> &mut SimHost {
        &mut self.hosts[h as usize]
    }

    /// Hosts up, by id.
    pub fn up_hosts(&self) -> &[u32] {
        &self.up
    }

    /// Hosts requested and not released (what is paid for).
    pub fn alive(&self) -> u32 {
        self.alive
    }

    /// Hosts still booting.
    pub fn provisioning(&self) -> u32 {
        self.provisioning
    }

    /// GPUs committed to running cells now.
    pub fn committed_now(&self) -> u32 {
        self.committed_now
    }

    /// GPUs bound (committed or idle-held) now, over hosts up.
    pub fn bound_now(&self) -> u32 {
        self.up.iter().map(|&h| self.hosts[h as usize].sched.bound()).sum()
    }

    /// GPUs subscribed by all replicas placed now.
    pub fn subscribed_now(&self) -> u32 {
        self.up.iter().map(|&h| self.hosts[h as usize].subscribed).sum()
    }

    /// The up host with the fewest GPUs available that still has `gpus` (best fit),
    /// among those `ok` accepts; ties to the lowest id.
    pub fn best_fit(&self, gpus: u32, ok: impl Fn(u32, &SimHost) -> bool) -> Option<u32> {
        self.up
            .iter()
            .map(|&h| (h, &self.hosts[h as usize]))
            .filter(|(h, host)| host.sched.available() >= gpus && ok(*h, host))
            .min_by_key(|(h, host)| (host.sched.available(), *h))
            .map(|(h, _)| h)
    }

    /// Each replica or container of `kernel` uses `mib` MiB of host memory from now on
    /// (where it is placed, and wherever it moves); a kernel never sized uses none.
    pub fn size_kernel(&mut self, kernel: &str, mib: u64) {
        self.kernel_memory_mib.insert(kernel.to_owned(), mib);
    }

    /// The host memory each replica of `kernel` uses, MiB.
    pub fn kernel_memory_mib(&self, kernel: &str) -> u64 {
        self.kernel_memory_mib.get(kernel).copied().unwrap_or(0)
    }

    /// The most host memory replicas used on one host at any time so far, MiB.
    pub fn memory_peak_mib(&self) -> u64 {
        self.memory_peak_mib
    }

    /// Registers a kernel (replica or container) asking for `gpus` per cell on host `h`.
    pub fn add_kernel(&mut self, h: u32, kernel: &str, gpus: u32, now: Millis) {
        let mib = self.kernel_memory_mib(kernel);
        let host = &mut self.hosts[h as usize];
        if let Err(e) = host.sched.add_kernel(kernel, gpus, now) {
            self.violations.push(format!("host {h}: {e}"));
            return;
        }
        host.subscribed += gpus;
        host.replicas += 1;
        host.memory_mib = host.memory_mib.saturating_add(mib);
        self.memory_peak_mib = self.memory_peak_mib.max(host.memory_mib);
    }

    /// Removes a kernel from host `h`: its GPUs are freed.
    pub fn remove_kernel(&mut self, h: u32, kernel: &str, gpus: u32, now: Millis) {
        self.advance(now);
        let mib = self.kernel_memory_mib(kernel);
        let host = &mut self.hosts[h as usize];
        let acts = host.sched.remove_kernel(kernel, now);
        host.subscribed = host.subscribed.saturating_sub(gpus);
        host.replicas = host.replicas.saturating_sub(1);
        host.memory_mib = host.memory_mib.saturating_sub(mib);
        let mut freed = 0;
        for g in &mut host.ledger {
            if let Some((k, committed)) = g {
                if k == kernel {
                    freed += u32::from(*committed);
                    *g = None;
                }
            }
        }
        self.committed_now -= freed;
        self.apply(h, acts, now);
    }

    /// Submits a cell of `kernel` needing `gpus` on host `h`; true when it started now.
    pub fn commit(&mut self, h: u32, kernel: &str, cell: &str, gpus: u32, now: Millis) -> bool {
        self.advance(now);
        match self.hosts[h as usize].sched.submit(kernel, cell, gpus, now) {
            Ok(acts) => {
                let started = acts.iter().any(|a| matches!(a, Action::Start { cell: c, .. } if c == cell));
                self.apply(h, acts, now);
                if !started {
                    self.violations.push(format!("host {h}: cell {cell} did not start at {now} ms"));
                }
                started
            }
            Err(e) => {
                self.violations.push(format!("host {h}: {e}"));
                false
            }
        }
    }

    /// The running cell of `kernel` on host `h` finished: its GPUs become idle-held.
    pub fn finish(&mut self, h: u32, kernel: &str, cell: &str, now: Millis) {
        self.advance(now);
        let host = &mut self.hosts[h as usize];
        match host.sched.finish(kernel, cell, now) {
            Ok(acts) => {
                let mut freed = 0;
                for (k, committed) in host.ledger.iter_mut().flatten() {
                    if k == kernel && *committed {
                        *committed = false;
                        freed += 1;
                    }
                }
                self.committed_now -= freed;
                self.apply(h, acts, now);
            }
            Err(e) => self.violations.push(format!("host {h}: {e}")),
        }
    }

    /// Idle release on host `h`: true while idle-held GPUs remain (another check is due).
    pub fn tick(&mut self, h: u32, now: Millis) -> bool {
        self.advance(now);
        let acts = self.hosts[h as usize].sched.tick(now);
        self.apply(h, acts, now);
        self.hosts[h as usize].sched.has_idle_held()
    }

    fn apply(&mut self, h: u32, acts: Vec<Action>, now: Millis) {
        let host = &mut self.hosts[h as usize];
        for a in acts {
            match a {
                Action::Revoke { kernel, gpus, .. } => {
                    for g in gpus {
                        match host.ledger.get(g as usize) {
                            Some(Some((k, false))) if *k == kernel => host.ledger[g as usize] = None,
                            other => self.violations.push(format!(
                                "host {h} GPU {g}: revoked from {kernel} at {now} ms but held by {other:?}"
                            )),
                        }
                    }
                }
                Action::Start { kernel, gpus, .. } => {
                    for &g in &gpus {
                        match host.ledger.get(g as usize) {
                            Some(None) => {}
                            Some(Some((k, false))) if *k == kernel => {}
                            other => self.violations.push(format!(
                                "host {h} GPU {g}: committed to {kernel} at {now} ms while held by {other:?}"
                            )),
                        }
                        if let Some(slot) = host.ledger.get_mut(g as usize) {
                            *slot = Some((kernel.clone(), true));
                        }
                    }
                    // The kernel's idle-held GPUs it did not take went back to free.
                    for (i, slot) in host.ledger.iter_mut().enumerate() {
                        if matches!(slot, Some((k, false)) if *k == kernel) && !gpus.contains(&index(i)) {
                            *slot = None;
                        }
                    }
                    self.committed_now += index(gpus.len());
                }
                Action::Queued { cell, .. } => {
                    self.violations.push(format!("host {h}: cell {cell} queued at {now} ms (the policy said it fits)"))
                }
                Action::Reject { cell, reason } => {
                    self.violations.push(format!("host {h}: cell {cell} rejected: {reason}"))
                }
            }
        }
        let (ledger_committed, sched_committed) =
            (index(host.ledger.iter().filter(|g| matches!(g, Some((_, true)))).count()), host.sched.committed());
        if ledger_committed != sched_committed {
            self.violations.push(format!(
                "host {h} at {now} ms: ledger says {ledger_committed} GPUs committed, scheduler {sched_committed}"
            ));
        }
    }

    /// GPU-ms provisioned so far.
    pub fn provisioned_gpu_ms(&self) -> u128 {
        self.provisioned_gpu_ms
    }

    /// GPU-ms committed so far.
    pub fn committed_gpu_ms(&self) -> u128 {
        self.committed_gpu_ms
    }

    /// GPU-ms bound so far (the schedulers' own integrals), up to `now`.
    pub fn bound_gpu_ms(&mut self, now: Millis) -> u128 {
        let mut sum = self.released_bound_gpu_ms;
        for host in &mut self.hosts {
            if host.state != HostState::Released {
                host.sched.advance(now);
                sum += host.sched.bound_gpu_ms();
            }
        }
        sum
    }
}

fn index(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_are_ledgered_and_time_is_integrated() {
        let mut c = SimCluster::new(2, 1_000, 1e9);
        let h = c.request(0);
        c.up(h);
        c.add_kernel(h, "a", 2, 0);
        assert!(c.commit(h, "a", "a1", 2, 1_000));
        assert_eq!(c.committed_now(), 2);
        c.finish(h, "a", "a1", 3_000);
        assert_eq!((c.committed_now(), c.bound_now()), (0, 2), "idle-held");
        assert!(!c.tick(h, 4_000), "released after idle_release");
        c.advance(10_000);
        assert_eq!(c.committed_gpu_ms(), 4_000);
        assert_eq!(c.provisioned_gpu_ms(), 20_000);
        assert_eq!(c.bound_gpu_ms(10_000), 6_000, "2 GPUs x (2 s committed + 1 s idle-held)");
        c.remove_kernel(h, "a", 2, 10_000);
        c.release(h, 10_000);
        assert_eq!((c.alive(), c.hosts_released), (0, 1));
        assert!(c.violations.is_empty(), "{:?}", c.violations);
    }

    #[test]
    fn a_cell_that_does_not_fit_is_a_violation() {
        let mut c = SimCluster::new(1, 1_000, 1e9);
        let h = c.request(0);
        c.up(h);
        c.add_kernel(h, "a", 1, 0);
        c.add_kernel(h, "b", 1, 0);
        assert!(c.commit(h, "a", "a1", 1, 0));
        assert!(!c.commit(h, "b", "b1", 1, 0));
        assert!(c.violations.iter().any(|v| v.contains("b1 queued")), "{:?}", c.violations);
    }

    #[test]
    fn host_memory_follows_the_sized_kernels_and_its_peak_is_kept() {
        let mut c = SimCluster::new(4, 1_000, 1e9);
        let (a, b) = (c.request(0), c.request(0));
        c.up(a);
        c.up(b);
        c.size_kernel("k", 700);
        c.add_kernel(a, "k", 1, 0);
        c.add_kernel(a, "unsized", 1, 0);
        c.add_kernel(b, "k", 1, 0);
        assert_eq!((c.host(a).memory_mib, c.host(b).memory_mib), (700, 700));
        c.remove_kernel(a, "k", 1, 10);
        c.add_kernel(b, "unsized", 1, 10);
        assert_eq!((c.host(a).memory_mib, c.host(b).memory_mib), (0, 700));
        c.size_kernel("j", 500);
        c.add_kernel(b, "j", 1, 20);
        assert_eq!((c.host(b).memory_mib, c.memory_peak_mib()), (1200, 1200));
        c.remove_kernel(b, "j", 1, 30);
        assert_eq!(c.memory_peak_mib(), 1200, "the peak stays");
        assert!(c.violations.is_empty(), "{:?}", c.violations);
    }
}
