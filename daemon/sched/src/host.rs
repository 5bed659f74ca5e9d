//! One host's GPUs, bound per cell.
//!
//! States of a GPU: free, committed to a running cell, or idle-held by the kernel
//! whose cell last ran on it (so its next cell starts without an eviction/restore).
//! An idle-held GPU goes back to free after `idle_release`, or earlier when a
//! waiting cell of another kernel needs it (the caller then revokes: evicts the
//! kernel's GPU memory). Cells that cannot get GPUs wait in one FIFO queue; the
//! head is served first so a large request is never starved by small ones.
//!
//! A GPU the lease server fenced (an eviction left a kernel's memory on it) is given to
//! no cell but that kernel's until the fence is lifted ([`HostScheduler::set_fences`]):
//! waiting cells take other GPUs or wait.

use std::collections::{BTreeMap, VecDeque};

use super::{CellId, KernelId, Millis};

/// What the caller must do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Take the GPUs back from `kernel` (evict its GPU memory) before anyone else uses them.
    Revoke {
        /// The kernel losing the GPUs.
        kernel: KernelId,
        /// Which GPUs (host indices).
        gpus: Vec<u32>,
        /// True when revoked because another kernel needs them (not idle timeout).
        preempted: bool,
    },
    /// Start the cell on these GPUs (bind the kernel's lease to them).
    Start {
        /// The cell.
        cell: CellId,
        /// Its kernel.
        kernel: KernelId,
        /// GPUs committed to it (empty for a CPU-only kernel).
        gpus: Vec<u32>,
        /// Time it waited in the queue.
        waited: Millis,
    },
    /// The cell waits for GPUs; tell the client.
    Queued {
        /// The cell.
        cell: CellId,
        /// 1-based position in the queue.
        position: usize,
    },
    /// The cell can never run here.
    Reject {
        /// The cell.
        cell: CellId,
        /// Why, for the client.
        reason: String,
    },
}

/// Why a request was refused outright.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The kernel is unknown.
    #[error("unknown kernel {0}")]
    UnknownKernel(KernelId),
    /// The kernel is known already.
    #[error("kernel {0} is already registered")]
    DuplicateKernel(KernelId),
    /// Admitting the kernel would exceed the subscription ratio.
    #[error(
        "host oversubscribed: {requested} GPUs requested by kernels would exceed {limit} ({ratio} x {total} GPUs)"
    )]
    Oversubscribed {
        /// GPUs requested by all kernels, this one included.
        requested: u32,
        /// The limit.
        limit: u32,
        /// Configured ratio.
        ratio: String,
        /// GPUs on the host.
        total: u32,
    },
    /// The kernel already has a cell running or waiting.
    #[error("kernel {0} already has a cell running or waiting")]
    Busy(KernelId),
    /// No such cell running.
    #[error("cell {0} is not running")]
    NotRunning(CellId),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Gpu {
    Free,
    Committed { kernel: KernelId },
    IdleHeld { kernel: KernelId, since: Millis },
}

#[derive(Debug, Clone)]
struct Kernel {
    /// GPUs the kernel declared (its kernelspec): what subscription counts.
    gpus: u32,
    running: Option<CellId>,
    /// The waiting cell, when it was submitted, and the GPUs it needs.
    queued: Option<(CellId, Millis, u32)>,
}

/// The scheduler of one host.
#[derive(Debug, Clone)]
pub struct HostScheduler {
    gpus: Vec<Gpu>,
    /// Per GPU: the kernel whose memory an eviction left on it (only its cells may use it).
    fenced: Vec<Option<KernelId>>,
    kernels: BTreeMap<KernelId, Kernel>,
    queue: VecDeque<KernelId>,
    /// GPUs a waiting cell of the kernel must leave free ([`Self::set_headroom`]).
    headroom: BTreeMap<KernelId, u32>,
    idle_release: Millis,
    ratio: f64,
    /// Time up to which the integrals below are accounted.
    accounted_to: Millis,
    /// Integral of GPUs bound (committed or idle-held) over time, GPU-ms.
    bound_gpu_ms: u128,
    /// Integral of GPUs requested by registered kernels over time, GPU-ms: what
    /// whole-session reservation would have bound.
    reserved_gpu_ms: u128,
}

