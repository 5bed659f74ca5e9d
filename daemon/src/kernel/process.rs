//! One ipykernel process: spawn, signal, wait.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use tokio::sync::watch;

use super::home::{self, AttachedHome};
use super::identity::{self, KernelIdentity};
use super::sandbox;
use crate::sys::child_setup::ChildSetup;
use crate::sys::pid_namespace::PidReport;
use crate::sys::signals::{self, Signal};
use crate::sys::{self, open_flags};

/// The kernel's log in its directory (stdout and stderr).
pub const KERNEL_LOG: &str = "kernel.log";

/// Variables of the daemon's own environment that a kernel inherits. Nothing else is
/// inherited (the daemon's may hold cloud credentials, CA paths, its own settings): a
/// kernel gets these, plus what [`LaunchSpec::env`] sets on purpose (the shim's, the
/// client's `KERNEL_*`, `NOTEBOOKOS_*`).
const INHERITED_ENV: &[&str] = &["PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR"];

/// Whether the daemon's variable `name` is passed on to kernels (also the locale's `LC_*`).
pub fn inherited(name: &str) -> bool {
    INHERITED_ENV.contains(&name) || name.starts_with("LC_")
}

/// How to start a kernel process.
#[derive(Debug, Clone, Default)]
pub struct LaunchSpec {
    /// The Python interpreter (config `kernel.python`).
    pub python: PathBuf,
    /// Extra environment (the shim's `LD_LIBRARY_PATH`, lease socket, GPU request).
    pub env: Vec<(String, String)>,
    /// Directory for the connection file and the kernel's log.
    pub dir: PathBuf,
    /// `kernel.memory_limit_mib`: the kernel process's RLIMIT_AS when
    /// `kernel.limit_address_space` (its memory cgroup bounds the tree in any case).
    pub memory_limit_bytes: Option<u64>,
    /// `cgroup.procs` files of the cgroups the kernel joins before it execs (memory, pids,
    /// device): the child writes "0" to each between fork and exec, so no kernel code
    /// ever runs outside them. Opened before the fork; a failed write fails the spawn.
    pub cgroup_procs: Vec<PathBuf>,
    /// The account the kernel runs as (`None`: the daemon's own, refused when that is
    /// root). The child switches to it between fork and exec; `dir` and the connection
    /// file become its own.
    pub identity: Option<KernelIdentity>,
    /// The kernel's working directory (config `kernel.notebook_dir`); `None`: `dir`.
    pub cwd: Option<PathBuf>,
    /// Runs before every spawn (first start and restarts): re-creates what the process
    /// joins, e.g. cgroups a death removed.
    pub prepare: Option<PrepareHook>,
    /// The host's pool of pre-warmed processes, taken from when one fits.
    pub prewarm: Option<Arc<dyn ProcessSource>>,
    /// The largest message the daemon takes from the kernel's sockets (`kernel.max_message_bytes`).
    pub max_message: super::sockets::MessageCap,
}

/// Where a kernel's process may come from instead of a new Python (`kernel/prewarm/`).
pub trait ProcessSource: Send + Sync + std::fmt::Debug {
    /// A started process made the kernel of `spec` and `connection_file`, or `None` (then
    /// a new Python is started; a failed attempt has been logged and cleaned up).
    fn take<'a>(
        &'a self,
        spec: &'a LaunchSpec,
        connection_file: &'a Path,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<KernelProcess>> + Send + 'a>>;
}

/// What [`LaunchSpec::prepare`] runs.
#[derive(Clone)]
pub struct PrepareHook(pub Arc<dyn Fn() -> anyhow::Result<()> + Send + Sync>);

impl std::fmt::Debug for PrepareHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PrepareHook")
    }
}

/// A running (or exited) kernel process.
#[derive(Debug)]
pub struct KernelProcess {
    /// As the daemon sees it (in a PID namespace of its own, the kernel sees 2).
    pid: u32,
    /// In a PID namespace the kernel is the daemon's grandchild's child: signalled through
    /// this pidfd, never by a pid some other process may have by then.
    pidfd: Option<Arc<std::os::fd::OwnedFd>>,
    exited: Arc<AtomicBool>,
    exit: watch::Receiver<Option<String>>,
}

impl KernelProcess {
    /// Starts the kernel for `connection_file`: a started process from
    /// [`LaunchSpec::prewarm`] (the host's pre-warm pool) when it has one that fits, else
    /// a new Python.
    pub async fn start(spec: &LaunchSpec, connection_file: &Path) -> anyhow::Result<Self> {
        if let Some(source) = &spec.prewarm {
            if let Some(process) = source.take(spec, connection_file).await {
                return Ok(process);
            }
        }
        Self::spawn(spec, connection_file)
    }

