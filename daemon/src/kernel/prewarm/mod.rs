//! Pre-warmed kernels: Python processes started ahead of time, ipykernel and the
//! NotebookOS helper imported, under the CUDA shim, as the kernels' account. A new
//! replica (kernel creation, re-placement, migration) takes one over instead of starting
//! Python, which is most of a kernel's start. See `docs/prewarm.md`.
//!
//! The pool's size follows demand ([`crate::sched::prewarm::pool_size`], between
//! `kernel.prewarm_min` and `kernel.prewarm_max`); it is kept by a refill task. A
//! process is only for a kernel whose account, interpreter, memory limit and preloaded
//! libraries are the pool's: with `kernel.uid_range` (an account per kernel) there is
//! no pool.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use super::identity::KernelIdentity;
use super::process::{self, KernelProcess, Launch, LaunchSpec};
use crate::metrics::{Metrics, PrewarmTakeLabels, StateLabels};

/// The launcher each pre-warmed process runs.
const LAUNCHER: &str = include_str!("launcher.py");
/// Its file in the kernels directory.
const LAUNCHER_FILE: &str = ".prewarm.py";
/// The pool processes' own directory (their HOME, working directory and log).
const POOL_DIR: &str = ".prewarm";
/// Takes remembered for sizing (the window of Little's law).
const WINDOW: Duration = Duration::from_secs(600);
/// How often the refill task looks at the pool without being woken.
const REFILL_EVERY: Duration = Duration::from_secs(1);
/// Variables the dynamic loader read when the process started: a kernel that wants
/// other values cannot use a pre-warmed process.
const LOADER_ENV: &[&str] = &["LD_PRELOAD", "LD_LIBRARY_PATH"];

/// What the pool's processes are started with.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    /// The interpreter (`kernel.python`, absolute).
    pub python: PathBuf,
    /// The kernels directory (holds the launcher and the pool's directory).
    pub kernels_dir: PathBuf,
    /// The host-wide environment of kernels (the CUDA shim's).
    pub env: Vec<(String, String)>,
    /// The account every kernel runs as (`None`: the daemon's own).
    pub identity: Option<KernelIdentity>,
    /// `kernel.memory_limit_mib`, as bytes.
    pub memory_limit_bytes: Option<u64>,
    /// `kernel.prewarm_min`: processes kept even when nothing is taken.
    pub min: u32,
    /// `kernel.prewarm_max`: never more.
    pub max: u32,
}

/// One pre-warmed process.
pub struct Warm {
    process: KernelProcess,
    stdin: tokio::process::ChildStdin,
    ready: Arc<AtomicBool>,
}

impl Warm {
    /// Its pid (it keeps it as the kernel).
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Makes this process the kernel of `spec`: the same checks and files as a new
    /// kernel, then it joins the kernel's cgroups, and only then is it told which
    /// kernel it is (no kernel code runs outside them). On error the process is killed.
    pub async fn hand_over(mut self, spec: &LaunchSpec, connection_file: &Path) -> anyhow::Result<KernelProcess> {
        let handed = async {
            drop(process::admit(spec, connection_file)?);
            let pid = self.process.pid().to_string();
            for procs in &spec.cgroup_procs {
                std::fs::write(procs, &pid)
                    .with_context(|| format!("moving pre-warmed pid {pid} into {}", procs.display()))?;
            }
            let order = order(spec, connection_file)?;
            self.stdin.write_all(&order).await.context("sending the kernel to the pre-warmed process")?;
            self.stdin.flush().await.context("sending the kernel to the pre-warmed process")?;
            anyhow::Ok(())
        };
        match handed.await {
            Ok(()) => Ok(self.process),
            Err(e) => {
                let _ = self.process.signal(libc::SIGKILL);
                Err(e)
            }
        }
    }
}

/// The line that tells a pre-warmed process which kernel it is.
fn order(spec: &LaunchSpec, connection_file: &Path) -> anyhow::Result<Vec<u8>> {
    let text = |s: &std::ffi::OsStr, what: &str| {
        s.to_str().map(str::to_owned).with_context(|| format!("{what} is not UTF-8 (a pre-warmed kernel takes JSON)"))
    };
    let mut env = serde_json::Map::new();
    for (k, v) in process::kernel_env(spec) {
        env.insert(text(&k, "a variable name")?, text(&v, "a variable's value")?.into());
    }
    let argv = process::ipykernel_args(connection_file)
        .iter()
        .map(|a| text(a, "an argument"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let order = serde_json::json!({
        "argv": argv,
        "env": env,
        "cwd": text(process::kernel_cwd(spec).as_os_str(), "the working directory")?,
        "log": text(spec.dir.join(process::KERNEL_LOG).as_os_str(), "the log path")?,
    });
    let mut line = serde_json::to_vec(&order).context("encoding the kernel for the pre-warmed process")?;
    line.push(b'\n');
    Ok(line)
}

/// The host's pool.
pub struct PrewarmPool {
    settings: PoolSettings,
    launcher: PathBuf,
    dir: PathBuf,
    idle: Mutex<VecDeque<Warm>>,
    takes: Mutex<VecDeque<Instant>>,
    /// The last start-to-ready time, ms (the refill time of Little's law).
    refill_ms: AtomicU64,
    /// Processes that died before they were ready, in a row (backs the refill off).
    failures: AtomicU64,
    wake: Arc<tokio::sync::Notify>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for PrewarmPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrewarmPool").field("settings", &self.settings).finish_non_exhaustive()
    }
}

/// Why a take found nothing, or what it found (the `result` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakeResult {
    /// A ready process.
    Hit,
    /// A process still importing (it saves what it has done).
    Warming,
    /// None left: a new Python is started.
    Empty,
    /// The kernel needs another account, interpreter, limit or loader environment.
    Mismatch,
}