/// A point-in-time view for status pages and tests.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    /// GPUs on the host.
    pub total: u32,
    /// GPUs committed to running cells.
    pub committed: u32,
    /// GPUs idle-held after a cell.
    pub idle_held: u32,
    /// Free GPUs fenced: a failed eviction left a kernel's memory there, so no other
    /// kernel's cell may have them.
    #[serde(default)]
    pub fenced: u32,
    /// Per GPU: `free`, `fenced:<kernel>`, `committed:<kernel>`, `idle:<kernel>`.
    pub holders: Vec<String>,
    /// Cells waiting, in order: (kernel, cell).
    pub waiting: Vec<(KernelId, CellId)>,
    /// GPUs requested by registered kernels.
    pub requested: u32,
    /// GPU-seconds bound so far (committed or idle-held).
    #[serde(default)]
    pub gpu_seconds_bound: f64,
    /// GPU-seconds whole-session reservation would have bound for the same kernels.
    #[serde(default)]
    pub gpu_seconds_reserved: f64,
}

impl HostScheduler {
    /// A host with `gpus` GPUs; idle-held GPUs are released after `idle_release`;
    /// kernels may request up to `ratio` x `gpus` GPUs in total.
    pub fn new(gpus: u32, idle_release: Millis, ratio: f64) -> Self {
        Self {
            gpus: vec![Gpu::Free; gpus as usize],
            fenced: vec![None; gpus as usize],
            kernels: BTreeMap::new(),
            queue: VecDeque::new(),
            headroom: BTreeMap::new(),
            idle_release,
            ratio,
            accounted_to: 0,
            bound_gpu_ms: 0,
            reserved_gpu_ms: 0,
        }
    }

    /// Accounts the time since the last change at the current binding; every
    /// method that takes `now` calls it before changing anything.
    pub fn advance(&mut self, now: Millis) {
        let dt = u128::from(now.saturating_sub(self.accounted_to));
        if dt == 0 {
            return;
        }
        let bound = self.gpus.iter().filter(|g| !matches!(g, Gpu::Free)).count() as u128;
        let requested: u128 = self.kernels.values().map(|k| u128::from(k.gpus)).sum();
        self.bound_gpu_ms += bound * dt;
        self.reserved_gpu_ms += requested * dt;
        self.accounted_to = now;
    }

    /// GPU-milliseconds bound so far (committed or idle-held), up to the last `now` seen.
    pub fn bound_gpu_ms(&self) -> u128 {
        self.bound_gpu_ms
    }

    /// GPU-milliseconds whole-session reservation would have bound, up to the last `now` seen.
    pub fn reserved_gpu_ms(&self) -> u128 {
        self.reserved_gpu_ms
    }

    /// GPUs on the host.
    pub fn total(&self) -> u32 {
        u32::try_from(self.gpus.len()).unwrap_or(u32::MAX)
    }

    /// GPUs requested by registered kernels / GPUs on the host (0 with no GPUs).
    pub fn subscription_ratio(&self) -> f64 {
        let requested: u32 = self.kernels.values().map(|k| k.gpus).sum();
        if self.gpus.is_empty() {
            0.0
        } else {
            f64::from(requested) / f64::from(self.total())
        }
    }

    /// Registers a kernel that asks for `gpus` GPUs per cell.
    pub fn add_kernel(&mut self, kernel: &str, gpus: u32, now: Millis) -> Result<(), Refusal> {
        if self.kernels.contains_key(kernel) {
            return Err(Refusal::DuplicateKernel(kernel.to_owned()));
        }
        let requested: u32 = self.kernels.values().map(|k| k.gpus).sum::<u32>() + gpus;
        // Truncation is the intent: a limit of 2.5 GPUs admits 2.
        #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "ratio >= 1, finite (config)")]
        let limit = (self.ratio * f64::from(self.total())).floor() as u32;
        // A kernel asking for more than the host has is admitted: its cells are
        // rejected with a clear reason, which is what the user needs to see.
        if gpus > 0 && gpus <= self.total() && requested > limit {
            return Err(Refusal::Oversubscribed {
                requested,
                limit,
                ratio: format!("{}", self.ratio),
                total: self.total(),
            });
        }
        self.advance(now);
        self.kernels.insert(kernel.to_owned(), Kernel { gpus, running: None, queued: None });
        Ok(())
    }

    /// Forgets a kernel (shut down or died): frees its GPUs at once, drops its queued cell.
    pub fn remove_kernel(&mut self, kernel: &str, now: Millis) -> Vec<Action> {
        self.advance(now);
        if self.kernels.remove(kernel).is_none() {
            return Vec::new();
        }
        self.queue.retain(|k| k != kernel);
        self.headroom.remove(kernel);
        for g in &mut self.gpus {
            let mine = match g {
                Gpu::Committed { kernel: k } | Gpu::IdleHeld { kernel: k, .. } => k == kernel,
                Gpu::Free => false,
            };
            if mine {
                *g = Gpu::Free;
            }
        }
        self.serve_queue(now)
    }

