//! Per-cell GPU binding on this host: the daemon side of the scheduler core.
//!
//! On `execute_request` of a kernel that wants GPUs, the cell is submitted to the
//! [`HostScheduler`]; it runs when its GPUs are committed, or waits in the queue
//! and its client is told so (a `stream` message on stderr naming its place and a
//! `notebookos_cells_waiting_for_gpus` metric), or is refused with an error reply
//! when the host can never satisfy it. The kernel's `execute_reply` releases the
//! cell's GPUs to idle-held; a tick releases idle-held GPUs after `idle_release`;
//! a dead or deleted kernel frees its GPUs at once.
//!
//! What the binding asks of the lease server is the [`LeaseControl`] trait.
//!
//! Waiting cells go in fair-share order ([`super::fair_share`], `gpu.fair_share`): before
//! the queue is served, it is put in [`nbos_sched::fairshare::order`] of the cells' owners'
//! recent GPU time, which counts the GPUs committed to each owner's cells. With
//! `gpu.fair_share_headroom`, each waiting cell (and the LEAD/YIELD probe,
//! [`Binder::can_commit_now`]) must leave free the GPUs [`nbos_sched::fairshare::headroom`]
//! keeps for the idle kernels of users within their share.
//!
//! A cell whose owner used their `gpu_hours_per_day` today (UTC; [`super::gpu_hours`]) is
//! refused with an error reply when it asks for GPUs: the binder counts each user's GPU time
//! today ([`super::daily_usage`]) and adds the other hosts' published counts ([`OtherHosts`]).
//!
//! [`Binder::dispatch`] also tells its caller (the cluster's replica host) when a bound
//! cell's GPUs were committed and when the cell was written to the kernel's shell socket,
//! which happens later, from a task of its own.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::oneshot;

use super::daily_usage::{DailyUsage, Usage};
use super::fair_share::{FairShare, OwnerLookup};
use super::gpu_hours::{self, GpuHoursLimits, OtherHosts};
use super::hub::ClientId;
use super::LocalKernel;
use crate::jupyter::{Channel, Message};
use crate::metrics::{Metrics, OutcomeLabels};
use nbos_sched::host::{Action, HostScheduler};
use nbos_sched::Millis;

/// What per-cell binding needs from the lease server (`daemon/src/lease`), so the
/// shim in a kernel process is granted exactly the GPUs the scheduler committed.
pub trait LeaseControl: Send + Sync {
    /// A process of `kernel` was started: it (and its descendants) may ask for up
    /// to `gpus` GPUs.
    fn register(&self, kernel: &str, pid: u32, gpus: u32) {
        tracing::debug!(kernel, pid, gpus, "kernel process started");
    }
    /// The kernel's cell may now use `gpus` (host indices): the next lease request
    /// of a process of this kernel is granted on them.
    fn bind(&self, kernel: &str, pids: &[u32], gpus: &[u32]);
    /// Take the GPUs back: the shim stops new work and the host evicts the
    /// process's GPU memory. `preempted` when another kernel is waiting.
    fn revoke(&self, kernel: &str, pids: &[u32], gpus: &[u32], preempted: bool);
    /// The kernel is gone; forget its processes.
    fn forget(&self, kernel: &str, pids: &[u32]);
}

/// The lease control used until a lease server is attached: it only logs. With
/// it, binding still orders cells and accounts GPUs; nothing enforces it inside
/// the kernel process.
#[derive(Debug, Default)]
pub struct LogOnlyLeases;

impl LeaseControl for LogOnlyLeases {
    fn bind(&self, kernel: &str, pids: &[u32], gpus: &[u32]) {
        tracing::debug!(kernel, ?pids, ?gpus, "GPUs committed");
    }
    fn revoke(&self, kernel: &str, pids: &[u32], gpus: &[u32], preempted: bool) {
        tracing::debug!(kernel, ?pids, ?gpus, preempted, "GPUs revoked");
    }
    fn forget(&self, kernel: &str, pids: &[u32]) {
        tracing::debug!(kernel, ?pids, "kernel forgotten");
    }
}

/// When a cell that binding took reached its kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// Its GPUs were committed and passed to the lease server ([`LeaseControl::bind`]).
    pub bound: SystemTime,
    /// Its `execute_request` was written to the kernel's shell socket (after `bound`).
    pub written: SystemTime,
}

