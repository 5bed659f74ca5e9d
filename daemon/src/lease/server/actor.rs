//! The actor: the lease [`Table`] and every connection's writer behind one mutex
//! ([`Shared::actor`]), the API events queued for it ([`Event`]), the registry of kernel
//! processes allowed to lease, and the timer thread. A connection thread handles its
//! peer's frame itself under the actor lock; the timer thread runs ticks and API events.

use std::collections::HashMap;
use std::collections::VecDeque;
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nbos_lease_proto::{write_message, Message};

use super::config::LeaseServerConfig;
use super::gpu_uuid::{uuid_bytes, uuid_string};
use crate::gpu::control::{Eviction, EvictionFailure, GpuControl};
use crate::gpu::GpuInfo;
use crate::lease::metrics::LeaseMetrics;
use crate::lease::table::{Action, LeaseState, Table};
pub use crate::status::FencedGpu;

/// A kernel process the daemon started (the root of a process tree allowed to lease).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredProcess {
    /// The kernel's id.
    pub kernel_id: String,
    /// Replica number.
    pub replica: u32,
    /// Process id.
    pub pid: u32,
    /// User it runs as.
    pub uid: u32,
    /// GPUs it may lease.
    pub gpus: u32,
}

/// One connected process, as reported by [`LeaseServer::status`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ProcessStatus {
    /// Process id (of the shim's process; may be a descendant of the kernel process).
    pub pid: u32,
    /// Kernel id.
    pub kernel_id: String,
    /// Lease state.
    pub state: LeaseState,
    /// Lease number.
    pub lease: u64,
    /// Indices of the GPUs bound.
    pub gpus: Vec<usize>,
    /// Restores of its memory that failed in a row: while above 0 it waits, its call
    /// blocked, and the restore is retried (it never runs without its memory).
    pub restore_failures: u32,
}

/// How often a fenced GPU's memory is looked at again (NVML per-process memory).
pub const FENCE_RECHECK: Duration = Duration::from_millis(500);

pub(super) enum Event {
    Connected { conn: u64, pid: u32, kernel_id: String, gpus: u32, writer: UnixStream },
    Frame { conn: u64, msg: Message },
    Closed { conn: u64 },
    Revoke { pid: u32 },
    Assign { kernel_id: String, gpus: Option<Vec<usize>> },
    Cordon { gpu: usize, on: bool },
    Pause(bool),
    Checkpointing(bool),
    Stop,
}

/// Called with `(pid, calls)` for every shim `Activity` report (the node feeds the GPU
/// observer with it). Runs on the lease actor's thread: it must be quick.
pub type ActivityHook = Arc<dyn Fn(u32, u64) + Send + Sync>;

/// Called with `(kernel id, GPU indices)` whenever the GPUs a kernel's processes hold
/// change (the GPU device guard opens and closes their device files). Runs on the lease
/// actor's thread before a `Grant` (and its restore) reaches the process, and after a
/// release: it must be quick.
pub type DeviceHook = Arc<dyn Fn(&str, &[usize]) + Send + Sync>;

pub(super) struct Shared {
    /// The table and everything that writes frames; taken by connection threads and the
    /// timer thread. Lock order: `actor` before `queue` and `status`.
    pub(super) actor: Mutex<Actor>,
    /// API events not yet applied (drained only under `actor`).
    pub(super) queue: Mutex<VecDeque<Event>>,
    /// Signalled when `queue` gets an event.
    pub(super) queued: Condvar,
    pub(super) registry: Mutex<HashMap<u32, Registration>>,
    pub(super) activity_hook: Mutex<Option<ActivityHook>>,
    pub(super) device_hook: Mutex<Option<DeviceHook>>,
    pub(super) status: Mutex<Vec<ProcessStatus>>,
    /// The fenced GPUs, as last published.
    pub(super) fenced: Mutex<Vec<FencedGpu>>,
    pub(super) changed: Condvar,
    pub(super) stop: AtomicBool,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking holder cannot leave these plain tables half-updated in a way that
    // matters more than stopping the lease server would.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    /// Queues an API event for the timer thread (or the next frame handled, whichever
    /// takes the actor lock first).
    pub(super) fn post(&self, ev: Event) {
        lock(&self.queue).push_back(ev);
        self.queued.notify_one();
    }

