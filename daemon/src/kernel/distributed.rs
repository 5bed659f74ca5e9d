//! A kernel as clients see it: a *distributed* kernel whose replicas run on hosts,
//! with a router that picks the replica that executes. On one host there is one
//! replica; replication (issue 7) adds replicas and an election, not a rewrite.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, RwLock};

use super::connection::ConnectionInfo;
use super::hub::{ClientId, Hub};
use super::process::LaunchSpec;
use super::replica::Replica;
use crate::jupyter::message::iso_date;
use crate::jupyter::{Channel, Message};
use crate::metrics::Metrics;

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
/// Starts of a new kernel tried when it lost one of its ports to another process.
const START_ATTEMPTS: u32 = 3;

/// Whether the kernel log gained a failed bind (`zmq.error.ZMQError: Address already in
/// use`) after `offset`: the kernel lost a port race at start.
fn lost_a_port_race(log: &std::path::Path, offset: u64) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(log) else { return false };
    let mut tail = Vec::new();
    // The tail a start writes is a traceback of a few KiB; read at most 1 MiB of it.
    let needle = b"Address already in use";
    f.seek(SeekFrom::Start(offset)).is_ok()
        && f.take(1 << 20).read_to_end(&mut tail).is_ok()
        && tail.windows(needle.len()).any(|w| w == needle)
}

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
    /// NotebookOS extension: the replicas' process ids.
    #[serde(default)]
    pub pids: Vec<u32>,
}

/// One kernel.
pub struct Kernel {
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
    replicas: RwLock<Vec<Arc<Replica>>>,
    launch: LaunchSpec,
    /// Serialises restart and shutdown.
    lifecycle: Mutex<()>,
    stopping: AtomicBool,
    metrics: Arc<Metrics>,
    /// Called once when the kernel is gone (died, or shut down) with its last pids.
    exit_hook: std::sync::Mutex<Option<ExitHook>>,
    /// Called when a restart has killed the old processes (their cells are gone).
    restart_hook: std::sync::OnceLock<RestartHook>,
    spawn_hook: std::sync::OnceLock<SpawnHook>,
}

/// What runs after a restart started a new process: (kernel id, its pid).
pub type SpawnHook = Box<dyn Fn(&str, u32) + Send + Sync>;

/// What runs after a restart killed the kernel's processes: (kernel id).
pub type RestartHook = Box<dyn Fn(&str) + Send + Sync>;

/// What runs when a kernel is gone: (kernel id, pids it had).
pub type ExitHook = Box<dyn FnOnce(&str, &[u32]) + Send>;

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel").field("id", &self.id).field("name", &self.name).finish()
    }
}

impl Kernel {
    /// Starts a kernel with one replica and waits until it answers `kernel_info`.
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
                Err(e) if attempt < START_ATTEMPTS && lost_a_port_race(&log, before) => {
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
        let replica = Arc::new(Replica::start(0, &launch, conn, hub.clone(), metrics.clone()).await?);
        let kernel = Arc::new(Self {
            id,
            name,
            gpus,
            gpu_memory_mib,
            hub,
            replicas: RwLock::new(vec![replica.clone()]),
            launch,
            lifecycle: Mutex::new(()),
            stopping: AtomicBool::new(false),
            metrics,
            exit_hook: std::sync::Mutex::new(None),
            restart_hook: std::sync::OnceLock::new(),
            spawn_hook: std::sync::OnceLock::new(),
        });
        kernel.watch_exit(&replica);
        kernel.wait_ready(&replica).await?;
        kernel.watch_heartbeat();
        Ok(kernel)
    }