    /// Starts `python -m ipykernel_launcher -f <connection_file>`.
    ///
    /// The kernel runs in its own process group so a Ctrl-C aimed at the daemon's
    /// terminal does not interrupt every notebook; stdout and stderr go to
    /// `kernel.log` next to the connection file.
    pub fn spawn(spec: &LaunchSpec, connection_file: &Path) -> anyhow::Result<Self> {
        let log = admit(spec, connection_file)?;
        let log2 = log.try_clone().context("duplicating the kernel log handle")?;
        let home = attach_home(spec)?;
        let mut args: Vec<OsString> = vec!["-m".into(), "ipykernel_launcher".into()];
        args.extend(ipykernel_args(connection_file));
        let cwd = kernel_cwd(spec);
        let launch = Launch {
            what: "the kernel",
            python: &spec.python,
            args,
            cwd: &cwd,
            env: kernel_env(spec),
            stdio: (Stdio::null(), Stdio::from(log), Stdio::from(log2)),
            cgroup_procs: &spec.cgroup_procs,
            memory_limit_bytes: spec.memory_limit_bytes,
            identity: spec.identity.as_ref(),
            keep_setid_caps: false,
        };
        launch.spawn_with_home(home.as_ref())
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// True once the process has exited.
    pub fn has_exited(&self) -> bool {
        self.exited.load(Ordering::SeqCst)
    }

    /// Sends a signal unless the process has already exited.
    pub fn signal(&self, sig: Signal) -> anyhow::Result<()> {
        if self.has_exited() {
            return Ok(());
        }
        if let Some(pidfd) = &self.pidfd {
            return sys::pidfd::signal(pidfd, sig)
                .with_context(|| format!("sending signal {sig} to kernel pid {}", self.pid));
        }
        // The pid is our own child, which has not been reaped (the waiter sets `exited`
        // first), so it cannot have been reused by another process.
        match signals::kill(self.pid, sig) {
            Err(e) if !signals::no_such_process(&e) => {
                Err(e).with_context(|| format!("sending signal {sig} to kernel pid {}", self.pid))
            }
            _ => Ok(()),
        }
    }

    /// Waits until the process exits; returns how it ended.
    pub async fn wait(&self) -> String {
        let mut rx = self.exit.clone();
        loop {
            if let Some(s) = rx.borrow().clone() {
                return s;
            }
            if rx.changed().await.is_err() {
                return "unknown (waiter gone)".to_owned();
            }
        }
    }

    /// Waits up to `grace` for the process to exit, then kills it (and its group).
    pub async fn stop(&self, grace: std::time::Duration) {
        if tokio::time::timeout(grace, self.wait()).await.is_err() {
            tracing::warn!(pid = self.pid, "kernel did not exit in time; killing it");
            if let Err(e) = self.signal(signals::SIGKILL) {
                tracing::warn!(pid = self.pid, error = format!("{e:#}"), "could not kill the kernel");
            }
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), self.wait()).await;
        }
    }
}

/// The checks and files every kernel start needs, pre-warmed or not: the prepare hook,
/// no root, an account that can reach what it needs, its own directory and connection
/// file. Returns `kernel.log`, opened for appending.
pub(super) fn admit(spec: &LaunchSpec, connection_file: &Path) -> anyhow::Result<std::fs::File> {
    if let Some(prepare) = &spec.prepare {
        (prepare.0)()?;
    }
    match &spec.identity {
        None if identity::daemon_is_root() => anyhow::bail!(
            "refusing to start a kernel as root: the daemon is root and no kernel account is set (kernel.user)"
        ),
        Some(id) if id.uid == 0 || id.gid == 0 => {
            anyhow::bail!("refusing to start a kernel as uid {} gid {}: kernels never run as root", id.uid, id.gid)
        }
        _ => {}
    }
    if let Some(id) = &spec.identity {
        identity::check_traversable(&spec.dir, id)?;
        if spec.python.is_absolute() {
            // The interpreter (a venv under a private home would fail at exec, less clearly).
            identity::check_traversable(&spec.python, id)?;
        }
        if let Some(cwd) = &spec.cwd {
            // `cwd` itself too: the kernel must be able to enter it.
            identity::check_traversable(&cwd.join("."), id)?;
        }
        make_own_dir(&spec.dir, id)?;
        make_own_dir(&home::home_of(&spec.dir), id)?;
        hand_over_connection_file(connection_file, id)?;
    } else {
        let home = home::home_of(&spec.dir);
        std::fs::create_dir_all(&home).with_context(|| format!("creating kernel home {}", home.display()))?;
    }
    open_log(&spec.dir.join(KERNEL_LOG), spec.identity.as_ref())
}

