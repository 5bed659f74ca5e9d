//! Pre-warmed kernels: Python processes started ahead of time, ipykernel and the
//! NotebookOS helper imported, under the CUDA shim, as the kernels' account. A new
//! replica (kernel creation, re-placement, migration) takes one over instead of starting
//! Python, which is most of a kernel's start. See `docs/prewarm.md`.
//!
//! The pool's size follows demand ([`nbos_sched::prewarm::pool_size`], between
//! `kernel.prewarm_min` and `kernel.prewarm_max`); it is kept by a refill task. A
//! process is only for a kernel whose account, interpreter, memory limit and preloaded
//! libraries are the pool's: with `kernel.uid_range` (an account per kernel) there is
//! no pool.
//!
//! A kernel of the pool's account could stop or trace a pool process: every kernel runs in
//! a PID namespace of its own ([`crate::sys::pid_namespace`]), where pool processes cannot be
//! named; the pool guard ([`guard`], a BPF LSM program) refuses it too where it loads; and
//! every hand-over first checks that the process runs and answers ([`check`]): one that
//! fails is killed and the kernel starts a new Python. One process and its hand-over:
//! [`warm`].

mod check;
mod guard;
mod import_path;
mod warm;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use anyhow::Context;

use super::identity::KernelIdentity;
use super::process::{self, KernelProcess, Launch, LaunchSpec, ProcessSource};
use crate::metrics::{Metrics, PrewarmTakeLabels, StateLabels};
use check::{start_time, Rejected};
use guard::Guard;
use warm::Warm;

/// The launcher each pre-warmed process runs.
const LAUNCHER: &str = include_str!("launcher.py");
/// Its file in the kernels directory.
const LAUNCHER_FILE: &str = ".prewarm.py";
/// The pool processes' own directory (their HOME, working directory and log).
const POOL_DIR: &str = ".prewarm";
/// Takes remembered for sizing (the window of Little's law; the simulator's too).
const WINDOW: Duration = Duration::from_millis(nbos_sched::prewarm::WINDOW_MS);
/// How often the refill task looks at the pool without being woken.
const REFILL_EVERY: Duration = Duration::from_secs(1);
/// Variables the dynamic loader read when the process started: a kernel that wants
/// other values cannot use a pre-warmed process.
const LOADER_ENV: &[&str] = &["LD_PRELOAD", "LD_LIBRARY_PATH"];
/// Pids the pool guard can protect at once (the pool holds at most 64).
const GUARD_PIDS: u32 = 256;

/// What the pool's processes are started with.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    /// The interpreter (`kernel.python`, absolute).
    pub python: PathBuf,
    /// The kernels directory (holds the launcher and the pool's directory).
    pub kernels_dir: PathBuf,
    /// The host-wide environment of kernels (the CUDA shim's).
    pub env: Vec<(String, String)>,
    /// The account pool processes start as: every kernel's (`None`: the daemon's own),
    /// or, with `switch_to_owner`, `kernel.user`'s.
    pub identity: Option<KernelIdentity>,
    /// `kernel.run_as = "owner"`: processes start with CAP_SETUID and CAP_SETGID only and,
    /// when taken, become the kernel's owner and drop both before anything of the kernel
    /// runs (`launcher.py`; checked from `/proc` before the kernel is reported up).
    pub switch_to_owner: bool,
    /// `kernel.memory_limit_mib`, as bytes.
    pub memory_limit_bytes: Option<u64>,
    /// `kernel.prewarm_min`: processes kept even when nothing is taken.
    pub min: u32,
    /// `kernel.prewarm_max`: never more.
    pub max: u32,
}