    /// Pings the executing replica's heartbeat channel. A kernel whose process is
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
                let Ok(replica) = kernel.executor().await else { continue };
                if kernel.lifecycle.try_lock().is_err() {
                    continue; // restarting
                }
                if replica.heartbeat(HEARTBEAT_TIMEOUT).await {
                    failures = 0;
                    if let Some(state) = saved_state.take() {
                        tracing::info!(kernel = %kernel.id, "kernel answers its heartbeat again");
                        kernel.hub.set_state(&state, SystemTime::now());
                    }
                    continue;
                }
                if replica.process.has_exited() {
                    continue; // the exit watcher reports it
                }
                failures += 1;
                kernel.metrics.kernel_heartbeat_failures_total.inc();
                if failures == HEARTBEAT_MISSES && saved_state.is_none() {
                    tracing::warn!(kernel = %kernel.id, pid = replica.process.pid(), "kernel does not answer its heartbeat");
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

    fn run_exit_hook(&self, pids: &[u32]) {
        let hook = self.exit_hook.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(h) = hook {
            h(&self.id, pids);
        }
    }

    /// Process ids of the replicas (empty while a restart swaps them).
    pub fn pids(&self) -> Vec<u32> {
        self.replicas.try_read().map(|r| r.iter().map(|x| x.process.pid()).collect()).unwrap_or_default()
    }

    /// Answers an `execute_request` the daemon refuses (the cell can never get its
    /// GPUs here) the way a kernel answers a failed cell: busy, error, idle, error reply.
    pub fn reject_cell(&self, client: ClientId, request: &Message, ename: &str, evalue: &str) {
        let now = SystemTime::now();
        let Ok(h) = request.header() else { return };
        self.hub.expect_reply(&h.msg_id, client, now);
        let error = serde_json::json!({
            "ename": ename,
            "evalue": evalue,
            "traceback": [format!("{ename}: {evalue}")],
        });
        self.publish(request, "status", &serde_json::json!({ "execution_state": "busy" }));
        self.publish(request, "error", &error);
        self.publish(request, "status", &serde_json::json!({ "execution_state": "idle" }));
        let mut content = error;
        content["status"] = "error".into();
        content["execution_count"] = 0.into();
        let reply = Message::new(
            "execute_reply",
            &h.session,
            &uuid::Uuid::new_v4().to_string(),
            now,
            Some(&request.header),
            &content,
        );
        self.hub.deliver(Channel::Shell, reply, now);
    }

    /// The replica that executes the next request. With one replica it is that one;
    /// with several, this is where the executor election's result is applied.
    pub async fn executor(&self) -> anyhow::Result<Arc<Replica>> {
        self.replicas.read().await.first().cloned().context("the kernel has no running replica")
    }

    /// Forwards a client's message to the executing replica.
    pub async fn send_from_client(&self, client: ClientId, channel: Channel, msg: Message) -> anyhow::Result<()> {
        let header = msg.header()?;
        // Only requests get replies; remembering a comm_msg would leak the entry.
        if matches!(channel, Channel::Shell | Channel::Control) && header.msg_type.ends_with("_request") {
            self.hub.expect_reply(&header.msg_id, client, SystemTime::now());
        }
        let r = self.executor().await?;
        tracing::trace!(kernel = %self.id, msg_id = %header.msg_id, msg_type = %header.msg_type, "to kernel");
        r.send(channel, &msg).await
    }

    /// Runs `code` silently in the executing replica for the daemon itself (namespace
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
        let r = self.executor().await;
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
        let r = self.executor().await?;
        tracing::info!(kernel = %self.id, pid = r.process.pid(), "interrupting kernel");
        r.process.signal(libc::SIGINT)
    }

    /// Replaces every replica's process with a fresh one (same key, fresh ports).
    pub async fn restart(self: &Arc<Self>) -> anyhow::Result<()> {
        let _g = self.lifecycle.lock().await;
        tracing::info!(kernel = %self.id, "restarting kernel");
        self.publish_status("restarting");
        let old = std::mem::take(&mut *self.replicas.write().await);
        let mut conn = None;
        for r in &old {
            conn.get_or_insert_with(|| r.conn.clone());
            self.stop_replica(r).await;
        }
        drop(old);
        // The cells the old processes ran or queued will never be answered.
        if let Some(hook) = self.restart_hook.get() {
            hook(&self.id);
        }
        let conn = match conn {
            Some(c) => c.with_fresh_ports()?,
            None => ConnectionInfo::new_loopback(&self.name)?,
        };
        let replica = Arc::new(Replica::start(0, &self.launch, conn, self.hub.clone(), self.metrics.clone()).await?);
        self.replicas.write().await.push(replica.clone());
        if let Some(hook) = self.spawn_hook.get() {
            hook(&self.id, replica.process.pid());
        }
        self.watch_exit(&replica);
        self.wait_ready(&replica).await
    }

