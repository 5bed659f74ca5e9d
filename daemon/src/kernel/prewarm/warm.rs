//! One pre-warmed process ([`Warm`]) and its hand-over to a kernel: it must run and
//! answer, join the kernel's cgroups and get its home, then be told which kernel it is.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::io::AsyncWriteExt;

use super::check::{self, start_time, Rejected};
use super::guard::Guard;
use crate::kernel::process::{self, KernelProcess, LaunchSpec};
use crate::metrics::{Metrics, PrewarmRejectLabels, PrewarmTakeLabels};

/// How long a ready process may take to answer the hand-over's ping (it waits on its
/// socket: an answer takes milliseconds; a stopped process is found out sooner, by `/proc`).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// The same for a process still importing (it answers once it is ready), and for a
/// process handed its kernel to have ipykernel's ports open. Past it the kernel starts a
/// new Python, with its own full start deadline.
const WARMING_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a rejected process is given to be gone after its SIGKILL.
const REJECTED_EXIT_WAIT: Duration = Duration::from_secs(5);

/// One pre-warmed process.
pub(super) struct Warm {
    pub(super) process: KernelProcess,
    /// Its start time (`/proc/<pid>/stat`), to tell it from a later process with its pid.
    pub(super) start_time: Option<u64>,
    /// Our end of its control socket (its stdin and stdout): a socket, not a pipe, so no
    /// other process of the kernel account can open it through `/proc/<pid>/fd`.
    pub(super) control: tokio::net::unix::OwnedWriteHalf,
    /// Its answers ("ready", "pong", "up"); read by the ready watcher until it is ready,
    /// then by the hand-over.
    pub(super) answers: Arc<tokio::sync::Mutex<tokio::net::unix::OwnedReadHalf>>,
    pub(super) ready: Arc<AtomicBool>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) guard: Option<Arc<dyn Guard>>,
}