impl TakeResult {
    fn label(self) -> &'static str {
        match self {
            Self::Hit => "hit",
            Self::Warming => "warming",
            Self::Empty => "empty",
            Self::Mismatch => "mismatch",
        }
    }
}

impl PrewarmPool {
    /// Writes the launcher and the pool's directory, and starts the refill task (which
    /// ends with the pool). `settings.max == 0` means no pool: `None`.
    pub fn start(settings: PoolSettings, metrics: Arc<Metrics>) -> anyhow::Result<Option<Arc<Self>>> {
        if settings.max == 0 {
            return Ok(None);
        }
        let launcher = settings.kernels_dir.join(LAUNCHER_FILE);
        // Through a new file: a running pool process may be reading the old one.
        let tmp = launcher.with_extension("tmp");
        std::fs::write(&tmp, LAUNCHER).with_context(|| format!("writing the pre-warm launcher {}", tmp.display()))?;
        set_mode(&tmp, 0o644)?;
        std::fs::rename(&tmp, &launcher).with_context(|| format!("installing {}", launcher.display()))?;
        let dir = settings.kernels_dir.join(POOL_DIR);
        if let Some(id) = &settings.identity {
            process::make_own_dir(&dir, id)?;
        } else {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            set_mode(&dir, 0o700)?;
        }
        let pool = Arc::new(Self {
            settings,
            launcher,
            dir,
            idle: Mutex::new(VecDeque::new()),
            takes: Mutex::new(VecDeque::new()),
            // Until measured: a typical ipykernel start.
            refill_ms: AtomicU64::new(2_000),
            failures: AtomicU64::new(0),
            wake: Arc::new(tokio::sync::Notify::new()),
            metrics,
        });
        tokio::spawn(refill(Arc::downgrade(&pool), pool.wake.clone()));
        tracing::info!(min = pool.settings.min, max = pool.settings.max, "kernel pre-warm pool on");
        Ok(Some(pool))
    }

    /// Takes a process for `spec`, if one fits; counts the result.
    pub fn take(&self, spec: &LaunchSpec) -> Option<Warm> {
        let (warm, result) = if self.fits(spec) {
            let mut idle = lock(&self.idle);
            idle.retain(|w| !w.process.has_exited());
            let at = idle.iter().position(|w| w.ready.load(Ordering::SeqCst)).or((!idle.is_empty()).then_some(0));
            match at.and_then(|i| idle.remove(i)) {
                Some(w) if w.ready.load(Ordering::SeqCst) => (Some(w), TakeResult::Hit),
                Some(w) => (Some(w), TakeResult::Warming),
                None => (None, TakeResult::Empty),
            }
        } else {
            (None, TakeResult::Mismatch)
        };
        self.metrics.prewarm_takes_total.get_or_create(&PrewarmTakeLabels { result: result.label().into() }).inc();
        if result != TakeResult::Mismatch {
            let mut takes = lock(&self.takes);
            takes.push_back(Instant::now());
            if takes.len() > 100_000 {
                takes.pop_front();
            }
        }
        self.publish_size();
        self.wake.notify_one();
        warm
    }

    /// Whether a kernel of `spec` can use the pool's processes.
    fn fits(&self, spec: &LaunchSpec) -> bool {
        let s = &self.settings;
        let loader = |env: &[(String, String)], name: &str| env.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        spec.python == s.python
            && spec.identity.as_ref().map(|i| (i.uid, i.gid)) == s.identity.as_ref().map(|i| (i.uid, i.gid))
            && spec.memory_limit_bytes == s.memory_limit_bytes
            && LOADER_ENV.iter().all(|name| loader(&spec.env, name) == loader(&s.env, name))
    }

    /// How many processes to keep now.
    fn target(&self) -> u32 {
        let mut takes = lock(&self.takes);
        let now = Instant::now();
        while takes.front().is_some_and(|t| now.duration_since(*t) > WINDOW) {
            takes.pop_front();
        }
        let n = u32::try_from(takes.len()).unwrap_or(u32::MAX);
        let window = u64::try_from(WINDOW.as_millis()).unwrap_or(u64::MAX);
        crate::sched::prewarm::pool_size(n, window, self.refill_ms.load(Ordering::SeqCst), self.settings.min, self.settings.max)
    }