    /// Under the actor lock: applies the queued API events, then `ev` (a frame or a
    /// connection change, handled directly on the calling thread), then the timers, and
    /// writes what results. Returns false once the server is stopping.
    pub(super) fn apply(&self, ev: Option<Event>) -> bool {
        let mut actor = lock(&self.actor);
        let pending: Vec<Event> = lock(&self.queue).drain(..).collect();
        let mut any = false;
        // One event at a time, each followed by the timers and its writes, as a single
        // actor thread consuming them in order would.
        for e in pending.into_iter().chain(ev) {
            if actor.stopped {
                return false;
            }
            let mut actions = actor.handle(e, Instant::now(), self);
            actions.extend(actor.recheck_fences(Instant::now()));
            actions.extend(actor.table.tick(Instant::now()));
            actor.perform(actions, self);
            actor.sync_devices(self);
            actor.publish(self);
            any = true;
        }
        if actor.stopped {
            return false;
        }
        if !any {
            // A timer wake-up with nothing queued.
            let mut actions = actor.recheck_fences(Instant::now());
            actions.extend(actor.table.tick(Instant::now()));
            actor.perform(actions, self);
            actor.sync_devices(self);
            actor.publish(self);
        }
        true
    }
}

/// Runs the timers (idle detection) and applies API events when no frame comes.
pub(super) fn timer_loop(shared: &Shared, tick: Duration) {
    loop {
        {
            let q = lock(&shared.queue);
            if q.is_empty() {
                let _ = shared.queued.wait_timeout(q, tick).unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        }
        if !shared.apply(None) {
            return;
        }
    }
}

/// A registered kernel process and a pidfd of it (None: it was gone at registration).
pub(super) struct Registration {
    pub(super) process: RegisteredProcess,
    pub(super) pidfd: Option<std::os::fd::OwnedFd>,
}

pub(super) struct Conn {
    pub(super) pid: u32,
    pub(super) kernel_id: String,
    pub(super) writer: UnixStream,
}

pub(super) struct Actor {
    pub(super) table: Table,
    pub(super) gpus: Vec<GpuInfo>,
    pub(super) control: GpuControl,
    pub(super) conns: HashMap<u64, Conn>,
    pub(super) by_pid: HashMap<u32, u64>,
    pub(super) metrics: LeaseMetrics,
    pub(super) cfg: LeaseServerConfig,
    pub(super) checkpointing: bool,
    /// The scheduler's GPU assignment per kernel id (applied to every process of it).
    pub(super) assigned: HashMap<String, Vec<usize>>,
    /// The GPUs each kernel was last told to the device hook to hold (absent: none).
    pub(super) devices_told: HashMap<String, Vec<usize>>,
    /// `Stop` was handled: nothing more is applied.
    pub(super) stopped: bool,
    /// When fenced GPUs' memory was last looked at.
    pub(super) fences_checked: Instant,
}

impl Actor {
    pub(super) fn uuid(&self, gpu: usize) -> [u8; 16] {
        self.gpus.get(gpu).and_then(|g| uuid_bytes(&g.uuid)).unwrap_or([0; 16])
    }

    pub(super) fn handle(&mut self, ev: Event, now: Instant, shared: &Shared) -> Vec<Action> {
        match ev {
            Event::Connected { conn, pid, kernel_id, gpus, mut writer } => {
                let want = self.table.add(pid, gpus as usize, now);
                let reply = Message::Registered {
                    device_count: want as u32,
                    activity_interval_ms: u32::try_from(self.cfg.activity_interval.as_millis()).unwrap_or(u32::MAX),
                    memory_limit_bytes: self.cfg.memory_limit_bytes,
                    host_pid: pid,
                    driver_path: self.cfg.driver_path.to_string_lossy().into_owned(),
                };
                if write_message(&mut writer, &reply).is_err() {
                    return self.table.remove(pid, now);
                }
                tracing::info!(pid, kernel = %kernel_id, gpus = want, "shim registered");
                let assigned = self.assigned.get(&kernel_id).cloned();
                self.by_pid.insert(pid, conn);
                self.conns.insert(conn, Conn { pid, kernel_id, writer });
                match assigned {
                    Some(gpus) => self.table.assign(pid, Some(gpus), now),
                    None => Vec::new(),
                }
            }
            Event::Frame { conn, msg } => {
                let Some(pid) = self.conns.get(&conn).map(|c| c.pid) else { return Vec::new() };
                match msg {
                    Message::Request { .. } => self.table.request(pid, now),
                    Message::Activity { calls, .. } => {
                        self.table.activity(pid, calls, now);
                        let hook = lock(&shared.activity_hook).clone();
                        if let Some(hook) = hook {
                            hook(pid, calls);
                        }
                        Vec::new()
                    }
                    Message::Released { lease } => {
                        let evicted = if self.checkpointing { self.control.evict(pid) } else { Eviction::Resident };
                        tracing::info!(pid, lease, ?evicted, "lease released");
                        match evicted {
                            Eviction::Failed(why) => self.fence(conn, pid, lease, why),
                            other => self.table.released(pid, lease, other == Eviction::Checkpointed, Instant::now()),
                        }
                    }
                    Message::GpusNotVisible { lease, gpus } => {
                        // The shim failed the calls (CUDA_ERROR_INVALID_DEVICE) rather than run
                        // them on another GPU: the host's inventory and the process's driver
                        // disagree (CUDA_VISIBLE_DEVICES in the kernel, a GPU lost, a bad config).
                        let kernel = self.conns.get(&conn).map(|c| c.kernel_id.clone()).unwrap_or_default();
                        let uuids: Vec<String> = gpus.iter().map(uuid_string).collect();
                        tracing::warn!(
                            pid, kernel = %kernel, lease, gpus = ?uuids,
                            "granted GPUs are not visible to the kernel process's driver; its calls on them fail"
                        );
                        self.metrics.gpus_not_visible.inc_by(gpus.len() as u64);
                        Vec::new()
                    }
                    other => {
                        tracing::warn!(pid, tag = other.tag(), "unexpected frame from shim; ignored");
                        Vec::new()
                    }
                }
            }
            Event::Closed { conn } => match self.conns.remove(&conn) {
                Some(c) => {
                    self.by_pid.remove(&c.pid);
                    self.table.remove(c.pid, now)
                }
                None => Vec::new(),
            },
            Event::Revoke { pid } => self.table.revoke(pid),
            Event::Assign { kernel_id, gpus } => {
                match &gpus {
                    Some(g) => {
                        tracing::debug!(kernel = %kernel_id, gpus = ?g, "GPUs assigned");
                        self.assigned.insert(kernel_id.clone(), g.clone());
                    }
                    None => {
                        self.assigned.remove(&kernel_id);
                    }
                }
                let pids: Vec<u32> = self.conns.values().filter(|c| c.kernel_id == kernel_id).map(|c| c.pid).collect();
                let mut actions = Vec::new();
                for pid in pids {
                    actions.extend(self.table.assign(pid, gpus.clone(), now));
                }
                actions
            }
            Event::Cordon { gpu, on } => self.table.set_cordoned(gpu, on, now),
            Event::Pause(p) => self.table.set_paused(p, now),
            Event::Checkpointing(on) => {
                self.checkpointing = on;
                Vec::new()
            }
            Event::Stop => {
                // Close the write halves now, as the actor thread's exit used to.
                self.stopped = true;
                self.conns.clear();
                self.by_pid.clear();
                Vec::new()
            }
        }
    }

    /// `pid`'s eviction failed: its GPUs are fenced, and its kernel's log says so (the
    /// kernel keeps its memory and its GPUs back at its next cell; others wait or go elsewhere).
    fn fence(&mut self, conn: u64, pid: u32, lease: u64, why: EvictionFailure) -> Vec<Action> {
        let kernel = self.conns.get(&conn).map(|c| c.kernel_id.clone()).unwrap_or_default();
        let gpus = self.table.get(pid).map(|e| e.gpus.clone()).unwrap_or_default();
        let uuids: Vec<&str> = gpus.iter().filter_map(|g| self.gpus.get(*g)).map(|g| g.uuid.as_str()).collect();
        tracing::warn!(
            pid, kernel = %kernel, gpus = ?uuids, reason = why.as_str(),
            "eviction failed: the kernel's GPU memory stays on its GPUs, which are fenced (granted to no other \
             kernel) until that memory is gone; the kernel gets them back at its next cell"
        );
        self.table.eviction_failed(pid, lease, why, &kernel, Instant::now())
    }

    /// Unfences each fenced GPU whose memory is gone: NVML shows none of its holder's
    /// bytes there, or (without NVML) the holder has disconnected. At most every [`FENCE_RECHECK`].
    pub(super) fn recheck_fences(&mut self, now: Instant) -> Vec<Action> {
        if now.saturating_duration_since(self.fences_checked) < FENCE_RECHECK {
            return Vec::new();
        }
        self.fences_checked = now;
        let gone: Vec<usize> = self
            .table
            .fences()
            .filter(|(g, f)| match self.control.bytes_on(f.holder, *g) {
                Some(bytes) => bytes == 0,
                None => self.table.get(f.holder).is_none(),
            })
            .map(|(g, _)| g)
            .collect();
        let mut actions = Vec::new();
        for g in gone {
            tracing::info!(gpu = g, "the memory that fenced the GPU is gone; it may be granted again");
            actions.extend(self.table.unfence(g, now));
        }
        actions
    }

    pub(super) fn send(&mut self, pid: u32, m: &Message) -> bool {
        let Some(conn) = self.by_pid.get(&pid).and_then(|c| self.conns.get_mut(c)) else { return false };
        write_message(&mut conn.writer, m).is_ok()
    }

    /// GPUs held (bound, idle-held, or being revoked) per kernel, from the table.
    pub(super) fn held_by_kernel(&self) -> HashMap<String, Vec<usize>> {
        let mut held: HashMap<String, Vec<usize>> = HashMap::new();
        for (pid, e) in self.table.entries() {
            if !matches!(e.state, LeaseState::Bound | LeaseState::IdleHeld | LeaseState::Revoking) {
                continue;
            }
            let Some(c) = self.by_pid.get(pid).and_then(|c| self.conns.get(c)) else { continue };
            let gpus = held.entry(c.kernel_id.clone()).or_default();
            for g in &e.gpus {
                if !gpus.contains(g) {
                    gpus.push(*g);
                }
            }
        }
        for gpus in held.values_mut() {
            gpus.sort_unstable();
        }
        held
    }

    /// Tells the device hook every kernel whose held GPUs changed since it was last told.
    pub(super) fn sync_devices(&mut self, shared: &Shared) {
        let Some(hook) = lock(&shared.device_hook).clone() else { return };
        let held = self.held_by_kernel();
        for (kernel, gpus) in &held {
            if self.devices_told.get(kernel) != Some(gpus) {
                hook(kernel, gpus);
            }
        }
        for kernel in self.devices_told.keys().filter(|k| !held.contains_key(*k)) {
            hook(kernel, &[]);
        }
        self.devices_told = held;
    }

    pub(super) fn perform(&mut self, mut actions: Vec<Action>, shared: &Shared) {
        while let Some(a) = actions.pop() {
            match a {
                Action::Grant { pid, lease, gpus, restore_from } => {
                    // The device files open to the process before the restore and the grant
                    // (the table already shows the GPUs bound).
                    self.sync_devices(shared);
                    if let Some(from) = restore_from {
                        let pairs: Vec<_> =
                            from.iter().zip(&gpus).map(|(f, t)| (self.uuid(*f), self.uuid(*t))).collect();
                        if let Err(e) = self.control.restore(pid, &pairs) {
                            // Still checkpointed: wait and retry (maybe on other GPUs).
                            let kernel =
                                self.by_pid.get(&pid).and_then(|c| self.conns.get(c)).map(|c| c.kernel_id.clone());
                            tracing::warn!(
                                pid, kernel = kernel.as_deref().unwrap_or_default(), error = %e,
                                "restore failed: the kernel's call waits (it does not run without its GPU memory) \
                                 and the restore is retried"
                            );
                            actions.extend(self.table.restore_failed(pid, Instant::now()));
                            continue;
                        }
                    }
                    self.table.granted(pid);
                    if let Some(t) = self.table.get(pid).and_then(|e| e.requested_at) {
                        self.metrics.acquire_seconds.observe(t.elapsed().as_secs_f64());
                    }
                    self.metrics.grants.inc();
                    let uuids = gpus.iter().map(|g| self.uuid(*g)).collect();
                    if !self.send(pid, &Message::Grant { lease, gpus: uuids }) {
                        actions.extend(self.table.remove(pid, Instant::now()));
                    }
                }
                Action::Revoke { pid, lease } => {
                    self.metrics.revocations.inc();
                    if !self.send(pid, &Message::Revoke { lease }) {
                        actions.extend(self.table.remove(pid, Instant::now()));
                    }
                }
            }
        }
    }

    pub(super) fn publish(&self, shared: &Shared) {
        let status: Vec<ProcessStatus> = self
            .table
            .entries()
            .map(|(pid, e)| ProcessStatus {
                pid: *pid,
                kernel_id: self
                    .by_pid
                    .get(pid)
                    .and_then(|c| self.conns.get(c))
                    .map(|c| c.kernel_id.clone())
                    .unwrap_or_default(),
                state: e.state,
                lease: e.lease,
                gpus: e.gpus.clone(),
                restore_failures: e.restore_failures,
            })
            .collect();
        let now = Instant::now();
        let fenced: Vec<FencedGpu> = self
            .table
            .fences()
            .map(|(g, f)| FencedGpu {
                index: g,
                uuid: self.gpus.get(g).map(|i| i.uuid.clone()).unwrap_or_default(),
                holder_pid: f.holder,
                kernel_id: f.kernel_id.clone(),
                reason: f.reason.as_str().to_owned(),
                fenced_for_s: now.saturating_duration_since(f.since).as_secs(),
            })
            .collect();
        self.metrics.gpus_fenced.set(i64::try_from(fenced.len()).unwrap_or(i64::MAX));
        *lock(&shared.fenced) = fenced;
        let mut s = lock(&shared.status);
        if *s != status {
            *s = status;
            shared.changed.notify_all();
        }
    }
}
