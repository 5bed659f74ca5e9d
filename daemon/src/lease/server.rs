//! The lease server: a Unix stream socket, one reader thread per connection, and one
//! timer thread. The [`Table`] state (the "actor") lives behind one mutex: a connection
//! thread handles its peer's frame itself under that mutex (no hand-off to another
//! thread on the grant path), and the timer thread runs ticks and API events.
//! API events (revoke, assign, pause, ...) are queued and drained under the actor lock
//! before any frame is handled, so they keep their order relative to later frames.
//!
//! Every connection starts with `Register`; the peer is authenticated by `SO_PEERCRED`
//! and accepted only if it is a kernel process registered with
//! [`LeaseServer::register_process`] (same uid) or a descendant of one, and claims
//! its own pid and its kernel's id. Anything else gets `Refused` and is closed.
//!
//! The socket is world-writable, so connections are capped ([`ConnectionLimits`]) in
//! total and per peer uid: one over a cap is answered `Refused` and closed by the
//! acceptor itself, before a thread is started for it.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::collections::VecDeque;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nbos_lease_proto::{read_message, write_message, Message};

use crate::gpu::control::{Eviction, GpuControl};
use crate::gpu::GpuInfo;
use crate::lease::metrics::{ConnectionRefusedLabels, LeaseMetrics, RefusedLabels};
use crate::lease::peer;
use crate::lease::table::{Action, LeaseState, Policy, Table};
use crate::sys;
use crate::sys::peer_credentials::PeerCred;

/// How long a new connection may take to send `Register`.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(5);
/// Most connections served at once (one thread each): far above the kernel processes a
/// host runs, low enough that a connection flood cannot exhaust threads.
pub const MAX_CONNECTIONS: usize = 1024;
/// Most connections served at once for one peer uid, so that one local user cannot take
/// every slot. Kernel processes all run as the daemon's uid, so this also bounds the
/// host's legitimate shims: kept well above a host's kernel processes.
pub const MAX_CONNECTIONS_PER_UID: usize = 256;
/// At most one warning per this interval about connections refused for a cap (a flood
/// would otherwise log a line per connection).
const CAP_WARN_INTERVAL: Duration = Duration::from_secs(10);

/// Caps on lease-socket connections served at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// In total.
    pub total: usize,
    /// Per peer uid (`SO_PEERCRED`).
    pub per_uid: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self { total: MAX_CONNECTIONS, per_uid: MAX_CONNECTIONS_PER_UID }
    }
}

/// Settings of the lease server.
#[derive(Debug, Clone)]
pub struct LeaseServerConfig {
    /// The socket path (created; an existing socket file is replaced).
    pub socket: PathBuf,
    /// Idle detection and release.
    pub policy: Policy,
    /// How often shims report activity while bound.
    pub activity_interval: Duration,
    /// Device memory limit per kernel process told to shims, bytes (0: none).
    pub memory_limit_bytes: u64,
    /// The real CUDA driver library told to shims in `Registered` (the kernel's environment
    /// does not name it). At most `nbos_lease_proto::MAX_PATH` bytes (checked at start).
    pub driver_path: PathBuf,
}

/// A kernel process the daemon started (the root of a process tree allowed to lease).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelProcess {
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
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum LeaseServerError {
    /// Binding the socket failed.
    #[error("cannot listen on lease socket {path}: {source}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Starting a thread failed.
    #[error("cannot start lease server thread: {0}")]
    Thread(std::io::Error),
    /// The driver path cannot be told to shims (not UTF-8 or longer than the protocol's cap).
    #[error("the CUDA driver path {0} cannot be sent to shims: it must be UTF-8 and at most {max} bytes", max = nbos_lease_proto::MAX_PATH)]
    DriverPath(PathBuf),
}

enum Event {
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

struct Shared {
    /// The table and everything that writes frames; taken by connection threads and the
    /// timer thread. Lock order: `actor` before `queue` and `status`.
    actor: Mutex<Actor>,
    /// API events not yet applied (drained only under `actor`).
    queue: Mutex<VecDeque<Event>>,
    /// Signalled when `queue` gets an event.
    queued: Condvar,
    registry: Mutex<HashMap<u32, Registered>>,
    activity_hook: Mutex<Option<ActivityHook>>,
    device_hook: Mutex<Option<DeviceHook>>,
    status: Mutex<Vec<ProcessStatus>>,
    changed: Condvar,
    stop: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking holder cannot leave these plain tables half-updated in a way that
    // matters more than stopping the lease server would.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The running lease server. Dropping it stops it and removes the socket.
pub struct LeaseServer {
    shared: Arc<Shared>,
    socket: PathBuf,
    /// A handle on the listening socket, to wake the acceptor at shutdown.
    listener: UnixListener,
    threads: Vec<JoinHandle<()>>,
    metrics: LeaseMetrics,
}

impl std::fmt::Debug for LeaseServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseServer").field("socket", &self.socket).finish()
    }
}