impl Warm {
    /// Its pid (it keeps it as the kernel).
    pub(super) fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Its next answer line.
    pub(super) fn answer(&self) -> impl std::future::Future<Output = Option<Vec<u8>>> + Send + 'static {
        let answers = self.answers.clone();
        async move { check::read_line(&mut *answers.lock().await).await }
    }

    /// Kills it (stopped or not: SIGKILL ends a stopped process too) and counts why.
    pub(super) fn reject(&self, why: Rejected) {
        let pid = self.pid();
        let _ = self.process.signal(crate::sys::signals::SIGKILL);
        self.metrics.prewarm_rejected_total.get_or_create(&PrewarmRejectLabels { reason: why.label().into() }).inc();
        tracing::warn!(
            pid,
            reason = why.label(),
            "killed a pre-warmed kernel process that cannot be handed over: {why}"
        );
        self.unguard();
    }

    /// The pool guard no longer protects it (a kernel now, or gone).
    pub(super) fn unguard(&self) {
        if let Some(g) = &self.guard {
            if let Err(e) = g.release(self.pid()) {
                tracing::warn!(
                    pid = self.pid(),
                    error = format!("{e:#}"),
                    "pre-warm pool guard: could not release a pid"
                );
            }
        }
    }

    /// Makes this process the kernel of `spec`: it must run and answer a ping, then the
    /// same checks and files as a new kernel, then it joins the kernel's cgroups, and only
    /// then is it told which kernel it is (no kernel code runs outside them); it must then
    /// say ipykernel is up. On error the process is killed.
    ///
    /// With `switch_to_owner` (`kernel.run_as = "owner"`) the order also names the
    /// kernel's account, which the process switches to (dropping its two capabilities)
    /// before it opens anything of the kernel's; once it says `up`, `/proc` must show it
    /// runs as exactly that account with no capability left, or it is killed.
    pub(super) async fn hand_over(
        mut self,
        spec: &LaunchSpec,
        connection_file: &Path,
        switch_to_owner: bool,
    ) -> anyhow::Result<KernelProcess> {
        let pid = self.process.pid();
        let started = self.start_time;
        // A stopped process still takes bytes on its socket: a failed write or a silence
        // is explained by what /proc says first.
        let gone = |e: std::io::Error| {
            anyhow::Error::new(check::alive(pid, started).err().unwrap_or(Rejected::Exited)).context(e)
        };
        let handed = async {
            check::alive(pid, started)?;
            self.control.write_all(b"ping\n").await.map_err(gone)?;
            let limit = if self.ready.load(Ordering::SeqCst) { ANSWER_TIMEOUT } else { WARMING_TIMEOUT };
            check::awaited(self.answer(), b"pong", pid, started, limit, Rejected::Unresponsive).await?;
            drop(process::admit(spec, connection_file)?);
            // Our child, unreaped until its waiter saw it exit: the pid is still its own
            // unless it died meanwhile (checked by its start time just before the move).
            anyhow::ensure!(
                !self.process.has_exited() && start_time(pid) == self.start_time,
                "the pre-warmed process {pid} exited before it was handed its kernel"
            );
            for procs in &spec.cgroup_procs {
                std::fs::write(procs, pid.to_string())
                    .with_context(|| format!("moving pre-warmed pid {pid} into {}", procs.display()))?;
            }
            // Its home with the quota, in its own mount namespace, before it learns its cwd.
            process::enter_home(spec, pid)?;
            let order = order(spec, connection_file, switch_to_owner)?;
            self.control.write_all(&order).await.map_err(gone)?;
            self.control.shutdown().await.map_err(gone)?;
            check::awaited(self.answer(), b"up", pid, started, WARMING_TIMEOUT, Rejected::NotUp).await?;
            if switch_to_owner {
                let id = spec.identity.as_ref().context("a switching pool process needs its kernel's account")?;
                check::switched(pid, started, id)?;
            }
            anyhow::Ok(())
        };
        match handed.await {
            Ok(()) => {
                self.unguard();
                Ok(self.process)
            }
            Err(e) => {
                match e.downcast_ref::<Rejected>() {
                    Some(why) => self.reject(*why),
                    None => {
                        let _ = self.process.signal(crate::sys::signals::SIGKILL);
                        self.unguard();
                    }
                }
                // It may have opened the kernel's ports already (it said `up` before a
                // check failed): the new Python the caller starts on the same connection
                // file binds them only once this one is gone (CI: the new kernel found its
                // ports held by the killed one, three takes in a row).
                if tokio::time::timeout(REJECTED_EXIT_WAIT, self.process.wait()).await.is_err() {
                    tracing::warn!(pid, "a rejected pre-warmed process did not exit after SIGKILL");
                }
                self.metrics.prewarm_takes_total.get_or_create(&PrewarmTakeLabels { result: "failed".into() }).inc();
                Err(e)
            }
        }
    }
}

/// The line that tells a pre-warmed process which kernel it is (and, `switch_to_owner`,
/// which account to become).
pub(super) fn order(spec: &LaunchSpec, connection_file: &Path, switch_to_owner: bool) -> anyhow::Result<Vec<u8>> {
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
    let mut order = serde_json::json!({
        "argv": argv,
        "env": env,
        "cwd": text(process::kernel_cwd(spec).as_os_str(), "the working directory")?,
        "log": text(spec.dir.join(process::KERNEL_LOG).as_os_str(), "the log path")?,
    });
    if switch_to_owner {
        let id = spec.identity.as_ref().context("a switching pool process needs its kernel's account")?;
        anyhow::ensure!(id.uid != 0 && id.gid != 0, "refusing to switch a pre-warmed process to root");
        order["switch"] = serde_json::json!({ "uid": id.uid, "gid": id.gid, "groups": id.groups });
    }
    let mut line = serde_json::to_vec(&order).context("encoding the kernel for the pre-warmed process")?;
    line.push(b'\n');
    Ok(line)
}