    /// A cell of `kernel` that needs `gpus` GPUs was submitted (usually the
    /// kernel's declared count; a trace may vary it per cell).
    pub fn submit(&mut self, kernel: &str, cell: &str, gpus: u32, now: Millis) -> Result<Vec<Action>, Refusal> {
        self.advance(now);
        let total = self.total();
        let k = self.kernels.get_mut(kernel).ok_or_else(|| Refusal::UnknownKernel(kernel.to_owned()))?;
        if k.running.is_some() || k.queued.is_some() {
            return Err(Refusal::Busy(kernel.to_owned()));
        }
        if gpus > total {
            return Ok(vec![Action::Reject {
                cell: cell.to_owned(),
                reason: format!("this cell needs {gpus} GPUs but the host has {total}"),
            }]);
        }
        k.queued = Some((cell.to_owned(), now, gpus));
        self.queue.push_back(kernel.to_owned());
        let mut actions = self.serve_queue(now);
        if let Some(pos) = self.queue.iter().position(|q| q == kernel) {
            actions.push(Action::Queued { cell: cell.to_owned(), position: pos + 1 });
        }
        Ok(actions)
    }

    /// The running cell of `kernel` finished: its GPUs become idle-held.
    pub fn finish(&mut self, kernel: &str, cell: &str, now: Millis) -> Result<Vec<Action>, Refusal> {
        self.advance(now);
        let k = self.kernels.get_mut(kernel).ok_or_else(|| Refusal::UnknownKernel(kernel.to_owned()))?;
        if k.running.as_deref() != Some(cell) {
            return Err(Refusal::NotRunning(cell.to_owned()));
        }
        k.running = None;
        for g in &mut self.gpus {
            if matches!(g, Gpu::Committed { kernel: owner } if owner == kernel) {
                *g = Gpu::IdleHeld { kernel: kernel.to_owned(), since: now };
            }
        }
        Ok(self.serve_queue(now))
    }

    /// GPU activity of `kernel` was observed at `now` (the observer saw its process
    /// use the driver after its cell ended): its idle-held GPUs count as idle from
    /// `now`, so `idle_release` runs from the last observed use, not the cell's end.
    pub fn observed_activity(&mut self, kernel: &str, now: Millis) {
        for g in &mut self.gpus {
            if let Gpu::IdleHeld { kernel: owner, since } = g {
                if owner == kernel && *since < now {
                    *since = now;
                }
            }
        }
    }

    /// Kernels holding idle-held GPUs.
    pub fn idle_holders(&self) -> Vec<KernelId> {
        let mut out: Vec<KernelId> = self
            .gpus
            .iter()
            .filter_map(|g| match g {
                Gpu::IdleHeld { kernel, .. } => Some(kernel.clone()),
                _ => None,
            })
            .collect();
        out.dedup();
        out
    }

    /// Time passes: idle-held GPUs past `idle_release` are revoked and freed.
    pub fn tick(&mut self, now: Millis) -> Vec<Action> {
        self.advance(now);
        let mut actions = Vec::new();
        let mut by_kernel: BTreeMap<KernelId, Vec<u32>> = BTreeMap::new();
        for (i, g) in self.gpus.iter_mut().enumerate() {
            if let Gpu::IdleHeld { kernel, since } = g {
                if now.saturating_sub(*since) >= self.idle_release {
                    by_kernel.entry(kernel.clone()).or_default().push(index(i));
                    *g = Gpu::Free;
                }
            }
        }
        for (kernel, gpus) in by_kernel {
            actions.push(Action::Revoke { kernel, gpus, preempted: false });
        }
        actions.extend(self.serve_queue(now));
        actions
    }

    /// The GPUs fenced now, each with the kernel whose memory is on it (all others are
    /// unfenced); a GPU index past the host's is ignored. Serves the queue if that changed.
    pub fn set_fences(&mut self, fences: &[(u32, KernelId)], now: Millis) -> Vec<Action> {
        self.advance(now);
        let mut next: Vec<Option<KernelId>> = vec![None; self.gpus.len()];
        for (g, k) in fences {
            if let Some(slot) = next.get_mut(*g as usize) {
                *slot = Some(k.clone());
            }
        }
        if next == self.fenced {
            return Vec::new();
        }
        self.fenced = next;
        self.serve_queue(now)
    }

    /// Whether GPU `i` is fenced with memory of a kernel other than `kernel`.
    fn fenced_from(&self, i: usize, kernel: &str) -> bool {
        self.fenced.get(i).and_then(Option::as_deref).is_some_and(|holder| holder != kernel)
    }

    /// The kernels whose cells wait, in queue order, with when each cell was submitted.
    pub fn queued(&self) -> Vec<(KernelId, Millis)> {
        self.queue
            .iter()
            .filter_map(|k| self.kernels.get(k).and_then(|x| x.queued.as_ref()).map(|q| (k.clone(), q.1)))
            .collect()
    }