    /// Asks every replica to shut down, kills what does not, removes the kernel's files.
    pub async fn shutdown(&self) {
        let _g = self.lifecycle.lock().await;
        self.stopping.store(true, Ordering::SeqCst);
        let replicas = std::mem::take(&mut *self.replicas.write().await);
        for r in &replicas {
            self.stop_replica(r).await;
        }
        self.hub.set_state("dead", SystemTime::now());
        let pids: Vec<u32> = replicas.iter().map(|r| r.process.pid()).collect();
        self.run_exit_hook(&pids);
        if let Err(e) = std::fs::remove_dir_all(&self.launch.dir) {
            tracing::warn!(kernel = %self.id, dir = %self.launch.dir.display(), error = %e, "could not remove the kernel directory");
        }
    }

    /// The Kernel Gateway model.
    pub async fn model(&self) -> KernelModel {
        let a = self.hub.activity();
        let pids = self.replicas.read().await.iter().map(|r| r.process.pid()).collect();
        KernelModel {
            id: self.id.clone(),
            name: self.name.clone(),
            last_activity: iso_date(a.last_activity),
            execution_state: a.execution_state,
            connections: a.connections,
            gpus: self.gpus,
            gpu_memory_mib: self.gpu_memory_mib,
            pids,
        }
    }

    async fn stop_replica(&self, r: &Replica) {
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

    async fn wait_ready(&self, r: &Replica) -> anyhow::Result<()> {
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

    fn watch_exit(self: &Arc<Self>, r: &Arc<Replica>) {
        let weak_kernel = Arc::downgrade(self);
        let weak_replica = Arc::downgrade(r);
        tokio::spawn(async move {
            let Some(replica) = weak_replica.upgrade() else { return };
            let how = replica.process.wait().await;
            let pid = replica.process.pid();
            drop(replica);
            let Some(kernel) = weak_kernel.upgrade() else { return };
            // A replica that is still in the set died on its own (not restart/shutdown).
            let current = kernel.replicas.read().await.iter().any(|x| x.process.pid() == pid);
            if current && !kernel.stopping.load(Ordering::SeqCst) {
                tracing::warn!(kernel = %kernel.id, pid, exit = %how, "kernel process died");
                kernel.metrics.kernel_deaths_total.inc();
                kernel.hub.set_state("dead", SystemTime::now());
                kernel.replicas.write().await.retain(|x| x.process.pid() != pid);
                kernel.run_exit_hook(&[pid]);
            }
        });
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
    use super::lost_a_port_race;

    #[test]
    fn only_a_bind_failure_written_after_the_start_counts_as_a_lost_port_race() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("kernel.log");
        std::fs::write(&log, "zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:1')\n").expect("write");
        let before = std::fs::metadata(&log).expect("metadata").len();
        assert!(!lost_a_port_race(&log, before), "an earlier start's failure is not this one's");
        std::fs::write(&log, "ModuleNotFoundError: No module named 'ipykernel'\n").expect("write");
        assert!(!lost_a_port_race(&log, 0), "another failure is reported, not retried");
        let mut text = std::fs::read(&log).expect("read");
        let offset = text.len() as u64;
        text.extend_from_slice(b"\xff\xfe zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:2')\n");
        std::fs::write(&log, &text).expect("write");
        assert!(lost_a_port_race(&log, offset));
        assert!(!lost_a_port_race(&dir.path().join("missing.log"), 0));
    }
}