/// The kernel's home image attached to a loop device, when the host gives homes a quota
/// (`kernel.home_quota_mib`, root only) and the kernel has an account.
fn attach_home(spec: &LaunchSpec) -> anyhow::Result<Option<AttachedHome>> {
    match (sandbox::host().home_quota_bytes, &spec.identity) {
        (Some(quota), Some(id)) => home::attach(&spec.dir, id, quota)
            .map(Some)
            .context("preparing the kernel's home with its quota (kernel.home_quota_mib)"),
        _ => Ok(None),
    }
}

/// Gives the started process `pid` (a pre-warmed one, already in its own mount
/// namespace, not yet told its kernel) the home of `spec` with its quota. After
/// [`admit`], before the process learns its working directory.
pub fn enter_home(spec: &LaunchSpec, pid: u32) -> anyhow::Result<()> {
    match attach_home(spec)? {
        Some(home) => home::mount_into(pid, &home).context("mounting the kernel's home (kernel.home_quota_mib)"),
        None => Ok(()),
    }
}

/// ipykernel's arguments after `-m ipykernel_launcher`.
pub(super) fn ipykernel_args(connection_file: &Path) -> Vec<OsString> {
    vec![
        "-f".into(),
        connection_file.into(),
        // The NotebookOS helper (python/nbos_kernel): namespace tracking now,
        // state export later. A Python without it logs the failed import in
        // kernel.log and runs as a plain ipykernel.
        "--IPKernelApp.extra_extensions=nbos_kernel".into(),
        // The kernel has a process group of its own (interrupts, kills), so a daemon that
        // dies by SIGKILL does not take it along: ipykernel's parent poller makes it exit
        // within a second once its parent is gone, instead of running on as an orphan
        // (a restarted daemon starts its replicas afresh). In a PID namespace of its own the
        // kernel's parent is its namespace's init, which the daemon's death ends (see
        // pid_namespace.rs): 1 turns the poller off (it would take init for a dead parent).
        format!("--IPKernelApp.parent_handle={}", if sandbox::host().pid_namespace { 1 } else { std::process::id() })
            .into(),
    ]
}

/// Where the kernel runs: `kernel.notebook_dir`, else its account's home (an owner's,
/// `kernel.run_as = "owner"`), else its private home (in its directory, under the home
/// quota when there is one).
pub(super) fn kernel_cwd(spec: &LaunchSpec) -> PathBuf {
    spec.cwd.clone().or_else(|| account_home(spec)).unwrap_or_else(|| home::home_of(&spec.dir))
}

/// The home directory of the account the kernel runs as, when it has one of its own that
/// exists (an owner's); a kernel of an account whose home is missing keeps its private one.
fn account_home(spec: &LaunchSpec) -> Option<PathBuf> {
    spec.identity.as_ref().and_then(|id| id.home.clone()).filter(|h| h.is_dir())
}

/// The kernel's whole environment: the daemon's allowed variables, then what the spec
/// sets, then its account's.
pub(super) fn kernel_env(spec: &LaunchSpec) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> =
        std::env::vars_os().filter(|(k, _)| k.to_str().is_some_and(inherited)).collect();
    env.extend(spec.env.iter().map(|(k, v)| (k.into(), v.into())));
    if let Some(id) = &spec.identity {
        // Last, so nothing above overrides them: the kernel's own account and its private
        // home (IPython, Jupyter, matplotlib, pip write under it), not root's; temporary
        // files there too, under its quota, not in the host's /tmp.
        // An owner's kernel has its account's home, as a login would; temporary files
        // stay in its private home under the quota.
        let private_home = home::home_of(&spec.dir);
        env.push(("HOME".into(), account_home(spec).unwrap_or_else(|| private_home.clone()).into()));
        env.push(("TMPDIR".into(), private_home.into()));
        env.push(("USER".into(), id.user.clone().into()));
        env.push(("LOGNAME".into(), id.user.clone().into()));
    }
    env
}