    /// Puts the waiting cells in a new order (a fair share's, [`crate::fairshare`]): the
    /// kernels of `first` lead, in that order; the others follow in their order. Serves
    /// nothing: the next call that serves the queue serves it in this order.
    pub fn reorder_queue(&mut self, first: &[KernelId]) {
        let mut rest: VecDeque<KernelId> = std::mem::take(&mut self.queue);
        let mut queue = VecDeque::with_capacity(rest.len());
        for k in first {
            if let Some(i) = rest.iter().position(|q| q == k) {
                if let Some(k) = rest.remove(i) {
                    queue.push_back(k);
                }
            }
        }
        queue.extend(rest);
        self.queue = queue;
    }

    /// The GPUs a cell of `kernel` must leave free when it starts (a fair share's headroom,
    /// [`crate::fairshare::headroom`]); 0 clears it. Serves nothing.
    pub fn set_headroom(&mut self, kernel: &str, gpus: u32) {
        if gpus == 0 {
            self.headroom.remove(kernel);
        } else {
            self.headroom.insert(kernel.to_owned(), gpus);
        }
    }

    /// The kernels here: each with the GPUs it declared and whether a cell of it runs.
    pub fn kernels(&self) -> Vec<(KernelId, u32, bool)> {
        self.kernels.iter().map(|(id, k)| (id.clone(), k.gpus, k.running.is_some())).collect()
    }

    /// Starts queued cells, in order, while the head can get its GPUs (and leave its
    /// headroom free). When the head cannot, a waiting kernel whose own memory fences
    /// enough free GPUs still starts on them: no other cell may use those, so it delays
    /// nobody, and without it a holder queued behind a cell waiting for its fenced GPU
    /// would wait for ever.
    fn serve_queue(&mut self, now: Millis) -> Vec<Action> {
        let mut actions = Vec::new();
        let mut at = 0;
        while let Some(kernel) = self.queue.get(at).cloned() {
            let Some((_, _, need)) = self.kernels.get(&kernel).and_then(|k| k.queued.clone()) else {
                self.queue.remove(at);
                continue;
            };
            let need = need as usize;
            let keep = self.keep(&kernel);
            match self.choose(&kernel, need, keep) {
                Some((chosen, stolen)) => {
                    self.queue.remove(at);
                    self.commit(kernel, chosen, stolen, now, &mut actions);
                }
                // Held back by its headroom alone: the GPUs it leaves free are for the cells
                // behind it, which go on.
                None if keep > 0 && self.choose(&kernel, need, 0).is_some() => at += 1,
                None => {
                    self.serve_fence_holders(now, &mut actions);
                    break;
                }
            }
        }
        actions
    }

    /// The GPUs `kernel`'s cell must leave free: its headroom. (Even on an otherwise free
    /// host: the headroom is a reservation for the idle kernels of users within their
    /// share, and an over-share cell has its other replicas' hosts.)
    fn keep(&self, kernel: &str) -> usize {
        self.headroom.get(kernel).copied().unwrap_or(0) as usize
    }

    /// GPUs for `need` of `kernel`'s cell, if it can have them now, and the other kernels'
    /// idle-held ones among them (to revoke). Prefers the kernel's own idle-held GPUs and
    /// those its memory fences (no eviction, no restore), then free ones, then other
    /// kernels' idle-held GPUs, oldest first.
    fn choose(&self, kernel: &str, need: usize, keep: usize) -> Option<(Vec<usize>, Revokes)> {
        let mut own: Vec<usize> = Vec::new();
        let mut free: Vec<usize> = Vec::new();
        let mut others: Vec<(Millis, usize)> = Vec::new();
        for (i, g) in self.gpus.iter().enumerate() {
            if self.fenced_from(i, kernel) {
                continue;
            }
            // Its own memory is still on a GPU it was fenced on: that one first.
            if matches!(g, Gpu::Free) && self.fenced.get(i).is_some_and(Option::is_some) {
                own.push(i);
                continue;
            }
            match g {
                Gpu::IdleHeld { kernel: owner, .. } if owner == kernel => own.push(i),
                Gpu::Free => free.push(i),
                Gpu::IdleHeld { since, .. } => others.push((*since, i)),
                Gpu::Committed { .. } => {}
            }
        }
        if own.len() + free.len() + others.len() < need + keep {
            return None;
        }
        others.sort_unstable();
        let mut chosen: Vec<usize> = own.iter().chain(free.iter()).copied().take(need).collect();
        let mut stolen: BTreeMap<KernelId, Vec<u32>> = BTreeMap::new();
        for (_, i) in others.iter().take(need - chosen.len()) {
            if let Gpu::IdleHeld { kernel: owner, .. } = &self.gpus[*i] {
                stolen.entry(owner.clone()).or_default().push(index(*i));
            }
            chosen.push(*i);
        }
        Some((chosen, stolen))
    }