impl LeaseServer {
    /// Binds the socket and starts the threads, with the default connection caps.
    pub fn start(
        cfg: LeaseServerConfig,
        gpus: Vec<GpuInfo>,
        control: GpuControl,
        metrics: LeaseMetrics,
    ) -> Result<Self, LeaseServerError> {
        Self::start_with_limits(cfg, gpus, control, metrics, ConnectionLimits::default())
    }

    /// Binds the socket and starts the threads; at most `limits` connections are served at once.
    pub fn start_with_limits(
        cfg: LeaseServerConfig,
        gpus: Vec<GpuInfo>,
        control: GpuControl,
        metrics: LeaseMetrics,
        limits: ConnectionLimits,
    ) -> Result<Self, LeaseServerError> {
        let bind_err = |source| LeaseServerError::Bind { path: cfg.socket.clone(), source };
        // Checked once here: the codec would cut a longer path, and shims must load this one.
        if cfg.driver_path.to_str().is_none_or(|p| p.len() > nbos_lease_proto::MAX_PATH) {
            return Err(LeaseServerError::DriverPath(cfg.driver_path.clone()));
        }
        if cfg.socket.exists() {
            std::fs::remove_file(&cfg.socket).map_err(bind_err)?;
        }
        let listener = UnixListener::bind(&cfg.socket).map_err(bind_err)?;
        // Kernel processes may run as other users; SO_PEERCRED is the access check.
        std::fs::set_permissions(&cfg.socket, std::fs::Permissions::from_mode(0o666)).map_err(bind_err)?;
        let actor = Actor {
            table: Table::new(gpus.len(), cfg.policy),
            gpus,
            control,
            conns: HashMap::new(),
            by_pid: HashMap::new(),
            metrics: metrics.clone(),
            cfg: cfg.clone(),
            checkpointing: true,
            assigned: HashMap::new(),
            devices_told: HashMap::new(),
            stopped: false,
        };
        let shared = Arc::new(Shared {
            actor: Mutex::new(actor),
            queue: Mutex::new(VecDeque::new()),
            queued: Condvar::new(),
            registry: Mutex::new(HashMap::new()),
            activity_hook: Mutex::new(None),
            device_hook: Mutex::new(None),
            status: Mutex::new(Vec::new()),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let mut threads = Vec::new();
        let tick = (cfg.policy.idle_grace / 4).clamp(Duration::from_millis(5), Duration::from_millis(500));
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new().name(name.to_owned()).spawn(f).map_err(LeaseServerError::Thread)
        };
        let sh = shared.clone();
        threads.push(spawn("lease-actor", Box::new(move || timer_loop(&sh, tick)))?);
        let (sh, m) = (shared.clone(), metrics.clone());
        let wake = listener.try_clone().map_err(bind_err)?;
        let slots =
            Arc::new(Slots { limits, open: Mutex::new(OpenCounts::default()), gauge: metrics.connections.clone() });
        threads.push(spawn("lease-accept", Box::new(move || accept_loop(listener, sh, m, slots)))?);
        Ok(Self { shared, socket: cfg.socket, listener: wake, threads, metrics })
    }

    /// The socket path (for `NBOS_LEASE_SOCKET`).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The server's metrics.
    pub fn metrics(&self) -> &LeaseMetrics {
        &self.metrics
    }

    /// Allows `p` (and its descendants) to lease GPUs.
    pub fn register_process(&self, p: KernelProcess) {
        // Opened now, once the kernel answered (so it runs): the pidfd then refers to this
        // process for good, and says when it has exited even if its pid is reused.
        let pidfd = sys::pidfd::pidfd_open(p.pid);
        if let Err(e) = &pidfd {
            tracing::warn!(pid = p.pid, kernel = %p.kernel_id, error = %e, "no pidfd of the kernel process; it cannot lease");
        }
        tracing::info!(pid = p.pid, kernel = %p.kernel_id, gpus = p.gpus, "kernel process may lease GPUs");
        lock(&self.shared.registry).insert(p.pid, Registered { process: p, pidfd: pidfd.ok() });
    }

    /// Installs the hook told every shim `Activity { calls }` report, by the reporting pid
    /// (authenticated with `SO_PEERCRED`).
    pub fn set_activity_hook(&self, hook: ActivityHook) {
        *lock(&self.shared.activity_hook) = Some(hook);
    }

    /// Installs the hook told every change of the GPUs a kernel holds.
    pub fn set_device_hook(&self, hook: DeviceHook) {
        *lock(&self.shared.device_hook) = Some(hook);
    }

    /// Withdraws a registration (new connections from its tree are refused).
    pub fn unregister_process(&self, pid: u32) {
        lock(&self.shared.registry).remove(&pid);
    }

    /// Asks the process `pid` to give its GPUs back now.
    pub fn revoke(&self, pid: u32) {
        self.shared.post(Event::Revoke { pid });
    }

    /// The scheduler assigned GPUs `gpus` (host indices) to kernel `kernel_id`: its
    /// processes' grants use exactly these and wait while any is held elsewhere.
    pub fn assign(&self, kernel_id: &str, gpus: Vec<usize>) {
        self.shared.post(Event::Assign { kernel_id: kernel_id.to_owned(), gpus: Some(gpus) });
    }

    /// Withdraws kernel `kernel_id`'s assignment (it stopped or was forgotten).
    pub fn clear_assignment(&self, kernel_id: &str) {
        self.shared.post(Event::Assign { kernel_id: kernel_id.to_owned(), gpus: None });
    }

    /// Cordons a GPU (never granted) or uncordons it.
    pub fn set_cordoned(&self, gpu: usize, on: bool) {
        self.shared.post(Event::Cordon { gpu, on });
    }

    /// Holds all grants (drain) or resumes them.
    pub fn set_paused(&self, paused: bool) {
        self.shared.post(Event::Pause(paused));
    }

    /// Whether revocation checkpoints GPU memory (default) or leaves it resident.
    pub fn set_checkpointing(&self, on: bool) {
        self.shared.post(Event::Checkpointing(on));
    }

    /// The connected processes and their leases.
    pub fn status(&self) -> Vec<ProcessStatus> {
        lock(&self.shared.status).clone()
    }

    /// Waits until `pred` holds for the status, or `timeout` passes; returns whether it held.
    pub fn wait_until(&self, timeout: Duration, mut pred: impl FnMut(&[ProcessStatus]) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut s = lock(&self.shared.status);
        loop {
            if pred(&s) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            s = self.shared.changed.wait_timeout(s, left).unwrap_or_else(std::sync::PoisonError::into_inner).0;
        }
    }
}

impl Drop for LeaseServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.post(Event::Stop);
        // Wake the acceptor blocked in accept(): shutdown on a listening socket makes
        // accept fail (the socket file may already be gone, so connecting is no way).
        let _ = crate::sys::socket::shutdown_listener(&self.listener);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Shared {
    /// Queues an API event for the timer thread (or the next frame handled, whichever
    /// takes the actor lock first).
    fn post(&self, ev: Event) {
        lock(&self.queue).push_back(ev);
        self.queued.notify_one();
    }

    /// Under the actor lock: applies the queued API events, then `ev` (a frame or a
    /// connection change, handled directly on the calling thread), then the timers, and
    /// writes what results. Returns false once the server is stopping.
    fn apply(&self, ev: Option<Event>) -> bool {
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
            let actions = actor.table.tick(Instant::now());
            actor.perform(actions, self);
            actor.sync_devices(self);
            actor.publish(self);
        }
        true
    }
}