/// One Python process to start as a kernel (or a pre-warmed one).
pub(super) struct Launch<'a> {
    /// What is started, for errors ("the kernel").
    pub what: &'static str,
    pub python: &'a Path,
    pub args: Vec<OsString>,
    pub cwd: &'a Path,
    /// The whole environment (nothing else is inherited).
    pub env: Vec<(OsString, OsString)>,
    /// stdin, stdout, stderr.
    pub stdio: (Stdio, Stdio, Stdio),
    /// `cgroup.procs` files the child joins before it execs.
    pub cgroup_procs: &'a [PathBuf],
    pub memory_limit_bytes: Option<u64>,
    pub identity: Option<&'a KernelIdentity>,
    /// Keep CAP_SETUID and CAP_SETGID across the exec (a pre-warmed process that switches
    /// to its kernel's owner when taken; `docs/prewarm.md`).
    pub keep_setid_caps: bool,
}

impl Launch<'_> {
    /// Forks and execs: the child joins its cgroups, takes its limits and drops to its
    /// account before any of its code runs.
    pub fn spawn(self) -> anyhow::Result<KernelProcess> {
        self.spawn_with_home(None)
    }

    /// [`Self::spawn`], mounting `home` (the kernel's quota'd home) in the child's own
    /// mount namespace before it drops root.
    fn spawn_with_home(self, home: Option<&AttachedHome>) -> anyhow::Result<KernelProcess> {
        // The host's limits and namespace, the same for pre-warmed and new kernels.
        let confinement = sandbox::child_confinement(sandbox::host())?;
        // Home mounted (over the directory std already changed into): enter it afresh.
        let cwd_again = match home {
            Some(_) => Some(
                std::ffi::CString::new(self.cwd.as_os_str().as_encoded_bytes())
                    .context("the kernel's working directory holds a NUL byte")?,
            ),
            None => None,
        };
        // Opened here, before the fork: the child only write(2)s to them.
        let cgroup_procs = self
            .cgroup_procs
            .iter()
            .map(|p| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(p)
                    .with_context(|| format!("opening {} (the kernel's cgroup)", p.display()))
            })
            .collect::<anyhow::Result<Vec<std::fs::File>>>()?;
        let mut cmd = tokio::process::Command::new(self.python);
        let (stdin, stdout, stderr) = self.stdio;
        cmd.args(&self.args)
            .current_dir(self.cwd)
            .stdin(stdin)
            .stdout(stdout)
            .stderr(stderr)
            .process_group(0)
            .kill_on_drop(true);
        cmd.env_clear();
        cmd.envs(self.env);
        let pid_report = confinement.pid_namespace().then(PidReport::new).transpose()?;
        ChildSetup {
            cgroup_procs: cgroup_procs.iter().map(std::os::fd::AsRawFd::as_raw_fd).collect(),
            // Only on request (kernel.limit_address_space): CUDA reserves more address space
            // than a GPU and its host have memory, and fails to initialise under a tight one.
            address_space_limit: self.memory_limit_bytes.filter(|_| sandbox::host().limit_address_space),
            confinement,
            home: home.map(|h| h.mount.clone()),
            pid_report: pid_report.as_ref().map(PidReport::write_fd),
            ids: self.identity.map(|id| (id.uid, id.gid)),
            groups: self.identity.map(|id| id.groups.clone()).unwrap_or_default(),
            keep_setid_caps: self.keep_setid_caps,
            cwd_again,
        }
        .install(&mut cmd)
        .context("preparing the kernel's start")?;
        let as_whom = match self.identity {
            Some(id) => format!(" as uid {} gid {} ({})", id.uid, id.gid, id.user),
            None => String::new(),
        };
        let mut child = cmd.spawn().with_context(|| {
            format!(
                "starting {}{as_whom} with {} (joining its cgroups, dropping privileges, exec)",
                self.what,
                self.python.display()
            )
        })?;
        drop(cgroup_procs);
        let spawned = child.id().context("the kernel process exited before it could be watched")?;
        // On error `child` is dropped, killed, and the namespace with it.
        let (pid, pidfd) = match pid_report {
            Some(report) => report.take(spawned).map(|(pid, fd)| (pid, Some(Arc::new(fd))))?,
            None => (spawned, None),
        };
        let exited = Arc::new(AtomicBool::new(false));
        let (tx, rx) = watch::channel(None);
        let flag = exited.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            // Set before anyone can see the exit, so no signal goes to a reused pid afterwards.
            flag.store(true, Ordering::SeqCst);
            let how = match status {
                Ok(s) => s.to_string(),
                Err(e) => format!("wait failed: {e}"),
            };
            let _ = tx.send(Some(how));
        });
        Ok(KernelProcess { pid, pidfd, exited, exit: rx })
    }
}

