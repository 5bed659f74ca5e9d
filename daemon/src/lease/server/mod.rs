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
//!
//! - `config`: the server's settings and start errors.
//! - `actor`: the table behind the actor lock, API events, registered processes, timers.
//! - `caps`: the connection caps.
//! - `connection`: accepting, authenticating and serving a connection.
//! - `gpu_uuid`: GPU UUIDs as the driver's bytes.

mod actor;
mod caps;
mod config;
mod connection;
mod gpu_uuid;

use std::collections::{HashMap, VecDeque};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use self::actor::{ActivityHook, DeviceHook, FencedGpu, ProcessStatus, RegisteredProcess, FENCE_RECHECK};
pub use self::config::{
    ConnectionLimits, LeaseServerConfig, LeaseServerError, MAX_CONNECTIONS, MAX_CONNECTIONS_PER_UID,
};
pub use self::gpu_uuid::{uuid_bytes, uuid_string};

use self::actor::{lock, timer_loop, Actor, Event, Registration, Shared};
use self::caps::{OpenCounts, Slots};
use self::connection::accept_loop;
use crate::gpu::control::GpuControl;
use crate::gpu::GpuInfo;
use crate::lease::metrics::LeaseMetrics;
use crate::lease::table::Table;
use crate::sys;

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
            fences_checked: Instant::now(),
        };
        let shared = Arc::new(Shared {
            actor: Mutex::new(actor),
            queue: Mutex::new(VecDeque::new()),
            queued: Condvar::new(),
            registry: Mutex::new(HashMap::new()),
            activity_hook: Mutex::new(None),
            device_hook: Mutex::new(None),
            status: Mutex::new(Vec::new()),
            fenced: Mutex::new(Vec::new()),
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
    pub fn register_process(&self, p: RegisteredProcess) {
        // Opened now, once the kernel answered (so it runs): the pidfd then refers to this
        // process for good, and says when it has exited even if its pid is reused.
        let pidfd = sys::pidfd::pidfd_open(p.pid);
        if let Err(e) = &pidfd {
            tracing::warn!(pid = p.pid, kernel = %p.kernel_id, error = %e, "no pidfd of the kernel process; it cannot lease");
        }
        tracing::info!(pid = p.pid, kernel = %p.kernel_id, gpus = p.gpus, "kernel process may lease GPUs");
        lock(&self.shared.registry).insert(p.pid, Registration { process: p, pidfd: pidfd.ok() });
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

    /// The GPUs fenced because an eviction left a process's memory on them.
    pub fn fenced(&self) -> Vec<FencedGpu> {
        lock(&self.shared.fenced).clone()
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