    /// Starts, out of queue order, each waiting cell whose kernel's own memory fences a
    /// free GPU here and that can have its GPUs now (its fenced ones first): the cells
    /// ahead of it may be waiting for exactly those GPUs, which only its cell may use.
    fn serve_fence_holders(&mut self, now: Millis, actions: &mut Vec<Action>) {
        let holders: Vec<KernelId> = self
            .queue
            .iter()
            .filter(|k| {
                self.gpus
                    .iter()
                    .zip(&self.fenced)
                    .any(|(g, f)| matches!(g, Gpu::Free) && f.as_deref() == Some(k.as_str()))
            })
            .cloned()
            .collect();
        for kernel in holders {
            let Some(need) = self.kernels.get(&kernel).and_then(|k| k.queued.as_ref()).map(|q| q.2 as usize) else {
                continue;
            };
            let Some((chosen, stolen)) = self.choose(&kernel, need, self.keep(&kernel)) else { continue };
            self.queue.retain(|q| *q != kernel);
            self.commit(kernel, chosen, stolen, now, actions);
        }
    }

    /// Commits `chosen` to `kernel`'s queued cell (already out of the queue) and starts it;
    /// the kernel's own idle-held GPUs it does not need go back to free.
    fn commit(
        &mut self,
        kernel: KernelId,
        mut chosen: Vec<usize>,
        stolen: Revokes,
        now: Millis,
        actions: &mut Vec<Action>,
    ) {
        for g in &mut self.gpus {
            if matches!(g, Gpu::IdleHeld { kernel: owner, .. } if *owner == kernel) {
                *g = Gpu::Free;
            }
        }
        for (owner, gpus) in stolen {
            actions.push(Action::Revoke { kernel: owner, gpus, preempted: true });
        }
        chosen.sort_unstable();
        for i in &chosen {
            self.gpus[*i] = Gpu::Committed { kernel: kernel.clone() };
        }
        let Some(k) = self.kernels.get_mut(&kernel) else { return };
        let Some((cell, submitted, _)) = k.queued.take() else { return };
        k.running = Some(cell.clone());
        actions.push(Action::Start {
            cell,
            kernel,
            gpus: chosen.into_iter().map(index).collect(),
            waited: now.saturating_sub(submitted),
        });
    }

    /// A view of the host.
    pub fn snapshot(&self) -> Snapshot {
        let mut s = Snapshot { total: self.total(), ..Snapshot::default() };
        for (i, g) in self.gpus.iter().enumerate() {
            s.holders.push(match g {
                Gpu::Free => match self.fenced.get(i).and_then(Option::as_deref) {
                    Some(holder) => {
                        s.fenced += 1;
                        format!("fenced:{holder}")
                    }
                    None => "free".to_owned(),
                },
                Gpu::Committed { kernel } => {
                    s.committed += 1;
                    format!("committed:{kernel}")
                }
                Gpu::IdleHeld { kernel, .. } => {
                    s.idle_held += 1;
                    format!("idle:{kernel}")
                }
            });
        }
        for kernel in &self.queue {
            if let Some((cell, _, _)) = self.kernels.get(kernel).and_then(|k| k.queued.as_ref()) {
                s.waiting.push((kernel.clone(), cell.clone()));
            }
        }
        s.requested = self.kernels.values().map(|k| k.gpus).sum();
        #[expect(clippy::cast_precision_loss, reason = "GPU-seconds for display")]
        {
            s.gpu_seconds_bound = self.bound_gpu_ms as f64 / 1000.0;
            s.gpu_seconds_reserved = self.reserved_gpu_ms as f64 / 1000.0;
        }
        s
    }
}

/// Read-only counts for cluster-level decisions (the simulator and pre-selection):
/// cheap, no allocation.
impl HostScheduler {
    /// GPUs a new cell of `kernel` could commit now: free ones plus idle-held ones
    /// (its own, or another kernel's, which would be revoked). Fenced GPUs do not count (another kernel's memory is on them).
    pub fn available(&self) -> u32 {
        index(
            self.gpus
                .iter()
                .zip(&self.fenced)
                .filter(|(g, f)| !matches!(g, Gpu::Committed { .. }) && f.is_none())
                .count(),
        )
    }

    /// GPUs committed to running cells now.
    pub fn committed(&self) -> u32 {
        index(self.gpus.iter().filter(|g| matches!(g, Gpu::Committed { .. })).count())
    }

    /// GPUs bound now (committed or idle-held).
    pub fn bound(&self) -> u32 {
        index(self.gpus.iter().filter(|g| !matches!(g, Gpu::Free)).count())
    }