/// Makes the kernel's directory its own, mode 0700 (connection file, log, HOME).
pub(super) fn make_own_dir(dir: &Path, id: &KernelIdentity) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).with_context(|| format!("creating kernel directory {}", dir.display()))?;
    // lchown: the parent is the daemon's, so `dir` is no link a kernel made; never follow one.
    std::os::unix::fs::lchown(dir, Some(id.uid), Some(id.gid))
        .with_context(|| format!("giving kernel directory {} to uid {}", dir.display(), id.uid))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("making kernel directory {} private (0700)", dir.display()))
}

/// Opens a file in the kernel's directory, which the kernel may have filled with links:
/// no symlink is followed and no hard link to another file is accepted, so the root
/// daemon never writes through one to a file elsewhere. `O_NONBLOCK`: a FIFO put there
/// must not block the daemon's open (it is then refused as no plain file); regular files
/// ignore the flag.
pub fn open_in_kernel_dir(path: &Path, options: &mut std::fs::OpenOptions) -> anyhow::Result<std::fs::File> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let f = options
        .custom_flags(open_flags::O_NOFOLLOW | open_flags::O_NONBLOCK)
        .open(path)
        .with_context(|| format!("opening {} (no symlinks)", path.display()))?;
    let meta = f.metadata().with_context(|| format!("examining {}", path.display()))?;
    anyhow::ensure!(
        meta.is_file() && meta.nlink() == 1,
        "{} is not a plain file of its own (a link?); refusing to use it",
        path.display()
    );
    Ok(f)
}

/// The connection file becomes the kernel's: owned by its uid, mode 0600.
fn hand_over_connection_file(path: &Path, id: &KernelIdentity) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let f = open_in_kernel_dir(path, std::fs::OpenOptions::new().read(true))?;
    std::os::unix::fs::fchown(&f, Some(id.uid), Some(id.gid))
        .with_context(|| format!("giving connection file {} to uid {}", path.display(), id.uid))?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("making connection file {} 0600", path.display()))
}

/// `kernel.log`, appended to; the kernel's own when it has an account.
fn open_log(path: &Path, id: Option<&KernelIdentity>) -> anyhow::Result<std::fs::File> {
    let f = open_in_kernel_dir(path, std::fs::OpenOptions::new().create(true).append(true))
        .with_context(|| format!("opening kernel log {}", path.display()))?;
    if let Some(id) = id {
        std::os::unix::fs::fchown(&f, Some(id.uid), Some(id.gid))
            .with_context(|| format!("giving kernel log {} to uid {}", path.display(), id.uid))?;
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::open_in_kernel_dir;

    /// What a kernel may leave in its directories instead of a plain file: the daemon
    /// refuses each at once (a FIFO must not block it; a link must not lead it elsewhere).
    #[test]
    fn fifos_and_links_in_a_kernel_directory_are_refused_without_blocking() {
        let dir = tempfile::tempdir().expect("tmp");
        let fifo = dir.path().join("manifest.json");
        let made = std::process::Command::new("mkfifo").args(["-m", "600"]).arg(&fifo).status().expect("mkfifo");
        assert!(made.success(), "mkfifo");
        let err = open_in_kernel_dir(&fifo, std::fs::OpenOptions::new().read(true)).expect_err("a FIFO");
        assert!(format!("{err:#}").contains("not a plain file"), "{err:#}");

        let target = dir.path().join("secret");
        std::fs::write(&target, "root's").expect("write");
        let symlink = dir.path().join("kernel.log");
        std::os::unix::fs::symlink(&target, &symlink).expect("symlink");
        let err = open_in_kernel_dir(&symlink, std::fs::OpenOptions::new().read(true)).expect_err("a symlink");
        assert!(format!("{err:#}").contains("no symlinks"), "{err:#}");
        let hardlink = dir.path().join("connection.json");
        std::fs::hard_link(&target, &hardlink).expect("hard link");
        let err = open_in_kernel_dir(&hardlink, std::fs::OpenOptions::new().read(true)).expect_err("a hard link");
        assert!(format!("{err:#}").contains("not a plain file"), "{err:#}");

        let plain = dir.path().join("plain");
        std::fs::write(&plain, "ok").expect("write");
        assert!(open_in_kernel_dir(&plain, std::fs::OpenOptions::new().read(true)).is_ok());
    }
}