/// Reads the process's `ready` line (at most a few bytes: the process is not trusted to
/// stop) and records how long it took.
async fn await_ready(
    from: Arc<tokio::sync::Mutex<tokio::net::unix::OwnedReadHalf>>,
    flag: Arc<AtomicBool>,
    pool: Weak<PrewarmPool>,
    started: Instant,
) {
    // Held until the line is read: a hand-over waiting for a warming process's answer
    // reads after it.
    let mut from = from.lock().await;
    if check::read_line(&mut *from).await.as_deref() != Some(b"ready") {
        return;
    }
    drop(from);
    flag.store(true, Ordering::SeqCst);
    if let Some(pool) = pool.upgrade() {
        let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        pool.refill_ms.store(ms, Ordering::SeqCst);
        pool.failures.store(0, Ordering::SeqCst);
        pool.publish_size();
    }
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
    /// Set by [`PrewarmPool::shutdown`]: nothing is started or taken any more.
    stopped: AtomicBool,
    /// Keeps kernels from signalling pool processes, where it loads.
    guard: Option<Arc<dyn Guard>>,
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

/// With `run_as = "owner"`: whether only root can write the interpreter's import path
/// (`import_path`); if not, a warning says which directory, and owner kernels start as
/// new Pythons (no capability is ever held by a process that imports from it). An
/// interpreter that cannot say its path is taken as failing: the kernels' own start says why.
fn import_path_is_roots(s: &PoolSettings) -> bool {
    // The environment pool processes start with (PYTHONPATH included), but HOME's: `-s`.
    let mut env: Vec<(std::ffi::OsString, std::ffi::OsString)> =
        std::env::vars_os().filter(|(k, _)| k.to_str().is_some_and(process::inherited)).collect();
    env.extend(s.env.iter().map(|(k, v)| (k.into(), v.into())));
    match import_path::check_interpreter(&s.python, &env) {
        Ok(Ok(())) => true,
        Err(e) => {
            tracing::warn!(
                python = %s.python.display(),
                "kernel.run_as = \"owner\": no pre-warm pool: the kernel Python's import path could not be \
                 checked ({e:#}); owner kernels start as new Pythons (docs/prewarm.md)"
            );
            false
        }
        Ok(Err(e)) => {
            tracing::warn!(
                path = %e.path.display(),
                why = %e.why,
                "kernel.run_as = \"owner\": no pre-warm pool: the kernel Python's import path {e}, so a non-root \
                 account could run code in a pool process while it holds CAP_SETUID and CAP_SETGID; owner \
                 kernels start as new Pythons (docs/prewarm.md)"
            );
            false
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
        if settings.switch_to_owner && !import_path_is_roots(&settings) {
            return Ok(None);
        }
        let guard = guard::LsmGuard::load(GUARD_PIDS).map(|g| Arc::new(g) as Arc<dyn Guard>);
        let launcher = settings.kernels_dir.join(LAUNCHER_FILE);
        // Through a new file: a running pool process may be reading the old one.
        let tmp = launcher.with_extension("tmp");
        std::fs::write(&tmp, LAUNCHER).with_context(|| format!("writing the pre-warm launcher {}", tmp.display()))?;
        set_mode(&tmp, 0o644)?;
        std::fs::rename(&tmp, &launcher).with_context(|| format!("installing {}", launcher.display()))?;
        let dir = settings.kernels_dir.join(POOL_DIR);
        // Afresh: the kernels' account could write here (a `.pth` file, a module) for the
        // next run's pool processes to load.
        if dir.symlink_metadata().is_ok() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("removing the old {}", dir.display()))?;
        }
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
            stopped: AtomicBool::new(false),
            guard,
        });
        tokio::spawn(refill(Arc::downgrade(&pool), pool.wake.clone()));
        tracing::info!(min = pool.settings.min, max = pool.settings.max, "kernel pre-warm pool on");
        Ok(Some(pool))
    }

    /// Takes a process for `spec`, if one fits; counts the result.
    fn take_one(&self, spec: &LaunchSpec) -> Option<Warm> {
        if self.stopped.load(Ordering::SeqCst) {
            return None;
        }
        let (warm, result) = if self.fits(spec) {
            let mut idle = lock(&self.idle);
            self.reap(&mut idle);
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
        let loader =
            |env: &[(String, String)], name: &str| env.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let account_fits = if s.switch_to_owner {
            // Any owner but root and the pool's own account (refused before, by
            // owner_account; checked again by the launcher and from /proc).
            spec.identity
                .as_ref()
                .is_some_and(|i| i.uid != 0 && i.gid != 0 && s.identity.as_ref().is_some_and(|pool| pool.uid != i.uid))
        } else {
            spec.identity.as_ref().map(|i| (i.uid, i.gid)) == s.identity.as_ref().map(|i| (i.uid, i.gid))
        };
        spec.python == s.python
            && account_fits
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
        nbos_sched::prewarm::pool_size(
            n,
            window,
            self.refill_ms.load(Ordering::SeqCst),
            self.settings.min,
            self.settings.max,
        )
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
        anyhow::ensure!(
            s.identity.is_some() || !super::identity::daemon_is_root(),
            "refusing to pre-warm a kernel as root: the daemon is root and no kernel account is set (kernel.user)"
        );
        let log = process::open_in_kernel_dir(
            &self.dir.join("prewarm.log"),
            std::fs::OpenOptions::new().create(true).append(true),
        )?;
        if let Some(id) = &s.identity {
            std::os::unix::fs::fchown(&log, Some(id.uid), Some(id.gid))
                .context("giving prewarm.log to the kernels' account")?;
        }
        let mut env: Vec<(std::ffi::OsString, std::ffi::OsString)> =
            std::env::vars_os().filter(|(k, _)| k.to_str().is_some_and(process::inherited)).collect();
        env.extend(s.env.iter().map(|(k, v)| (k.into(), v.into())));
        env.push(("HOME".into(), self.dir.clone().into()));
        if let Some(id) = &s.identity {
            env.push(("USER".into(), id.user.clone().into()));
            env.push(("LOGNAME".into(), id.user.clone().into()));
        }
        // Both ends close on exec; the child gets its end as stdin and stdout.
        let (ours, theirs) =
            std::os::unix::net::UnixStream::pair().context("a control socket for a pre-warmed kernel")?;
        let theirs_out = theirs.try_clone().context("a control socket for a pre-warmed kernel")?;
        let launch = Launch {
            what: "a pre-warmed kernel",
            python: &s.python,
            // -s: no user site of the pool's HOME (the launcher adds the kernel's own).
            args: vec!["-s".into(), self.launcher.clone().into()],
            cwd: &self.dir,
            env,
            stdio: (
                std::process::Stdio::from(std::os::fd::OwnedFd::from(theirs)),
                std::process::Stdio::from(std::os::fd::OwnedFd::from(theirs_out)),
                log.into(),
            ),
            cgroup_procs: &[],
            memory_limit_bytes: s.memory_limit_bytes,
            identity: s.identity.as_ref(),
            keep_setid_caps: s.switch_to_owner,
        };
        let process = launch.spawn()?;
        self.metrics.prewarm_started_total.inc();
        // At once: it is still the interpreter's start-up, long before it is ready.
        if let Some(g) = &self.guard {
            if let Err(e) = g.protect(process.pid()) {
                tracing::warn!(
                    pid = process.pid(),
                    error = format!("{e:#}"),
                    "pre-warm pool guard: could not protect a pid"
                );
            }
        }
        let start_time = start_time(process.pid());
        ours.set_nonblocking(true).context("the pre-warmed kernel's control socket")?;
        let (from, control) =
            tokio::net::UnixStream::from_std(ours).context("the pre-warmed kernel's control socket")?.into_split();
        let answers = Arc::new(tokio::sync::Mutex::new(from));
        let ready = Arc::new(AtomicBool::new(false));
        tokio::spawn(await_ready(answers.clone(), ready.clone(), Arc::downgrade(self), Instant::now()));
        let metrics = self.metrics.clone();
        let guard = self.guard.clone();
        let warm = Warm { process, start_time, control, answers, ready, metrics, guard };
        let mut idle = lock(&self.idle);
        // Not after a shutdown that began meanwhile (dropped: end of input ends it).
        if self.stopped.load(Ordering::SeqCst) {
            warm.unguard();
        } else {
            idle.push_back(warm);
        }
        Ok(())
    }

    /// Forgets the pool's dead processes, and kills stopped or traced ones (a kernel
    /// signalled them; see [`check`]); those that died before they were ready count as
    /// failures (a Python that cannot start backs the refill off).
    fn reap(&self, idle: &mut VecDeque<Warm>) {
        let mut unready = 0u64;
        idle.retain(|w| {
            let dead = w.process.has_exited();
            unready += u64::from(dead && !w.ready.load(Ordering::SeqCst));
            if dead {
                w.unguard();
                return false;
            }
            match check::alive(w.pid(), w.start_time) {
                Err(why @ (Rejected::Stopped | Rejected::Traced)) => {
                    w.reject(why);
                    false
                }
                _ => true,
            }
        });
        if unready > 0 {
            let n = self.failures.fetch_add(unready, Ordering::SeqCst) + unready;
            tracing::warn!(
                failures = n, log = %self.dir.join("prewarm.log").display(),
                "pre-warmed kernels exited before they were ready"
            );
        }
    }

    /// Ends every pool process and removes the pool's files (daemon exit).
    pub async fn shutdown(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        let all: Vec<Warm> = lock(&self.idle).drain(..).collect();
        // End of input ends each; one that does not within the grace is killed.
        let stops = all.into_iter().map(|w| async move {
            w.unguard();
            drop(w.control);
            w.process.stop(Duration::from_secs(2)).await;
        });
        futures_util::future::join_all(stops).await;
        self.publish_size();
        for (path, is_dir) in [(&self.dir, true), (&self.launcher, false)] {
            let removed = if is_dir { std::fs::remove_dir_all(path) } else { std::fs::remove_file(path) };
            if let Err(e) = removed.or_else(|e| if e.kind() == std::io::ErrorKind::NotFound { Ok(()) } else { Err(e) })
            {
                tracing::warn!(path = %path.display(), error = %e, "could not remove a pre-warm file");
            }
        }
    }

    /// One refill round: forget the dead, start what is missing, stop what is too many.
    fn refill_once(self: &Arc<Self>) -> Duration {
        if self.stopped.load(Ordering::SeqCst) {
            return REFILL_EVERY;
        }
        let target = self.target() as usize;
        let surplus: Vec<Warm> = {
            let mut idle = lock(&self.idle);
            self.reap(&mut idle);
            (target..idle.len()).filter_map(|_| idle.pop_back()).collect()
        };
        // Closing its control socket ends a process that was never taken.
        for w in surplus {
            w.unguard();
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

impl ProcessSource for PrewarmPool {
    fn take<'a>(
        &'a self,
        spec: &'a LaunchSpec,
        connection_file: &'a Path,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<KernelProcess>> + Send + 'a>> {
        Box::pin(async move {
            let warm = self.take_one(spec)?;
            let pid = warm.pid();
            match warm.hand_over(spec, connection_file, self.settings.switch_to_owner).await {
                Ok(process) => Some(process),
                Err(e) => {
                    tracing::warn!(
                        pid,
                        error = format!("{e:#}"),
                        "could not hand the kernel to a pre-warmed process; starting a new one"
                    );
                    None
                }
            }
        })
    }
}

/// Keeps the pool at its target until the pool is dropped.
async fn refill(pool: Weak<PrewarmPool>, wake: Arc<tokio::sync::Notify>) {
    loop {
        let wait = match pool.upgrade() {
            Some(pool) => pool.refill_once(),
            None => return,
        };
        if wait > REFILL_EVERY {
            // Backing off: kernel starts do not hurry a Python that keeps failing.
            tokio::time::sleep(wait).await;
            continue;
        }
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