/// Runs the timers (idle detection) and applies API events when no frame comes.
fn timer_loop(shared: &Shared, tick: Duration) {
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

/// Which connection cap a new connection is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cap {
    Total,
    PerUid,
}

impl Cap {
    fn label(self) -> &'static str {
        match self {
            Cap::Total => "total",
            Cap::PerUid => "per_uid",
        }
    }
}

#[derive(Default)]
struct OpenCounts {
    total: usize,
    by_uid: HashMap<u32, usize>,
}

/// The connections served now, against the caps.
struct Slots {
    limits: ConnectionLimits,
    open: Mutex<OpenCounts>,
    /// `notebookos_lease_connections`.
    gauge: prometheus_client::metrics::gauge::Gauge,
}

impl Slots {
    /// Takes a slot for a connection from `uid`, or says which cap is reached.
    fn take(self: &Arc<Self>, uid: u32) -> Result<Slot, Cap> {
        let mut open = lock(&self.open);
        // Per uid first: when both caps are reached, the peer's own uid is the likelier flood.
        if open.by_uid.get(&uid).copied().unwrap_or(0) >= self.limits.per_uid {
            return Err(Cap::PerUid);
        }
        if open.total >= self.limits.total {
            return Err(Cap::Total);
        }
        open.total += 1;
        *open.by_uid.entry(uid).or_insert(0) += 1;
        self.gauge.set(i64::try_from(open.total).unwrap_or(i64::MAX));
        Ok(Slot { slots: self.clone(), uid })
    }
}