    fn publish_size(&self) {
        let (mut ready, mut warming) = (0, 0);
        for w in lock(&self.idle).iter().filter(|w| !w.process.has_exited()) {
            if w.ready.load(Ordering::SeqCst) {
                ready += 1;
            } else {
                warming += 1;
            }
        }
        let gauge = &self.metrics.prewarm_pool_processes;
        gauge.get_or_create(&StateLabels { state: "ready".into() }).set(ready);
        gauge.get_or_create(&StateLabels { state: "warming".into() }).set(warming);
    }

    /// Starts one process and puts it in the pool.
    fn start_one(self: &Arc<Self>) -> anyhow::Result<()> {
        let s = &self.settings;
        let log = process::open_in_kernel_dir(
            &self.dir.join("prewarm.log"),
            std::fs::OpenOptions::new().create(true).append(true),
        )?;
        if let Some(id) = &s.identity {
            std::os::unix::fs::fchown(&log, Some(id.uid), Some(id.gid)).context("giving prewarm.log to the kernels' account")?;
        }
        let mut env: Vec<(std::ffi::OsString, std::ffi::OsString)> =
            std::env::vars_os().filter(|(k, _)| k.to_str().is_some_and(process::inherited)).collect();
        env.extend(s.env.iter().map(|(k, v)| (k.into(), v.into())));
        env.push(("HOME".into(), self.dir.clone().into()));
        if let Some(id) = &s.identity {
            env.push(("USER".into(), id.user.clone().into()));
            env.push(("LOGNAME".into(), id.user.clone().into()));
        }
        let launch = Launch {
            what: "a pre-warmed kernel",
            python: &s.python,
            args: vec![self.launcher.clone().into()],
            cwd: &self.dir,
            env,
            stdio: (std::process::Stdio::piped(), std::process::Stdio::piped(), log.into()),
            cgroup_procs: &[],
            memory_limit_bytes: s.memory_limit_bytes,
            identity: s.identity.as_ref(),
        };
        let (process, pipes) = launch.spawn()?;
        let (Some(stdin), Some(stdout)) = (pipes.stdin, pipes.stdout) else {
            anyhow::bail!("the pre-warmed process has no stdin or stdout pipe");
        };
        self.metrics.prewarm_started_total.inc();
        let ready = Arc::new(AtomicBool::new(false));
        let (flag, pool, started) = (ready.clone(), Arc::downgrade(self), Instant::now());
        tokio::spawn(async move {
            // Its one line ("ready"), then nothing until it becomes a kernel (then EOF).
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            if let Ok(Some(line)) = lines.next_line().await {
                if line == "ready" {
                    flag.store(true, Ordering::SeqCst);
                    if let Some(pool) = pool.upgrade() {
                        let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                        pool.refill_ms.store(ms, Ordering::SeqCst);
                        pool.failures.store(0, Ordering::SeqCst);
                        pool.publish_size();
                    }
                }
            }
            while let Ok(Some(_)) = lines.next_line().await {}
        });
        lock(&self.idle).push_back(Warm { process, stdin, ready });
        Ok(())
    }

    /// One refill round: forget the dead, start what is missing, stop what is too many.
    fn refill_once(self: &Arc<Self>) -> Duration {
        let target = self.target() as usize;
        let (dead_unready, surplus) = {
            let mut idle = lock(&self.idle);
            let before = idle.len();
            let mut dead_unready = 0;
            idle.retain(|w| {
                let dead = w.process.has_exited();
                dead_unready += usize::from(dead && !w.ready.load(Ordering::SeqCst));
                !dead
            });
            if before != idle.len() {
                tracing::debug!(gone = before - idle.len(), "pre-warmed processes exited; replacing them");
            }
            let surplus: Vec<Warm> = (target..idle.len()).filter_map(|_| idle.pop_back()).collect();
            (dead_unready, surplus)
        };
        // Closing its stdin ends a process that was never taken.
        drop(surplus);
        if dead_unready > 0 {
            let n = self.failures.fetch_add(dead_unready as u64, Ordering::SeqCst) + dead_unready as u64;
            tracing::warn!(
                failures = n, log = %self.dir.join("prewarm.log").display(),
                "pre-warmed kernels exited before they were ready"
            );
        }
        // A Python that cannot start (a broken kernel.python) is retried one at a time,
        // ever more slowly.
        let failures = self.failures.load(Ordering::SeqCst);
        let missing = target.saturating_sub(lock(&self.idle).len());
        for _ in 0..if failures >= 3 { missing.min(1) } else { missing } {
            if let Err(e) = self.start_one() {
                tracing::warn!(error = format!("{e:#}"), "could not start a pre-warmed kernel");
                self.failures.fetch_add(1, Ordering::SeqCst);
                break;
            }
        }
        self.publish_size();
        if failures >= 3 {
            Duration::from_secs(1 << failures.min(6))
        } else {
            REFILL_EVERY
        }
    }
}

/// Keeps the pool at its target until the pool is dropped.
async fn refill(pool: Weak<PrewarmPool>, wake: Arc<tokio::sync::Notify>) {
    loop {
        let wait = match pool.upgrade() {
            Some(pool) => pool.refill_once(),
            None => return,
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = wake.notified() => {}
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain bookkeeping: a panic while it was held leaves it usable.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn set_mode(path: &Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting mode {mode:o} on {}", path.display()))
}