/// Where a client's message goes after binding ([`Binder::dispatch`]).
#[derive(Debug)]
pub enum Dispatch {
    /// Forward it now: not a cell, or a kernel without GPUs.
    Now(Message),
    /// Binding took the cell: it is written to the kernel once its GPUs are committed. The
    /// receiver gets when (or why the write failed); it is closed without a value when the
    /// cell was refused (binding answers it with an error reply) or dropped with its kernel.
    Bound(oneshot::Receiver<Result<Written, String>>),
}

/// A cell waiting for its GPUs.
struct Waiting {
    kernel: Arc<LocalKernel>,
    client: ClientId,
    msg: Message,
    /// Told when the cell was written to the kernel (see [`Dispatch::Bound`]).
    notify: Option<oneshot::Sender<Result<Written, String>>>,
}

struct State {
    sched: HostScheduler,
    waiting: HashMap<String, Waiting>,
    /// Running GPU cells: cell id -> kernel id.
    running: HashMap<String, String>,
    kernels: HashMap<String, Arc<LocalKernel>>,
    /// Cells sent while the kernel already had one running or waiting: a kernel
    /// runs one cell at a time, so each is submitted when the previous one ends.
    backlog: HashMap<String, VecDeque<Waiting>>,
    /// Processes registered with the lease control, by kernel (forgotten at restart).
    registered: HashMap<String, Vec<u32>>,
    /// Cells of kernels that are gone: answered with an error once the lock is released
    /// (answering delivers a reply, whose observer takes this lock).
    orphaned: Vec<Waiting>,
    /// Owners' recent GPU time and the order waiting cells go in.
    fair: FairShare,
    /// Each user's GPU time today (UTC), for `gpu_hours_per_day`.
    daily: DailyUsage,
    /// Who owns each kernel, as a user (for the day's count and its limits).
    owners: Arc<dyn OwnerLookup>,
    /// `gpu_hours_per_day` limits; `None`: none set.
    gpu_hours: Option<GpuHoursLimits>,
    /// The other hosts' counts (cluster mode).
    others: Option<Arc<dyn OtherHosts>>,
    /// Cells refused by `gpu_hours_per_day`, with their owner and why: answered once the
    /// lock is released, as `orphaned`.
    refused: Vec<(Waiting, String, String)>,
    /// `auth.audit_log`: a refused cell is a line.
    audit: Option<Arc<crate::users::audit::AuditLog>>,
}

impl State {
    /// Puts the waiting cells in fair-share order (none when it is off), so the next call
    /// that serves the queue serves the furthest below their share first.
    fn order_fairly(&mut self, now: Millis) {
        self.order_fairly_as(now, None);
    }

    /// As [`Self::order_fairly`], with the cell of kernel `ending` (when one) about to end:
    /// the headroom kept counts that kernel as idle, as it is once the queue is served.
    fn order_fairly_as(&mut self, now: Millis, ending: Option<&str>) {
        let queued = self.sched.queued();
        if let Some(order) = self.fair.order(&queued, now) {
            self.sched.reorder_queue(&order);
        }
        self.keep_headroom(now, ending);
    }

    /// Sets each waiting cell's headroom (`gpu.fair_share_headroom`; 0 when off).
    fn keep_headroom(&mut self, now: Millis, ending: Option<&str>) {
        let mut kernels = self.sched.kernels();
        for k in &mut kernels {
            k.2 &= ending != Some(k.0.as_str());
        }
        for (k, _) in self.sched.queued() {
            let keep = self.fair.headroom(&k, &kernels, now);
            self.sched.set_headroom(&k, keep);
        }
    }

    /// `cell` of `kernel` was committed `gpus` GPUs: its owner's GPU time counts from now.
    fn cell_started(&mut self, kernel: &str, cell: &str, gpus: u32, now: Millis, wall: u64) {
        self.fair.started(kernel, cell, gpus, now);
        if let Some(user) = self.owners.user(kernel) {
            self.daily.started(cell, &user, gpus, wall);
        }
    }

    /// `cell` gave its GPUs back (it ended, or its kernel died or restarted).
    fn cell_ended(&mut self, cell: &str, now: Millis, wall: u64) {
        self.fair.ended(cell, now);
        self.daily.ended(cell, wall);
    }