/// One connection's place under the caps, given back when dropped: by the connection
/// thread on any exit (panic included), or at once if that thread cannot start.
struct Slot {
    slots: Arc<Slots>,
    uid: u32,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = lock(&self.slots.open);
        open.total = open.total.saturating_sub(1);
        if let Entry::Occupied(mut e) = open.by_uid.entry(self.uid) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
        self.slots.gauge.set(i64::try_from(open.total).unwrap_or(i64::MAX));
    }
}

/// Rate limit of the warning about capped connections.
#[derive(Default)]
struct CapWarnings {
    last: Option<Instant>,
    /// Refusals not logged since `last`.
    quiet: u64,
}

impl CapWarnings {
    fn refused(&mut self, cred: PeerCred, cap: Cap, limits: ConnectionLimits) {
        let now = Instant::now();
        if self.last.is_some_and(|t| now.duration_since(t) < CAP_WARN_INTERVAL) {
            self.quiet += 1;
            return;
        }
        tracing::warn!(
            uid = cred.uid,
            pid = cred.pid,
            cap = cap.label(),
            total_limit = limits.total,
            per_uid_limit = limits.per_uid,
            also_refused_since_last_warning = self.quiet,
            "lease connection refused: too many open connections"
        );
        self.last = Some(now);
        self.quiet = 0;
    }
}

fn accept_loop(listener: UnixListener, shared: Arc<Shared>, metrics: LeaseMetrics, slots: Arc<Slots>) {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let mut warnings = CapWarnings::default();
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "lease socket accept failed");
                // Do not spin on a persistent error (EMFILE): back off briefly.
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        // Refusals below are written by the acceptor itself, non-blocking: the frame fits
        // the fresh socket's empty buffer, and a peer that never reads cannot stall accepts.
        let cred = match sys::peer_credentials::peer_cred(&stream) {
            Ok(c) => c,
            Err(e) => {
                let _ = stream.set_nonblocking(true);
                refuse(stream, &metrics, "bad_peer", format!("cannot read peer credentials: {e}"));
                continue;
            }
        };
        let slot = match slots.take(cred.uid) {
            Ok(slot) => slot,
            Err(cap) => {
                metrics
                    .connections_refused
                    .get_or_create(&ConnectionRefusedLabels { reason: cap.label().into() })
                    .inc();
                warnings.refused(cred, cap, slots.limits);
                let reason = match cap {
                    Cap::PerUid => {
                        format!("too many lease connections from uid {} (limit {})", cred.uid, slots.limits.per_uid)
                    }
                    Cap::Total => format!("too many lease connections (limit {})", slots.limits.total),
                };
                let mut s = stream;
                let _ = s.set_nonblocking(true);
                let _ = write_message(&mut s, &Message::Refused { reason });
                continue;
            }
        };
        let conn = NEXT.fetch_add(1, Ordering::Relaxed);
        let (sh, m) = (shared.clone(), metrics.clone());
        let spawned = std::thread::Builder::new().name("lease-conn".into()).spawn(move || {
            // Held for the thread's whole life: released however it ends.
            let _slot = slot;
            serve_conn(conn, cred, stream, &sh, &m);
        });
        // On failure the closure, and with it the slot and the stream, is dropped.
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start a lease connection thread");
        }
    }
}

