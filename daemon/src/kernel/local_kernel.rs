//! A kernel's process on this host (a [`LocalKernel`]): its ipykernel, the hub of client
//! connections, heartbeat, restarts and shutdown. A single-host kernel is one; in a cluster,
//! each replica of a kernel runs one (clients there talk to the kernel's front-end).
//!
//! Its restarts (on request, and after a death) are [`restart`]'s; whether a failed
//! start lost a port to another process, [`port_race`]'s.

mod port_race;
mod restart;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, RwLock};

use super::connection::ConnectionInfo;
use super::hub::{ClientId, Hub};
use super::ipykernel::Ipykernel;
use super::process::LaunchSpec;
use crate::jupyter::message::{error_reply, iso_date};
use crate::jupyter::{Channel, Message};
use crate::metrics::Metrics;
use port_race::{lost_a_port_race, START_ATTEMPTS};

/// How long a kernel has to answer its first `kernel_info_request`.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the heartbeat is checked.
const HEARTBEAT_PERIOD: Duration = Duration::from_secs(2);
/// How long one heartbeat may take.
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(1);
/// Consecutive misses before a kernel is shown as unresponsive.
const HEARTBEAT_MISSES: u32 = 2;
/// How long a kernel has to exit after `shutdown_request` before it is killed.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// The Kernel Gateway kernel model (`GET /api/kernels/{id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelModel {
    /// Kernel id (UUID).
    pub id: String,
    /// Kernelspec name.
    pub name: String,
    /// `%Y-%m-%dT%H:%M:%S.%fZ`.
    pub last_activity: String,
    /// `starting`, `idle`, `busy`, `restarting`, `dead`.
    pub execution_state: String,
    /// Connected WebSocket clients.
    pub connections: usize,
    /// NotebookOS extension: GPUs the kernel asks for per cell.
    #[serde(default)]
    pub gpus: u32,
    /// NotebookOS extension: device memory each of the kernel's processes may allocate
    /// on its GPUs, MiB (`KERNEL_GPU_MEMORY_MIB`); `null`: no limit of its own.
    #[serde(default)]
    pub gpu_memory_mib: Option<u64>,
    /// NotebookOS extension: the processes' process ids.
    #[serde(default)]
    pub pids: Vec<u32>,
    /// NotebookOS extension: the user who owns the kernel (absent without `[auth]` users).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// One kernel.
pub struct LocalKernel {
    /// Kernel id.
    pub id: String,
    /// Kernelspec name.
    pub name: String,
    /// GPUs each cell needs.
    pub gpus: u32,
    /// Device memory limit of each of its processes, MiB (enforced by the CUDA shim).
    pub gpu_memory_mib: Option<u64>,
    /// Messages to and from clients.
    pub hub: Arc<Hub>,
    processes: RwLock<Vec<Arc<Ipykernel>>>,
    launch: LaunchSpec,
    /// Serialises restart, death handling, shutdown and client sends: a send waits
    /// (FIFO) for a restart in progress and then goes to the new process.
    lifecycle: Mutex<()>,
    stopping: AtomicBool,
    /// Whether a death starts a new process (single-host kernels; a cluster's supervisor
    /// replaces its processes itself).
    auto_restart: AtomicBool,
    /// Deaths in a row that came within [`STABLE_START_TIME`] of their process's start.
    quick_deaths: AtomicU32,
    /// When the current process was started.
    started_at: std::sync::Mutex<Instant>,
    /// Restart hook runs so far (each reset the kernel's GPU binding).
    resets: AtomicU64,
    metrics: Arc<Metrics>,
    /// Called once when the kernel is gone (died, or shut down) with its last pids.
    exit_hook: std::sync::Mutex<Option<ExitHook>>,
    /// Called when a restart has killed the old processes (their cells are gone).
    restart_hook: std::sync::OnceLock<RestartHook>,
    spawn_hook: std::sync::OnceLock<SpawnHook>,
    /// The user who owns it (set once, before the kernel is listed; none without users).
    owner: std::sync::OnceLock<crate::users::User>,
}

/// What runs after a restart started a new process: (kernel id, its pid).
pub type SpawnHook = Box<dyn Fn(&str, u32) + Send + Sync>;

/// What runs after a restart killed the kernel's processes: (kernel id).
pub type RestartHook = Box<dyn Fn(&str) + Send + Sync>;

/// What runs when a kernel is gone: (kernel id, pids it had).
pub type ExitHook = Box<dyn FnOnce(&str, &[u32]) + Send>;