    /// GPUs the registered kernels declared (what subscription counts).
    pub fn requested(&self) -> u32 {
        self.kernels.values().map(|k| k.gpus).sum()
    }

    /// Kernels registered on the host.
    pub fn kernel_count(&self) -> usize {
        self.kernels.len()
    }

    /// Whether any GPU is idle-held (a release is due at some point).
    pub fn has_idle_held(&self) -> bool {
        self.gpus.iter().any(|g| matches!(g, Gpu::IdleHeld { .. }))
    }
}

/// Other kernels' idle-held GPUs a start takes, by kernel (each revoked).
type Revokes = BTreeMap<KernelId, Vec<u32>>;

fn index(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn starts(actions: &[Action]) -> Vec<(String, Vec<u32>)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Start { kernel, gpus, .. } => Some((kernel.clone(), gpus.clone())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn one_gpu_three_kernels_take_turns() {
        let mut s = HostScheduler::new(1, 30_000, 3.0);
        for k in ["a", "b", "c"] {
            s.add_kernel(k, 1, 0).expect("admit");
        }
        assert_eq!(starts(&s.submit("a", "a1", 1, 0).expect("a1")), vec![("a".into(), vec![0])]);
        let q = s.submit("b", "b1", 1, 1).expect("b1");
        assert_eq!(q, vec![Action::Queued { cell: "b1".into(), position: 1 }]);
        let q = s.submit("c", "c1", 1, 2).expect("c1");
        assert_eq!(q, vec![Action::Queued { cell: "c1".into(), position: 2 }]);
        // a finishes: its idle-held GPU is preempted for b, the head of the queue.
        let acts = s.finish("a", "a1", 10).expect("finish");
        assert_eq!(
            acts,
            vec![
                Action::Revoke { kernel: "a".into(), gpus: vec![0], preempted: true },
                Action::Start { cell: "b1".into(), kernel: "b".into(), gpus: vec![0], waited: 9 },
            ]
        );
        assert_eq!(s.snapshot().waiting, vec![("c".to_owned(), "c1".to_owned())]);
    }

    #[test]
    fn a_fenced_gpu_goes_to_its_holder_only_and_waiters_take_another_or_wait_until_unfenced() {
        let mut s = HostScheduler::new(2, 1_000, 3.0);
        for k in ["a", "b", "c"] {
            s.add_kernel(k, 1, 0).expect("admit");
        }
        assert_eq!(starts(&s.submit("a", "a1", 1, 0).expect("a1")), vec![("a".into(), vec![0])]);
        s.finish("a", "a1", 1).expect("finish");
        // Idle release: a's eviction fails and the lease server fences GPU 0.
        s.tick(2_000);
        assert!(s.set_fences(&[(0, "a".into()), (9, "x".into())], 2_000).is_empty());
        assert_eq!(s.snapshot().holders, vec!["fenced:a".to_owned(), "free".to_owned()]);
        assert_eq!(s.snapshot().fenced, 1);
        assert_eq!(s.available(), 1);
        assert_eq!(starts(&s.submit("b", "b1", 1, 2_001).expect("b1")), vec![("b".into(), vec![1])]);
        let q = s.submit("c", "c1", 1, 2_002).expect("c1");
        assert_eq!(q, vec![Action::Queued { cell: "c1".into(), position: 1 }], "only GPU 0 free, and fenced");
        // a's own memory is on GPU 0: a may still use it (it is ahead of nobody: c waits first).
        assert_eq!(starts(&s.set_fences(&[], 3_000)), vec![("c".into(), vec![0])]);
    }

    #[test]
    fn a_holder_queued_behind_a_cell_waiting_for_its_fenced_gpu_goes_ahead_on_it() {
        let mut s = HostScheduler::new(1, 1_000, 3.0);
        for k in ["a", "c"] {
            s.add_kernel(k, 1, 0).expect("admit");
        }
        assert!(s.set_fences(&[(0, "a".into())], 0).is_empty());
        let q = s.submit("c", "c1", 1, 1).expect("c1");
        assert_eq!(q, vec![Action::Queued { cell: "c1".into(), position: 1 }], "GPU 0 holds a's memory");
        // a's cell is behind c's, and only a may use GPU 0: without going ahead both would wait.
        assert_eq!(starts(&s.submit("a", "a1", 1, 2).expect("a1")), vec![("a".into(), vec![0])]);
        assert_eq!(s.queued(), vec![("c".to_owned(), 1)], "c still waits, first in line");
        s.finish("a", "a1", 3).expect("finish");
        // The eviction worked this time: the fence is lifted and c gets the GPU.
        s.tick(1_003);
        assert_eq!(starts(&s.set_fences(&[], 1_004)), vec![("c".into(), vec![0])]);
    }

    #[test]
    fn a_holder_needing_more_than_its_fenced_gpu_goes_ahead_of_a_cell_waiting_for_it() {
        let mut s = HostScheduler::new(2, 1_000, 3.0);
        for k in ["a", "c"] {
            s.add_kernel(k, 2, 0).expect("admit");
        }
        assert!(s.set_fences(&[(0, "a".into())], 0).is_empty());
        let q = s.submit("c", "c1", 2, 1).expect("c1");
        assert_eq!(q, vec![Action::Queued { cell: "c1".into(), position: 1 }], "GPU 0 holds a's memory");
        assert_eq!(starts(&s.submit("a", "a1", 2, 2).expect("a1")), vec![("a".into(), vec![0, 1])]);
        assert_eq!(s.queued(), vec![("c".to_owned(), 1)]);
    }

    #[test]
    fn the_kernel_whose_memory_fenced_a_gpu_gets_that_gpu_first() {
        let mut s = HostScheduler::new(2, 1_000, 3.0);
        s.add_kernel("a", 1, 0).expect("admit");
        assert!(s.set_fences(&[(1, "a".into())], 0).is_empty());
        assert_eq!(starts(&s.submit("a", "a1", 1, 1).expect("a1")), vec![("a".into(), vec![1])]);
    }

    #[test]
    fn observed_activity_postpones_idle_release() {
        let mut s = HostScheduler::new(1, 1_000, 1.0);
        s.add_kernel("a", 1, 0).expect("admit");
        s.submit("a", "1", 1, 0).expect("1");
        s.finish("a", "1", 100).expect("finish");
        assert_eq!(s.idle_holders(), vec!["a".to_owned()]);
        // Still using the GPU (a background thread) at 900: not released at 1100.
        s.observed_activity("a", 900);
        assert!(s.tick(1_100).is_empty());
        assert_eq!(s.snapshot().idle_held, 1);
        // Idle for idle_release since the last observed use: revoked.
        assert_eq!(s.tick(1_900), vec![Action::Revoke { kernel: "a".into(), gpus: vec![0], preempted: false }]);
        assert!(s.idle_holders().is_empty());
        // Activity of a kernel holding nothing changes nothing.
        s.observed_activity("a", 2_000);
        assert_eq!(s.snapshot().idle_held, 0);
    }

    #[test]
    fn own_idle_held_gpu_is_reused_and_released_after_idle_release() {
        let mut s = HostScheduler::new(2, 30_000, 1.0);
        s.add_kernel("a", 1, 0).expect("admit");
        s.submit("a", "1", 1, 0).expect("1");
        s.finish("a", "1", 5).expect("f");
        assert_eq!(s.snapshot().idle_held, 1);
        assert_eq!(
            s.submit("a", "2", 1, 6).expect("2"),
            vec![Action::Start { cell: "2".into(), kernel: "a".into(), gpus: vec![0], waited: 0 }]
        );
        s.finish("a", "2", 7).expect("f");
        assert!(s.tick(30_006).is_empty(), "not yet");
        assert_eq!(s.tick(30_007), vec![Action::Revoke { kernel: "a".into(), gpus: vec![0], preempted: false }]);
        assert_eq!(s.snapshot().idle_held, 0);
    }

    #[test]
    fn too_many_gpus_is_rejected_with_a_reason() {
        let mut s = HostScheduler::new(2, 1000, 3.0);
        s.add_kernel("big", 4, 0).expect("admitted; its cells are rejected");
        let acts = s.submit("big", "c", 4, 0).expect("submit");
        assert!(
            matches!(&acts[..], [Action::Reject { reason, .. }] if reason.contains("needs 4 GPUs") && reason.contains("has 2"))
        );
    }

    #[test]
    fn subscription_ratio_is_enforced_and_reported() {
        let mut s = HostScheduler::new(2, 1000, 1.5);
        s.add_kernel("a", 2, 0).expect("a");
        assert!((s.subscription_ratio() - 1.0).abs() < 1e-9);
        assert!(matches!(s.add_kernel("b", 2, 0), Err(Refusal::Oversubscribed { limit: 3, .. })));
        s.add_kernel("c", 1, 0).expect("c fits");
        assert!((s.subscription_ratio() - 1.5).abs() < 1e-9);
        s.add_kernel("cpu", 0, 0).expect("CPU-only kernels are always admitted");
    }

    #[test]
    fn bound_and_reserved_gpu_time_are_integrated() {
        let mut s = HostScheduler::new(2, 10_000, 3.0);
        s.add_kernel("a", 1, 0).expect("a");
        s.add_kernel("b", 2, 1_000).expect("b");
        s.submit("a", "1", 1, 2_000).expect("1");
        s.finish("a", "1", 5_000).expect("f"); // committed 2..5 s, then idle-held
        s.tick(15_000); // released at 15 s
        s.advance(20_000);
        // a: 1 GPU x (5 - 2) s committed + 10 s idle-held = 13 GPU-s.
        assert_eq!(s.bound_gpu_ms(), 13_000);
        // Reservation: a 1 GPU x 20 s + b 2 GPUs x 19 s = 58 GPU-s.
        assert_eq!(s.reserved_gpu_ms(), 58_000);
        let snap = s.snapshot();
        assert!((snap.gpu_seconds_bound - 13.0).abs() < 1e-9 && (snap.gpu_seconds_reserved - 58.0).abs() < 1e-9);
    }

    #[test]
    fn removing_a_kernel_frees_its_gpus_and_serves_the_queue() {
        let mut s = HostScheduler::new(1, 1000, 2.0);
        s.add_kernel("a", 1, 0).expect("a");
        s.add_kernel("b", 1, 0).expect("b");
        s.submit("a", "a1", 1, 0).expect("a1");
        s.submit("b", "b1", 1, 0).expect("b1");
        let acts = s.remove_kernel("a", 5);
        assert_eq!(starts(&acts), vec![("b".into(), vec![0])]);
    }

    #[test]
    fn head_of_queue_is_not_starved_by_smaller_requests() {
        let mut s = HostScheduler::new(2, 1000, 3.0);
        for (k, g) in [("a", 1), ("big", 2), ("c", 1)] {
            s.add_kernel(k, g, 0).expect("admit");
        }
        s.submit("a", "a1", 1, 0).expect("a1");
        s.submit("big", "big1", 2, 1).expect("big1");
        // One GPU is free, but `big` is first in line: `c` waits behind it.
        assert_eq!(s.submit("c", "c1", 1, 2).expect("c1"), vec![Action::Queued { cell: "c1".into(), position: 2 }]);
        let acts = s.finish("a", "a1", 3).expect("f");
        assert_eq!(starts(&acts), vec![("big".into(), vec![0, 1])]);
    }

    #[test]
    fn a_reordered_queue_serves_its_new_head_first() {
        let mut h = HostScheduler::new(1, 1_000, 10.0);
        for k in ["a", "b", "c"] {
            h.add_kernel(k, 1, 0).expect("admitted");
        }
        h.submit("a", "a1", 1, 0).expect("runs");
        h.submit("b", "b1", 1, 1).expect("waits");
        h.submit("c", "c1", 1, 2).expect("waits");
        assert_eq!(h.queued(), vec![("b".to_owned(), 1), ("c".to_owned(), 2)]);
        h.reorder_queue(&["c".to_owned(), "nobody".to_owned()]);
        assert_eq!(h.queued().iter().map(|q| q.0.as_str()).collect::<Vec<_>>(), ["c", "b"]);
        let started: Vec<String> = h
            .finish("a", "a1", 3)
            .expect("ran")
            .into_iter()
            .filter_map(|a| match a {
                Action::Start { cell, .. } => Some(cell),
                _ => None,
            })
            .collect();
        assert_eq!(started, ["c1"]);
    }

    #[test]
    fn a_cell_with_headroom_waits_until_it_can_leave_that_many_free() {
        let mut s = HostScheduler::new(8, 1_000, 10.0);
        for k in ["heavy1", "heavy2", "light"] {
            s.add_kernel(k, 4, 0).expect("fits");
        }
        s.set_headroom("heavy1", 2);
        let a = s.submit("heavy1", "h1", 4, 0).expect("submits");
        assert_eq!(starts(&a).len(), 1, "8 free: 4 for it and 2 kept");
        s.set_headroom("heavy2", 2);
        let a = s.submit("heavy2", "h2", 4, 1).expect("submits");
        assert!(starts(&a).is_empty(), "4 free: taking them would leave none of the 2 kept");
        // The light kernel has no headroom: behind heavy2, held back by its headroom alone,
        // it takes the GPUs kept.
        let a = s.submit("light", "l1", 4, 2).expect("submits");
        assert_eq!(starts(&a), vec![("light".to_owned(), vec![4, 5, 6, 7])], "the kept GPUs are the light one's");
        assert_eq!(s.queued(), vec![("heavy2".to_owned(), 1)], "heavy2 still waits, first in line");
        // Headroom cleared: heavy2 runs once GPUs free up.
        s.set_headroom("heavy2", 0);
        let a = s.finish("heavy1", "h1", 3).expect("running");
        assert_eq!(starts(&a).len(), 1, "heavy2 took heavy1's GPUs: {a:?}");
        assert_eq!(s.kernels().iter().filter(|k| k.2).count(), 2, "light and heavy2 run");
    }
}