fn refuse(mut s: UnixStream, metrics: &LeaseMetrics, reason_label: &str, reason: String) {
    tracing::warn!(reason = %reason, "lease connection refused");
    metrics.refused.get_or_create(&RefusedLabels { reason: reason_label.to_owned() }).inc();
    let _ = write_message(&mut s, &Message::Refused { reason });
    let _ = s.flush();
}

/// Authenticates a connection, then handles its frames (under the actor lock).
fn serve_conn(conn: u64, cred: PeerCred, mut s: UnixStream, shared: &Shared, metrics: &LeaseMetrics) {
    let _ = s.set_read_timeout(Some(REGISTER_TIMEOUT));
    let (kernel_id, pid) = match read_message(&mut s) {
        Ok(Message::Register { kernel_id, pid, .. }) => (kernel_id, pid),
        Ok(other) => return refuse(s, metrics, "bad_frame", format!("expected Register, got tag {}", other.tag())),
        Err(e) => return refuse(s, metrics, "bad_frame", e.to_string()),
    };
    // Pinned before /proc is read: while the pidfd's process lives, its pid names nothing else.
    let pidfd = match sys::pidfd::peer_pidfd(&s, cred.pid) {
        Ok(fd) => fd,
        Err(e) => return refuse(s, metrics, "bad_peer", format!("cannot open a pidfd of process {}: {e}", cred.pid)),
    };
    // The nearest registered ancestor that is still the process registered under its pid (a
    // registered kernel process that exited is skipped, even if its pid now names another).
    let (root, stale) = {
        let reg = lock(&shared.registry);
        let mut stale = None;
        let mut root = None;
        for p in peer::lineage(cred.pid) {
            let Some(k) = reg.get(&p).filter(|k| k.process.uid == cred.uid) else { continue };
            if k.pidfd.as_ref().is_some_and(sys::pidfd::is_alive) {
                root = Some(k.process.clone());
                break;
            }
            stale.get_or_insert(k.process.clone());
        }
        (root, stale)
    };
    let Some(root) = root else {
        if let Some(k) = stale {
            return refuse(
                s,
                metrics,
                "pid_reused",
                format!(
                    "process {} is not a kernel process of this host: pid {} was kernel {}'s process, which \
                     exited; the pid was reused",
                    cred.pid, k.pid, k.kernel_id
                ),
            );
        }
        return refuse(
            s,
            metrics,
            "unregistered",
            format!("process {} (uid {}) is not a kernel process of this host", cred.pid, cred.uid),
        );
    };
    if !sys::pidfd::is_alive(&pidfd) {
        return refuse(s, metrics, "peer_exited", format!("process {} exited while it was checked", cred.pid));
    }
    // Its pid as it sees it: ours, or in a kernel's PID namespace its pid there.
    if pid != cred.pid && sys::procfs::innermost_pid(cred.pid) != Some(pid) {
        return refuse(s, metrics, "pid_mismatch", format!("claims pid {pid} but is pid {}", cred.pid));
    }
    if kernel_id != root.kernel_id {
        return refuse(
            s,
            metrics,
            "kernel_mismatch",
            format!("claims kernel {kernel_id:?}, registered as {:?}", root.kernel_id),
        );
    }
    let _ = s.set_read_timeout(None);
    let Ok(writer) = s.try_clone() else { return };
    // From here on the process is known by its pid in the daemon's namespace.
    let pid = cred.pid;
    if !shared.apply(Some(Event::Connected { conn, pid, kernel_id, gpus: root.gpus, writer })) {
        return;
    }
    // A frame arrives in one write; buffered, it is read in one syscall, not two.
    let mut s = std::io::BufReader::with_capacity(1024, s);
    loop {
        match read_message(&mut s) {
            Ok(msg) => {
                if !shared.apply(Some(Event::Frame { conn, msg })) {
                    return;
                }
            }
            Err(e) => {
                tracing::debug!(conn, error = %e, "lease connection ended");
                let _ = shared.apply(Some(Event::Closed { conn }));
                return;
            }
        }
    }
}

/// A registered kernel process and a pidfd of it (None: it was gone at registration).
struct Registered {
    process: KernelProcess,
    pidfd: Option<std::os::fd::OwnedFd>,
}

struct Conn {
    pid: u32,
    kernel_id: String,
    writer: UnixStream,
}

