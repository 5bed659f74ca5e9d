//! One ipykernel process: spawn, signal, wait.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use tokio::sync::watch;

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
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// The Python interpreter (config `kernel.python`).
    pub python: PathBuf,
    /// Extra environment (the shim's `LD_LIBRARY_PATH`, lease socket, GPU request).
    pub env: Vec<(String, String)>,
    /// Directory for the connection file and the kernel's log.
    pub dir: PathBuf,
    /// Address-space limit of the kernel process (config `kernel.memory_limit_mib`).
    pub memory_limit_bytes: Option<u64>,
}

/// A running (or exited) kernel process.
#[derive(Debug)]
pub struct KernelProcess {
    pid: u32,
    exited: Arc<AtomicBool>,
    exit: watch::Receiver<Option<String>>,
}

impl KernelProcess {
    /// Starts `python -m ipykernel_launcher -f <connection_file>`.
    ///
    /// The kernel runs in its own process group so a Ctrl-C aimed at the daemon's
    /// terminal does not interrupt every notebook; stdout and stderr go to
    /// `kernel.log` next to the connection file.
    pub fn spawn(spec: &LaunchSpec, connection_file: &Path) -> anyhow::Result<Self> {
        let log_path = spec.dir.join("kernel.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening kernel log {}", log_path.display()))?;
        let log2 = log.try_clone().context("duplicating the kernel log handle")?;
        let mut cmd = tokio::process::Command::new(&spec.python);
        cmd.arg("-m")
            .arg("ipykernel_launcher")
            .arg("-f")
            .arg(connection_file)
            // The NotebookOS helper (python/nbos_kernel): namespace tracking now,
            // state export later. A Python without it logs the failed import in
            // kernel.log and runs as a plain ipykernel.
            .arg("--IPKernelApp.extra_extensions=nbos_kernel")
            // The kernel has a process group of its own (interrupts, kills), so a daemon that
            // dies by SIGKILL does not take it along: ipykernel's parent poller makes it exit
            // within a second once its parent is gone, instead of running on as an orphan
            // (a restarted daemon starts its replicas afresh).
            .arg(format!("--IPKernelApp.parent_handle={}", std::process::id()))
            .current_dir(&spec.dir)
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log2)
            .process_group(0)
            .kill_on_drop(true);
        cmd.env_clear();
        for (k, v) in std::env::vars_os() {
            if k.to_str().is_some_and(inherited) {
                cmd.env(k, v);
            }
        }
        for (k, v) in &spec.env {
            cmd.env(k, v);
        }
        if let Some(limit) = spec.memory_limit_bytes {
            // RLIMIT_AS: an allocation beyond the limit fails inside the kernel
            // (Python raises MemoryError) instead of the OOM killer taking the host's
            // memory back from some other process. It bounds each process, not the
            // tree; the registry also puts the kernel in a memory cgroup (v2 memory.max
            // or v1 memory.limit_in_bytes, see `cgroup.rs`), which bounds the tree.
            let rlim = libc::rlimit { rlim_cur: limit, rlim_max: limit };
            // SAFETY: the closure runs in the child between fork and exec, where only
            // async-signal-safe calls are allowed; setrlimit(2) is one, and the closure
            // touches nothing but its own copy of `rlim`.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_AS, &rlim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting the kernel with {} -m ipykernel_launcher", spec.python.display()))?;
        let pid = child.id().context("the kernel process exited before it could be watched")?;
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
        Ok(Self { pid, exited, exit: rx })
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
    pub fn signal(&self, sig: libc::c_int) -> anyhow::Result<()> {
        if self.has_exited() {
            return Ok(());
        }
        let pid = libc::pid_t::try_from(self.pid).context("pid out of range")?;
        // SAFETY: kill(2) only reads its two integer arguments. The pid is our own
        // child, which has not been reaped (the waiter sets `exited` first), so it
        // cannot have been reused by another process.
        let rc = unsafe { libc::kill(pid, sig) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::ESRCH) {
                return Err(err).with_context(|| format!("sending signal {sig} to kernel pid {}", self.pid));
            }
        }
        Ok(())
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
            if let Err(e) = self.signal(libc::SIGKILL) {
                tracing::warn!(pid = self.pid, error = format!("{e:#}"), "could not kill the kernel");
            }
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), self.wait()).await;
        }
    }
}