    /// Why a cell of `kernel` asking for `gpus` may not have them today, if so: its owner
    /// and the refusal.
    fn over_gpu_hours(&mut self, kernel: &str, gpus: u32, wall: u64) -> Option<(String, String)> {
        let limits = self.gpu_hours.as_ref()?;
        if gpus == 0 {
            return None;
        }
        let user = self.owners.user(kernel)?;
        let mut usage = self.daily.today(wall);
        if let Some(others) = &self.others {
            let theirs = others.usage(usage.day);
            usage.add(&theirs);
        }
        gpu_hours::check(limits, &user, gpus, &usage).err().map(|e| (user.name, e.to_string()))
    }
}

/// The wall clock, Unix milliseconds (the day's count's time).
fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Per-cell GPU binding for the kernels of this host.
pub struct Binder {
    state: Mutex<State>,
    origin: Instant,
    leases: Arc<dyn LeaseControl>,
    metrics: Arc<Metrics>,
    total_gpus: u32,
}

impl Binder {
    /// A binder for a host with `gpus` GPUs.
    pub fn new(
        gpus: u32,
        idle_release: Duration,
        ratio: f64,
        leases: Arc<dyn LeaseControl>,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        let idle_ms = Millis::try_from(idle_release.as_millis()).unwrap_or(Millis::MAX);
        Arc::new(Self {
            state: Mutex::new(State {
                sched: HostScheduler::new(gpus, idle_ms, ratio),
                waiting: HashMap::new(),
                running: HashMap::new(),
                kernels: HashMap::new(),
                backlog: HashMap::new(),
                registered: HashMap::new(),
                orphaned: Vec::new(),
                fair: FairShare::new(),
                daily: DailyUsage::new(),
                owners: Arc::new(super::fair_share::Anonymous),
                gpu_hours: None,
                others: None,
                refused: Vec::new(),
                audit: None,
            }),
            origin: Instant::now(),
            leases,
            metrics,
            total_gpus: gpus,
        })
    }

    /// Sets the fair share: on or off (`gpu.fair_share`), its half-life
    /// (`gpu.fair_share_half_life`), and who owns each kernel (default: one anonymous user).
    /// Recent GPU time counted so far is forgotten.
    pub fn set_fair_share(&self, enabled: bool, half_life: Duration, owners: Arc<dyn OwnerLookup>) {
        let mut st = self.lock();
        st.fair = FairShare::with(enabled, half_life, owners.clone());
        st.owners = owners;
    }

    /// Keeps the fair share's headroom (`gpu.fair_share_headroom`) or not.
    pub fn set_fair_share_headroom(&self, on: bool) {
        self.lock().fair.set_headroom(on);
    }

    /// Sets the `gpu_hours_per_day` limits (none when `limits` sets none).
    pub fn set_gpu_hours(&self, limits: GpuHoursLimits) {
        self.lock().gpu_hours = Some(limits).filter(|l| !l.is_empty());
    }

    /// Sets the audit log refused cells are written to (`auth.audit_log`).
    pub fn set_audit(&self, audit: Arc<crate::users::audit::AuditLog>) {
        self.lock().audit = Some(audit);
    }

    /// Sets where the other hosts' GPU time today comes from (cluster mode).
    pub fn set_other_hosts(&self, others: Arc<dyn OtherHosts>) {
        self.lock().others = Some(others);
    }

    /// This host's GPU time today (UTC), by user and group, GPU-milliseconds: what it publishes.
    pub fn usage_today(&self) -> Usage {
        self.lock().daily.today(wall_ms())
    }