struct Actor {
    table: Table,
    gpus: Vec<GpuInfo>,
    control: GpuControl,
    conns: HashMap<u64, Conn>,
    by_pid: HashMap<u32, u64>,
    metrics: LeaseMetrics,
    cfg: LeaseServerConfig,
    checkpointing: bool,
    /// The scheduler's GPU assignment per kernel id (applied to every process of it).
    assigned: HashMap<String, Vec<usize>>,
    /// The GPUs each kernel was last told to the device hook to hold (absent: none).
    devices_told: HashMap<String, Vec<usize>>,
    /// `Stop` was handled: nothing more is applied.
    stopped: bool,
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (or bare hex) to the 16 UUID bytes.
pub fn uuid_bytes(uuid: &str) -> Option<[u8; 16]> {
    let hex: String = uuid.trim_start_matches("GPU-").chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The 16 UUID bytes as `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (the inverse of [`uuid_bytes`]).
pub fn uuid_string(b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("GPU-{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

impl Actor {
    fn uuid(&self, gpu: usize) -> [u8; 16] {
        self.gpus.get(gpu).and_then(|g| uuid_bytes(&g.uuid)).unwrap_or([0; 16])
    }

    fn handle(&mut self, ev: Event, now: Instant, shared: &Shared) -> Vec<Action> {
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
                        self.table.released(pid, lease, evicted == Eviction::Checkpointed, Instant::now())
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

    fn send(&mut self, pid: u32, m: &Message) -> bool {
        let Some(conn) = self.by_pid.get(&pid).and_then(|c| self.conns.get_mut(c)) else { return false };
        write_message(&mut conn.writer, m).is_ok()
    }

    /// GPUs held (bound, idle-held, or being revoked) per kernel, from the table.
    fn held_by_kernel(&self) -> HashMap<String, Vec<usize>> {
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
    fn sync_devices(&mut self, shared: &Shared) {
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

    fn perform(&mut self, mut actions: Vec<Action>, shared: &Shared) {
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
                            tracing::warn!(pid, error = %e, "restore failed; the process waits for a retry");
                            actions.extend(self.table.restore_failed(pid, Instant::now()));
                            continue;
                        }
                    }
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

    fn publish(&self, shared: &Shared) {
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
            })
            .collect();
        let mut s = lock(&shared.status);
        if *s != status {
            *s = status;
            shared.changed.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{uuid_bytes, uuid_string, Cap, ConnectionLimits, OpenCounts, Slots};
    use std::sync::{Arc, Mutex};

    fn slots(total: usize, per_uid: usize) -> Arc<Slots> {
        Arc::new(Slots {
            limits: ConnectionLimits { total, per_uid },
            open: Mutex::new(OpenCounts::default()),
            gauge: prometheus_client::metrics::gauge::Gauge::default(),
        })
    }

    #[test]
    fn slots_cap_per_uid_and_in_total_and_come_back_when_dropped() {
        let s = slots(3, 2);
        let a = s.take(1000).expect("first of uid 1000");
        let _b = s.take(1000).expect("second of uid 1000");
        assert_eq!(s.take(1000).err(), Some(Cap::PerUid));
        let _c = s.take(1001).expect("another uid");
        assert_eq!(s.take(1002).err(), Some(Cap::Total));
        assert_eq!(s.gauge.get(), 3);
        drop(a);
        assert_eq!(s.gauge.get(), 2);
        let _d = s.take(1000).expect("the freed slot is taken again");
    }

    #[test]
    fn a_connection_thread_that_panics_gives_its_slot_back() {
        let s = slots(1, 1);
        let slot = s.take(7).expect("slot");
        let died = std::thread::spawn(move || {
            let _slot = slot;
            panic!("connection handler bug");
        })
        .join();
        assert!(died.is_err());
        assert_eq!(s.gauge.get(), 0);
        assert!(s.take(7).is_ok());
    }

    #[test]
    fn uuid_strings_parse_to_driver_bytes() {
        let b = uuid_bytes("GPU-fa4e0000-0000-4000-8000-000000000003").expect("parse");
        assert_eq!(uuid_string(&b), "GPU-fa4e0000-0000-4000-8000-000000000003");
        assert_eq!(b[0..2], [0xfa, 0x4e]);
        assert_eq!(b[15], 3);
        assert!(uuid_bytes("GPU-nothex").is_none());
        assert!(uuid_bytes("GPU-fa4e0000-0000-4000-8000-0000000000zz").is_none());
    }
}