impl std::fmt::Debug for LocalKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel").field("id", &self.id).field("name", &self.name).finish()
    }
}

impl LocalKernel {
    /// Starts a kernel with one ipykernel and waits until it answers `kernel_info`.
    ///
    /// Kernel ports are found by binding port 0 and releasing it (as jupyter_client does),
    /// so another process can take one before the kernel binds it; the kernel then exits
    /// at once with "Address already in use" in its log. That start is tried again with
    /// fresh ports, up to [`START_ATTEMPTS`] times; any other failure is reported as is.
    pub async fn start(
        id: String,
        name: String,
        gpus: u32,
        gpu_memory_mib: Option<u64>,
        launch: LaunchSpec,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Arc<Self>> {
        let log = launch.dir.join("kernel.log");
        let mut attempt = 1;
        loop {
            let before = std::fs::metadata(&log).map_or(0, |m| m.len());
            let started =
                Self::start_once(id.clone(), name.clone(), gpus, gpu_memory_mib, launch.clone(), metrics.clone()).await;
            match started {
                Err(e) if attempt < START_ATTEMPTS && lost_a_port_race(&e, &log, before) => {
                    tracing::warn!(kernel = %id, attempt, error = format!("{e:#}"), "a kernel port was taken while it started; retrying with fresh ports");
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn start_once(
        id: String,
        name: String,
        gpus: u32,
        gpu_memory_mib: Option<u64>,
        launch: LaunchSpec,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Arc<Self>> {
        std::fs::create_dir_all(&launch.dir)
            .with_context(|| format!("creating kernel directory {}", launch.dir.display()))?;
        let hub = Arc::new(Hub::new("starting", SystemTime::now()));
        let conn = ConnectionInfo::new_loopback(&name)?;
        let ipykernel = Arc::new(Ipykernel::start(0, &launch, conn, hub.clone(), metrics.clone()).await?);
        let kernel = Arc::new(Self {
            id,
            name,
            gpus,
            gpu_memory_mib,
            hub,
            processes: RwLock::new(vec![ipykernel.clone()]),
            launch,
            lifecycle: Mutex::new(()),
            stopping: AtomicBool::new(false),
            auto_restart: AtomicBool::new(false),
            quick_deaths: AtomicU32::new(0),
            started_at: std::sync::Mutex::new(Instant::now()),
            resets: AtomicU64::new(0),
            metrics,
            exit_hook: std::sync::Mutex::new(None),
            restart_hook: std::sync::OnceLock::new(),
            spawn_hook: std::sync::OnceLock::new(),
            owner: std::sync::OnceLock::new(),
        });
        kernel.watch_exit(&ipykernel);
        kernel.wait_ready(&ipykernel).await?;
        kernel.watch_heartbeat();
        Ok(kernel)
    }

    /// Pings the ipykernel's heartbeat channel. A kernel whose process is
    /// alive but does not answer (stopped, wedged in native code) is shown as
    /// `unresponsive` until it answers again.
    fn watch_heartbeat(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut failures = 0u32;
            let mut saved_state: Option<String> = None;
            let mut every = tokio::time::interval(HEARTBEAT_PERIOD);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let Some(kernel) = weak.upgrade() else { return };
                if kernel.stopping.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(ipykernel) = kernel.ipykernel().await else { continue };
                if kernel.lifecycle.try_lock().is_err() {
                    continue; // restarting
                }
                if ipykernel.heartbeat(HEARTBEAT_TIMEOUT).await {
                    failures = 0;
                    if let Some(state) = saved_state.take() {
                        tracing::info!(kernel = %kernel.id, "kernel answers its heartbeat again");
                        kernel.hub.set_state(&state, SystemTime::now());
                    }
                    continue;
                }
                if ipykernel.process.has_exited() {
                    continue; // the exit watcher reports it
                }
                failures += 1;
                kernel.metrics.kernel_heartbeat_failures_total.inc();
                if failures == HEARTBEAT_MISSES && saved_state.is_none() {
                    tracing::warn!(kernel = %kernel.id, pid = ipykernel.process.pid(), "kernel does not answer its heartbeat");
                    saved_state = Some(kernel.hub.activity().execution_state);
                    kernel.hub.set_state("unresponsive", SystemTime::now());
                }
            }
        });
    }

    /// Installs what runs once when the kernel is gone.
    pub fn set_exit_hook(&self, hook: ExitHook) {
        *self.exit_hook.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(hook);
    }

    /// Installs what runs after a restart (once; later calls are ignored).
    pub fn set_restart_hook(&self, hook: RestartHook) {
        let _ = self.restart_hook.set(hook);
    }

    /// Sets what runs when a restart has started a new process (lease registration).
    pub fn set_spawn_hook(&self, hook: SpawnHook) {
        let _ = self.spawn_hook.set(hook);
    }

    /// Whether the kernel's process is restarted when it dies, as jupyter_server's
    /// KernelRestarter does (off by default).
    pub fn set_auto_restart(&self, on: bool) {
        self.auto_restart.store(on, Ordering::SeqCst);
    }

    fn run_restart_hook(&self) {
        self.resets.fetch_add(1, Ordering::SeqCst);
        if let Some(hook) = self.restart_hook.get() {
            hook(&self.id);
        }
    }

    fn run_exit_hook(&self, pids: &[u32]) {
        let hook = self.exit_hook.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(h) = hook {
            h(&self.id, pids);
        }
    }

    /// The account the kernel's processes run as (`None`: the daemon's own).
    pub fn identity(&self) -> Option<&super::identity::KernelIdentity> {
        self.launch.identity.as_ref()
    }

    /// Process ids of the processes (empty while a restart swaps them).
    pub fn pids(&self) -> Vec<u32> {
        self.processes.try_read().map(|r| r.iter().map(|x| x.process.pid()).collect()).unwrap_or_default()
    }

    /// Answers an `execute_request` the daemon refuses (the cell can never get its
    /// GPUs here) the way a kernel answers a failed cell: busy, error, idle, error reply.
    /// Any other request gets its error reply only.
    pub fn reject_cell(&self, client: ClientId, request: &Message, ename: &str, evalue: &str) {
        self.answer_error(client, Channel::Shell, request, ename, evalue);
    }

    /// Answers `request` (which came on `channel`) with an error reply `<x>_reply`
    /// (status error, ename, evalue, traceback); a cell also gets busy, error and idle
    /// on IOPub, as a kernel sends for a failed cell.
    pub fn answer_error(&self, client: ClientId, channel: Channel, request: &Message, ename: &str, evalue: &str) {
        let now = SystemTime::now();
        let Ok(h) = request.header() else { return };
        let Ok((error, reply)) = error_reply(request, ename, evalue, &uuid::Uuid::new_v4().to_string(), now) else {
            return;
        };
        self.hub.expect_reply(&h.msg_id, client, now);
        if h.msg_type == "execute_request" {
            self.publish(request, "status", &serde_json::json!({ "execution_state": "busy" }));
            self.publish(request, "error", &error);
            self.publish(request, "status", &serde_json::json!({ "execution_state": "idle" }));
        }
        self.hub.deliver(channel, reply, now);
    }

    /// The ipykernel process that gets the next request.
    pub async fn ipykernel(&self) -> anyhow::Result<Arc<Ipykernel>> {
        self.processes.read().await.first().cloned().context("the kernel has no running ipykernel")
    }

    /// Forwards a client's message to the ipykernel. While a restart (asked
    /// for, or after a death) is under way the message waits for it and then goes to the
    /// new process; a request to a kernel that has no process and will get none (dead,
    /// shut down) is answered with an error reply.
    pub async fn send_from_client(
        self: &Arc<Self>,
        client: ClientId,
        channel: Channel,
        msg: Message,
    ) -> anyhow::Result<()> {
        let header = msg.header()?;
        // Only requests get replies; remembering a comm_msg would leak the entry.
        let is_request = matches!(channel, Channel::Shell | Channel::Control) && header.msg_type.ends_with("_request");
        if is_request {
            self.hub.expect_reply(&header.msg_id, client, SystemTime::now());
        }
        let resets = self.resets.load(Ordering::SeqCst);
        // Tokio's Mutex is FIFO: messages queued behind a restart keep their order.
        let guard = self.lifecycle.lock().await;
        let mut ipykernel = self.ipykernel().await.ok();
        if let Some(r) = ipykernel.clone().filter(|r| r.process.has_exited()) {
            // Dead before its exit watcher ran: handle the death now, so the message goes
            // to the restarted process rather than into a dead one's socket.
            let how = r.process.wait().await;
            self.on_exit(r.process.pid(), &how).await;
            ipykernel = self.ipykernel().await.ok();
        }
        if self.gpus > 0
            && channel == Channel::Shell
            && header.msg_type == "execute_request"
            && self.resets.load(Ordering::SeqCst) != resets
        {
            // A GPU cell is bound before it is sent here; the restart reset that binding
            // (as binding answers the cells still waiting), so it must not run unbound.
            drop(guard);
            self.hub.unhold_reply(&header.msg_id);
            self.reject_cell(client, &msg, "KernelRestarted", "the kernel was restarted before this cell ran");
            return Ok(());
        }
        let Some(r) = ipykernel else {
            drop(guard);
            let why = if self.stopping.load(Ordering::SeqCst) {
                "the kernel was shut down"
            } else {
                "the kernel is dead and is not being restarted; restart it or start a new one"
            };
            if !is_request {
                anyhow::bail!("{why}: {} {} not delivered", channel.as_str(), header.msg_type);
            }
            tracing::warn!(kernel = %self.id, msg_id = %header.msg_id, msg_type = %header.msg_type, "request to a dead kernel answered with an error");
            // A reply the replica host holds would be taken for the kernel's own.
            self.hub.unhold_reply(&header.msg_id);
            self.answer_error(client, channel, &msg, "DeadKernel", why);
            return Ok(());
        };
        tracing::trace!(kernel = %self.id, msg_id = %header.msg_id, msg_type = %header.msg_type, "to kernel");
        let send = r.send(channel, &msg);
        tokio::pin!(send);
        // Only the first poll holds the lock: a kernel that does not drain its socket must
        // not keep a restart (which would cure it) waiting.
        match std::future::poll_fn(|cx| Poll::Ready(send.as_mut().poll(cx))).await {
            Poll::Ready(sent) => sent,
            Poll::Pending => {
                drop(guard);
                send.await
            }
        }
    }

    /// Runs `code` silently in the ipykernel for the daemon itself (namespace
    /// export, apply, digest): no history, no execution count, and neither its IOPub nor
    /// its reply reaches a client. Returns the `execute_reply` content; a Python
    /// exception is an error naming it. `user_expressions` are evaluated after the code
    /// (their results are in the content's `user_expressions`).
    pub async fn run_internal(
        &self,
        code: &str,
        user_expressions: &serde_json::Value,
        timeout: Duration,
    ) -> anyhow::Result<serde_json::Value> {
        let msg_id = format!("nbos-internal-{}", uuid::Uuid::new_v4());
        let msg = Message::new(
            "execute_request",
            "notebookosd",
            &msg_id,
            SystemTime::now(),
            None,
            &serde_json::json!({
                "code": code,
                "silent": true,
                "store_history": false,
                "user_expressions": user_expressions,
                "allow_stdin": false,
                "stop_on_error": false,
            }),
        );
        let rx = self.hub.expect_silent_reply(&msg_id);
        let r = self.ipykernel().await;
        let sent = match r {
            Ok(r) => r.send(Channel::Shell, &msg).await,
            Err(e) => Err(e),
        };
        if let Err(e) = sent {
            self.hub.forget_silent(&msg_id);
            return Err(e.context("sending the daemon's internal request"));
        }
        let reply = match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => anyhow::bail!("the kernel's internal reply was lost"),
            Err(_) => {
                self.hub.forget_silent(&msg_id);
                anyhow::bail!("the kernel did not answer the daemon's internal request within {timeout:?}");
            }
        };
        let content = reply.content_json().context("undecodable internal execute_reply")?;
        if content.get("status").and_then(|s| s.as_str()) != Some("ok") {
            let field = |k: &str| content.get(k).and_then(|v| v.as_str()).unwrap_or("?").to_owned();
            anyhow::bail!("internal request failed in the kernel: {}: {}", field("ename"), field("evalue"));
        }
        Ok(content)
    }

    /// Interrupts the running cell (SIGINT, as `interrupt_mode = "signal"`).
    pub async fn interrupt(&self) -> anyhow::Result<()> {
        let r = self.ipykernel().await?;
        tracing::info!(kernel = %self.id, pid = r.process.pid(), "interrupting kernel");
        r.process.signal(crate::sys::signals::SIGINT)
    }

    /// Starts a new process (same key as `conn`, fresh ports; a new key without one) as
    /// the kernel's ipykernel, retrying a start that lost a port race, and registers it.
    async fn spawn_process(self: &Arc<Self>, conn: Option<&ConnectionInfo>) -> anyhow::Result<Arc<Ipykernel>> {
        let log = self.launch.dir.join("kernel.log");
        let mut attempt = 1;
        let ipykernel = loop {
            let before = std::fs::metadata(&log).map_or(0, |m| m.len());
            let conn = match conn {
                Some(c) => c.with_fresh_ports()?,
                None => ConnectionInfo::new_loopback(&self.name)?,
            };
            // A restart starts a new Python, not a pre-warmed one: JupyterLab's reconnection
            // after the `restarting` status raced a kernel ready within ~250 ms (the notebook
            // kept showing "Starting"; docs/prewarm.md).
            let launch = LaunchSpec { prewarm: None, ..self.launch.clone() };
            match Ipykernel::start(0, &launch, conn, self.hub.clone(), self.metrics.clone()).await {
                Ok(r) => break Arc::new(r),
                Err(e) if attempt < START_ATTEMPTS && lost_a_port_race(&e, &log, before) => {
                    tracing::warn!(kernel = %self.id, attempt, error = format!("{e:#}"), "a kernel port was taken while it restarted; retrying with fresh ports");
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        };
        *self.started_at.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
        self.processes.write().await.push(ipykernel.clone());
        if let Some(hook) = self.spawn_hook.get() {
            hook(&self.id, ipykernel.process.pid());
        }
        self.watch_exit(&ipykernel);
        Ok(ipykernel)
    }

    /// Asks every ipykernel to shut down, kills what does not, removes the kernel's files.
    pub async fn shutdown(&self) {
        let _g = self.lifecycle.lock().await;
        self.stopping.store(true, Ordering::SeqCst);
        let processes = std::mem::take(&mut *self.processes.write().await);
        for r in &processes {
            self.stop_process(r).await;
        }
        self.hub.set_state("dead", SystemTime::now());
        self.hub.close();
        let pids: Vec<u32> = processes.iter().map(|r| r.process.pid()).collect();
        self.run_exit_hook(&pids);
        if let Err(e) = std::fs::remove_dir_all(&self.launch.dir) {
            tracing::warn!(kernel = %self.id, dir = %self.launch.dir.display(), error = %e, "could not remove the kernel directory");
        }
    }

    /// The Kernel Gateway model.
    pub async fn model(&self) -> KernelModel {
        let a = self.hub.activity();
        let pids = self.processes.read().await.iter().map(|r| r.process.pid()).collect();
        KernelModel {
            id: self.id.clone(),
            name: self.name.clone(),
            last_activity: iso_date(a.last_activity),
            execution_state: a.execution_state,
            connections: a.connections,
            gpus: self.gpus,
            gpu_memory_mib: self.gpu_memory_mib,
            pids,
            owner: self.owner().map(|u| u.name.clone()),
        }
    }

    /// The user who owns the kernel (none without `[auth]` users).
    pub fn owner(&self) -> Option<&crate::users::User> {
        self.owner.get()
    }

    /// Names the kernel's owner; only the first call counts (the registry's, before the
    /// kernel is listed).
    pub fn set_owner(&self, owner: crate::users::User) {
        if self.owner.set(owner).is_err() {
            tracing::warn!(kernel = %self.id, "a kernel's owner is set once");
        }
    }

    async fn stop_process(&self, r: &Ipykernel) {
        let msg = Message::new(
            "shutdown_request",
            "notebookosd",
            &uuid::Uuid::new_v4().to_string(),
            SystemTime::now(),
            None,
            &serde_json::json!({ "restart": false }),
        );
        // The reply is the daemon's, not any client's; nobody waits for it.
        drop(self.hub.expect_internal_reply(&msg.header().map(|h| h.msg_id).unwrap_or_default()));
        if let Err(e) = r.send(Channel::Control, &msg).await {
            tracing::debug!(kernel = %self.id, error = format!("{e:#}"), "shutdown_request not sent");
        }
        r.process.stop(SHUTDOWN_GRACE).await;
    }

    async fn wait_ready(&self, r: &Ipykernel) -> anyhow::Result<()> {
        let msg_id = uuid::Uuid::new_v4().to_string();
        let msg = Message::new(
            "kernel_info_request",
            "notebookosd",
            &msg_id,
            SystemTime::now(),
            None,
            &serde_json::json!({}),
        );
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        // The kernel may drop a request that arrives before its sockets are wired
        // up, so ask again until it answers.
        loop {
            let rx = self.hub.expect_internal_reply(&msg_id);
            r.send(Channel::Shell, &msg).await?;
            let wait = tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + Duration::from_secs(2)));
            tokio::select! {
                reply = rx => {
                    reply.context("kernel_info reply lost")?;
                    self.hub.set_state("idle", SystemTime::now());
                    tracing::info!(kernel = %self.id, pid = r.process.pid(), "kernel ready");
                    return Ok(());
                }
                how = r.process.wait() => anyhow::bail!(
                    "the kernel process exited while starting ({how}); see {}",
                    self.launch.dir.join("kernel.log").display()
                ),
                () = wait => {
                    if tokio::time::Instant::now() >= deadline {
                        anyhow::bail!("the kernel did not answer kernel_info within {READY_TIMEOUT:?}");
                    }
                }
            }
        }
    }

    fn publish_status(&self, state: &str) {
        let msg = Message::new(
            "status",
            "notebookosd",
            &uuid::Uuid::new_v4().to_string(),
            SystemTime::now(),
            None,
            &serde_json::json!({ "execution_state": state }),
        );
        self.hub.deliver(Channel::Iopub, msg, SystemTime::now());
    }

    /// Publishes a daemon-originated IOPub message in reply to `parent`.
    pub fn publish(&self, parent: &Message, msg_type: &str, content: &serde_json::Value) {
        let session = parent.header().map(|h| h.session).unwrap_or_default();
        let msg = Message::new(
            msg_type,
            &session,
            &uuid::Uuid::new_v4().to_string(),
            SystemTime::now(),
            Some(&parent.header),
            content,
        );
        self.hub.deliver(Channel::Iopub, msg, SystemTime::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel whose process is gone for good (no ipykernel, not restarting).
    fn dead_kernel() -> Arc<LocalKernel> {
        let hub = Arc::new(Hub::new("dead", SystemTime::now()));
        Arc::new(LocalKernel {
            id: "k".into(),
            name: "python3".into(),
            gpus: 0,
            gpu_memory_mib: None,
            hub,
            processes: RwLock::new(Vec::new()),
            launch: LaunchSpec {
                python: "python3".into(),
                env: Vec::new(),
                dir: std::env::temp_dir().join("nbos-dead-kernel-test"),
                memory_limit_bytes: None,
                ..Default::default()
            },
            lifecycle: Mutex::new(()),
            stopping: AtomicBool::new(false),
            auto_restart: AtomicBool::new(true),
            quick_deaths: AtomicU32::new(0),
            started_at: std::sync::Mutex::new(Instant::now()),
            resets: AtomicU64::new(0),
            metrics: Arc::new(Metrics::new()),
            exit_hook: std::sync::Mutex::new(None),
            restart_hook: std::sync::OnceLock::new(),
            spawn_hook: std::sync::OnceLock::new(),
            owner: std::sync::OnceLock::new(),
        })
    }

    fn request(msg_type: &str, msg_id: &str) -> Message {
        Message::new(msg_type, "s", msg_id, SystemTime::now(), None, &serde_json::json!({ "code": "1" }))
    }

    #[tokio::test]
    async fn a_dead_kernel_answers_requests_with_error_replies() {
        let kernel = dead_kernel();
        let (client, mut rx, _) = kernel.hub.connect();
        kernel.send_from_client(client, Channel::Shell, request("execute_request", "cell")).await.expect("answered");
        let mut got = Vec::new();
        while let Ok((channel, m)) = rx.try_recv() {
            let content = m.content_json().expect("content");
            got.push((channel, m.header().expect("header").msg_type, content));
        }
        let kinds: Vec<_> = got.iter().map(|(c, t, _)| (*c, t.as_str())).collect();
        assert_eq!(
            kinds,
            [
                (Channel::Iopub, "status"),
                (Channel::Iopub, "error"),
                (Channel::Iopub, "status"),
                (Channel::Shell, "execute_reply")
            ]
        );
        let reply = &got[3].2;
        assert_eq!(reply["status"], "error");
        assert_eq!(reply["ename"], "DeadKernel");

        kernel
            .send_from_client(client, Channel::Control, request("kernel_info_request", "ki"))
            .await
            .expect("answered");
        let (channel, m) = rx.try_recv().expect("a reply");
        assert_eq!((channel, m.header().expect("header").msg_type.as_str()), (Channel::Control, "kernel_info_reply"));
        assert_eq!(m.content_json().expect("content")["status"], "error");
        assert!(rx.try_recv().is_err(), "only a cell gets IOPub");

        // Not a request: nothing to answer, the caller is told it was not delivered.
        let e = kernel.send_from_client(client, Channel::Shell, request("comm_msg", "c")).await.expect_err("dropped");
        assert!(format!("{e:#}").contains("dead"), "{e:#}");
    }
}