    fn now(&self) -> Millis {
        Millis::try_from(self.origin.elapsed().as_millis()).unwrap_or(Millis::MAX)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Registers a kernel; refused when the host's subscription ratio would be exceeded.
    pub fn add_kernel(&self, kernel: &Arc<LocalKernel>) -> Result<(), nbos_sched::Refusal> {
        let mut st = self.lock();
        let now = self.now();
        st.sched.add_kernel(&kernel.id, kernel.gpus, now)?;
        st.kernels.insert(kernel.id.clone(), kernel.clone());
        self.export(&st);
        Ok(())
    }

    /// A process of a registered kernel started (at creation or restart).
    pub fn process_started(&self, kernel_id: &str, pid: u32) {
        let gpus = {
            let mut st = self.lock();
            let gpus = st.kernels.get(kernel_id).map(|k| k.gpus);
            if gpus.is_some() {
                st.registered.entry(kernel_id.to_owned()).or_default().push(pid);
            }
            gpus
        };
        if let Some(gpus) = gpus {
            self.leases.register(kernel_id, pid, gpus);
        }
    }

    /// A process exited (observer exit event): it may no longer lease and its
    /// leases are gone at once, before the kernel's own waiter notices.
    pub fn process_exited(&self, pid: u32) {
        let kernel = self.lock().kernels.values().find(|k| k.pids().contains(&pid)).map(|k| k.id.clone());
        if let Some(kernel) = kernel {
            tracing::info!(kernel = %kernel, pid, "kernel process exited; forgetting its leases");
            self.leases.forget(&kernel, &[pid]);
        }
    }

    /// Checks admission before a kernel is started (same rule as [`Self::add_kernel`]).
    pub fn would_admit(&self, gpus: u32) -> Result<(), nbos_sched::Refusal> {
        let mut probe = self.lock().sched.clone();
        probe.add_kernel("\u{0}probe", gpus, 0)
    }

    /// Whether a cell of `kernel_id` asking for `gpus` would be bound to GPUs right now
    /// (free ones, or idle-held ones the scheduler would take back), rather than wait:
    /// the replica host's LEAD/YIELD decision. Decides on a copy; nothing changes.
    pub fn can_commit_now(&self, kernel_id: &str, gpus: u32) -> bool {
        if gpus == 0 {
            return true;
        }
        const PROBE: &str = "\u{0}probe";
        let now = self.now();
        let mut probe = {
            let mut st = self.lock();
            if st.running.values().any(|k| k == kernel_id) || st.waiting.values().any(|w| w.kernel.id == kernel_id) {
                return false;
            }
            // A user over their share may not take the GPUs kept for the others' kernels.
            let kernels = st.sched.kernels();
            let keep = st.fair.headroom(kernel_id, &kernels, now);
            let mut probe = st.sched.clone();
            probe.set_headroom(kernel_id, keep);
            probe
        };
        match probe.submit(kernel_id, PROBE, gpus, now) {
            Ok(actions) => actions.iter().any(|a| matches!(a, Action::Start { cell, .. } if cell == PROBE)),
            Err(_) => false,
        }
    }

    /// The kernel is gone (deleted or died): its GPUs are free at once.
    pub fn remove_kernel(self: &Arc<Self>, kernel_id: &str, pids: &[u32]) {
        let actions = {
            let mut st = self.lock();
            st.kernels.remove(kernel_id);
            st.registered.remove(kernel_id);
            let backlog = st.backlog.remove(kernel_id).unwrap_or_default();
            st.orphaned.extend(backlog);
            let cells: Vec<String> =
                st.waiting.iter().filter(|(_, w)| w.kernel.id == kernel_id).map(|(c, _)| c.clone()).collect();
            let waiting: Vec<Waiting> = cells.iter().filter_map(|c| st.waiting.remove(c)).collect();
            st.orphaned.extend(waiting);
            let now = self.now();
            let gone: Vec<String> =
                st.running.iter().filter(|(_, k)| *k == kernel_id).map(|(c, _)| c.clone()).collect();
            let wall = wall_ms();
            for cell in gone {
                st.cell_ended(&cell, now, wall);
            }
            st.running.retain(|_, k| k != kernel_id);
            st.fair.forget(kernel_id, now);
            st.order_fairly(now);
            st.sched.remove_kernel(kernel_id, now)
        };
        self.leases.forget(kernel_id, pids);
        self.apply(actions);
    }

    /// The kernel was restarted: its running cell died with the old process (its
    /// GPUs are free now), and its waiting cells are answered with an error.
    pub fn reset_kernel(self: &Arc<Self>, kernel_id: &str) {
        // The old processes are gone: they may no longer lease (the new one registers when it starts).
        let old = self.lock().registered.remove(kernel_id).unwrap_or_default();
        if !old.is_empty() {
            self.leases.forget(kernel_id, &old);
        }
        let (actions, dropped) = {
            let mut st = self.lock();
            let Some(kernel) = st.kernels.get(kernel_id).cloned() else { return };
            let now = self.now();
            let died: Vec<String> =
                st.running.iter().filter(|(_, k)| *k == kernel_id).map(|(c, _)| c.clone()).collect();
            let wall = wall_ms();
            for cell in died {
                st.cell_ended(&cell, now, wall);
            }
            st.running.retain(|_, k| k != kernel_id);
            let cells: Vec<String> =
                st.waiting.iter().filter(|(_, w)| w.kernel.id == kernel_id).map(|(c, _)| c.clone()).collect();
            let mut dropped: Vec<Waiting> = cells.iter().filter_map(|c| st.waiting.remove(c)).collect();
            dropped.extend(st.backlog.remove(kernel_id).unwrap_or_default());
            let mut actions = st.sched.remove_kernel(kernel_id, now);
            if let Err(e) = st.sched.add_kernel(kernel_id, kernel.gpus, now) {
                tracing::warn!(kernel = kernel_id, error = %e, "could not re-register a restarted kernel");
            }
            st.order_fairly(now);
            actions.extend(st.sched.tick(now));
            (actions, dropped)
        };
        for w in dropped {
            w.kernel.reject_cell(w.client, &w.msg, "KernelRestarted", "the kernel was restarted before this cell ran");
        }
        self.apply(actions);
    }

    /// A client's message for `kernel`. Returns the message when it should be
    /// forwarded now, `None` when binding has taken care of it (queued or refused).
    pub fn on_client_message(
        self: &Arc<Self>,
        kernel: &Arc<LocalKernel>,
        client: ClientId,
        channel: Channel,
        msg: Message,
    ) -> Option<Message> {
        self.take(kernel, client, channel, msg, None)
    }

    /// Like [`Self::on_client_message`], and for a cell binding takes, says when it was
    /// written to the kernel ([`Dispatch::Bound`]).
    pub fn dispatch(
        self: &Arc<Self>,
        kernel: &Arc<LocalKernel>,
        client: ClientId,
        channel: Channel,
        msg: Message,
    ) -> Dispatch {
        let (tx, rx) = oneshot::channel();
        match self.take(kernel, client, channel, msg, Some(tx)) {
            Some(msg) => Dispatch::Now(msg),
            None => Dispatch::Bound(rx),
        }
    }

    fn take(
        self: &Arc<Self>,
        kernel: &Arc<LocalKernel>,
        client: ClientId,
        channel: Channel,
        msg: Message,
        notify: Option<oneshot::Sender<Result<Written, String>>>,
    ) -> Option<Message> {
        if channel != Channel::Shell || kernel.gpus == 0 {
            return Some(msg);
        }
        let Ok(header) = msg.header() else { return Some(msg) };
        if header.msg_type != "execute_request" {
            return Some(msg);
        }
        let cell = header.msg_id.clone();
        let actions = {
            let mut st = self.lock();
            let w = Waiting { kernel: kernel.clone(), client, msg, notify };
            let busy = st.backlog.get(&kernel.id).is_some_and(|b| !b.is_empty())
                || st.running.values().any(|k| *k == kernel.id)
                || st.waiting.values().any(|x| x.kernel.id == kernel.id);
            if busy {
                st.backlog.entry(kernel.id.clone()).or_default().push_back(w);
                return None;
            }
            self.submit_locked(&mut st, &cell, w)
        };
        self.apply(actions);
        None
    }

    fn submit_locked(&self, st: &mut State, cell: &str, w: Waiting) -> Vec<Action> {
        let now = self.now();
        let (kernel_id, gpus) = (w.kernel.id.clone(), w.kernel.gpus);
        if let Some((user, why)) = st.over_gpu_hours(&kernel_id, gpus, wall_ms()) {
            st.refused.push((w, user, why));
            return Vec::new();
        }
        st.waiting.insert(cell.to_owned(), w);
        st.order_fairly(now);
        let keep = st.fair.headroom(&kernel_id, &st.sched.kernels(), now);
        st.sched.set_headroom(&kernel_id, keep);
        match st.sched.submit(&kernel_id, cell, gpus, now) {
            Ok(mut actions) => {
                // The new cell joined at the back; if it goes first by fair share, it may
                // run now on GPUs the old head could not use.
                if st.sched.queued().len() > 1 {
                    st.order_fairly(now);
                    actions.extend(st.sched.tick(now));
                    // The client is told its place in the queue as reordered, or nothing
                    // if it was started.
                    let started = actions.iter().any(|a| matches!(a, Action::Start { cell: c, .. } if c == cell));
                    if started {
                        actions.retain(|a| !matches!(a, Action::Queued { cell: c, .. } if c == cell));
                    }
                    let queued = st.sched.queued();
                    for a in &mut actions {
                        if let Action::Queued { cell: c, position } = a {
                            if let Some(p) = queued.iter().position(|(k, _)| *k == kernel_id).filter(|_| c == cell) {
                                *position = p + 1;
                            }
                        }
                    }
                }
                actions
            }
            Err(e) => {
                // Unknown kernel (dead or removed meanwhile): nothing will run the cell.
                tracing::warn!(kernel = %kernel_id, error = %e, "cell of a kernel that is gone");
                st.orphaned.extend(st.waiting.remove(cell));
                Vec::new()
            }
        }
    }

    /// A message from the kernel: an `execute_reply` ends a GPU cell.
    pub fn on_kernel_reply(self: &Arc<Self>, kernel_id: &str, parent_msg_id: &str) {
        let actions = {
            let mut st = self.lock();
            if st.running.get(parent_msg_id).map(String::as_str) != Some(kernel_id) {
                return;
            }
            st.running.remove(parent_msg_id);
            let now = self.now();
            st.cell_ended(parent_msg_id, now, wall_ms());
            st.order_fairly_as(now, Some(kernel_id));
            let mut actions = st.sched.finish(kernel_id, parent_msg_id, now).unwrap_or_default();
            let next = st.backlog.get_mut(kernel_id).and_then(VecDeque::pop_front);
            if let Some(w) = next {
                match w.msg.header() {
                    Ok(h) => actions.extend(self.submit_locked(&mut st, &h.msg_id, w)),
                    Err(e) => tracing::warn!(error = %e, "backlogged cell without a header"),
                }
            }
            actions
        };
        self.apply(actions);
    }

    /// Kernels with idle-held GPUs, with their processes (for the observer's idleness).
    pub fn idle_holders(&self) -> Vec<(String, Vec<u32>)> {
        let st = self.lock();
        st.sched
            .idle_holders()
            .into_iter()
            .filter_map(|k| st.kernels.get(&k).map(|kernel| (k, kernel.pids())))
            .collect()
    }

    /// The observer saw `kernel` use its GPUs `ago`: idle release counts from then.
    pub fn observed_activity(&self, kernel_id: &str, ago: Duration) {
        let mut st = self.lock();
        let at = self.now().saturating_sub(Millis::try_from(ago.as_millis()).unwrap_or(Millis::MAX));
        st.sched.observed_activity(kernel_id, at);
    }

    /// Releases idle-held GPUs past `idle_release`; call about once a second.
    pub fn tick(self: &Arc<Self>) {
        let actions = {
            let mut st = self.lock();
            let now = self.now();
            st.order_fairly(now);
            st.sched.tick(now)
        };
        if !actions.is_empty() {
            self.apply(actions);
        }
    }

    /// The GPUs the lease server fenced now, with the kernel whose memory is on each:
    /// no other kernel's cell is given them until they are unfenced.
    pub fn set_fences(self: &Arc<Self>, fences: &[(u32, String)]) {
        let actions = {
            let mut st = self.lock();
            let now = self.now();
            st.sched.set_fences(fences, now)
        };
        if !actions.is_empty() {
            self.apply(actions);
        }
    }

    /// The scheduler's view (for `GET /api/v1/gpus` and `nbos kernels`).
    pub fn snapshot(&self) -> nbos_sched::host::Snapshot {
        let mut st = self.lock();
        let now = self.now();
        st.sched.advance(now);
        st.sched.snapshot()
    }

    /// GPUs on the host.
    pub fn total_gpus(&self) -> u32 {
        self.total_gpus
    }

    fn export(&self, st: &State) {
        let snap = st.sched.snapshot();
        self.metrics.gpus_committed.set(i64::from(snap.committed));
        self.metrics.gpus_idle_held.set(i64::from(snap.idle_held));
        self.metrics.cells_waiting_for_gpus.set(i64::try_from(snap.waiting.len()).unwrap_or(i64::MAX));
        self.metrics.subscription_ratio.set(st.sched.subscription_ratio());
    }

    fn apply(self: &Arc<Self>, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Revoke { kernel, gpus, preempted } => {
                    let pids = self.lock().kernels.get(&kernel).map(|k| k.pids()).unwrap_or_default();
                    self.metrics.gpu_revocations_total.inc();
                    self.leases.revoke(&kernel, &pids, &gpus, preempted);
                }
                Action::Start { cell, kernel, gpus, waited } => {
                    let w = {
                        let mut st = self.lock();
                        st.running.insert(cell.clone(), kernel.clone());
                        let now = self.now();
                        let n = u32::try_from(gpus.len()).unwrap_or(u32::MAX);
                        st.cell_started(&kernel, &cell, n, now, wall_ms());
                        st.waiting.remove(&cell)
                    };
                    let Some(w) = w else { continue };
                    let pids = w.kernel.pids();
                    self.leases.bind(&kernel, &pids, &gpus);
                    let bound = SystemTime::now();
                    tracing::info!(kernel = %kernel, cell = %cell, ?gpus, waited_ms = waited, "cell bound to GPUs");
                    if waited > 0 {
                        w.kernel.publish(
                            &w.msg,
                            "stream",
                            &serde_json::json!({
                                "name": "stderr",
                                "text": format!("[NotebookOS] got GPU(s) {gpus:?} after waiting {:.1} s\n", waited as f64 / 1000.0),
                            }),
                        );
                    }
                    let Waiting { kernel: k, client, msg, notify } = w;
                    tokio::spawn(async move {
                        let sent = k.send_from_client(client, Channel::Shell, msg).await;
                        // Stamped as soon as the write returns (nothing awaited in between).
                        let written = SystemTime::now();
                        let result = match sent {
                            Ok(()) => Ok(Written { bound, written }),
                            Err(e) => {
                                tracing::warn!(kernel = %k.id, error = format!("{e:#}"), "could not start a bound cell");
                                Err(format!("{e:#}"))
                            }
                        };
                        if let Some(tx) = notify {
                            // The caller may have stopped waiting (its kernel died): nothing to tell.
                            let _ = tx.send(result);
                        }
                    });
                }
                Action::Queued { cell, position } => {
                    let st = self.lock();
                    if let Some(w) = st.waiting.get(&cell) {
                        tracing::info!(kernel = %w.kernel.id, cell = %cell, position, "cell waits for GPUs");
                        w.kernel.hub.expect_reply(&cell, w.client, SystemTime::now());
                        w.kernel.publish(
                            &w.msg,
                            "stream",
                            &serde_json::json!({
                                "name": "stderr",
                                "text": format!(
                                    "[NotebookOS] waiting for {} GPU(s): all {} are in use; position {position} in the queue\n",
                                    w.kernel.gpus, self.total_gpus
                                ),
                            }),
                        );
                    }
                }
                Action::Reject { cell, reason } => {
                    let w = self.lock().waiting.remove(&cell);
                    let Some(w) = w else { continue };
                    self.metrics.cells_total.get_or_create(&OutcomeLabels { outcome: "rejected".into() }).inc();
                    tracing::warn!(kernel = %w.kernel.id, cell = %cell, %reason, "cell rejected");
                    w.kernel.reject_cell(w.client, &w.msg, "NotEnoughGPUs", &reason);
                }
            }
        }
        let (refused, audit) = {
            let mut st = self.lock();
            (std::mem::take(&mut st.refused), st.audit.clone())
        };
        for (w, user, why) in refused {
            if let Some(log) = &audit {
                let event = crate::users::audit::event(&user, "execute", Some(&w.kernel.id), "refused");
                log.record(crate::users::audit::AuditEvent { detail: Some(&why), ..event });
            }
            crate::metrics::count_refusal(gpu_hours::REASON);
            crate::users::metrics::user_metrics().count_refusal(&user, gpu_hours::REASON);
            self.metrics.cells_total.get_or_create(&OutcomeLabels { outcome: "rejected".into() }).inc();
            tracing::warn!(kernel = %w.kernel.id, user = %user, reason = %why, "cell refused: GPU-hours quota");
            w.kernel.reject_cell(w.client, &w.msg, "GpuHoursQuota", &why);
        }
        let orphaned = std::mem::take(&mut self.lock().orphaned);
        for w in orphaned {
            w.kernel.reject_cell(
                w.client,
                &w.msg,
                "DeadKernel",
                "the kernel died or was shut down before this cell ran",
            );
        }
        let st = self.lock();
        self.export(&st);
    }
}
