//! A kernel's restarts: on request ([`Kernel::restart`]), and automatic when its process
//! dies, within jupyter_client's limits (deaths in a row soon after a start), after which
//! it is declared dead.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::LocalKernel;
use crate::kernel::connection::ConnectionInfo;
use crate::kernel::ipykernel::Ipykernel;

/// Restarts after deaths in a row, each within [`STABLE_START_TIME`] of its process's
/// start; the next such death is final (jupyter_client's `restart_limit`, same count).
const RESTART_LIMIT: u32 = 5;
/// A process that lived this long had started well (jupyter_client's `stable_start_time`).
const STABLE_START_TIME: Duration = Duration::from_secs(10);

impl LocalKernel {
    /// Replaces every ipykernel's process with a fresh one (same key, fresh ports).
    ///
    /// Clients are not sent `restarting`: jupyter_server sends it only for an automatic
    /// restart after a death, and JupyterLab answers it with its "kernel died" dialog.
    pub async fn restart(self: &Arc<Self>) -> anyhow::Result<()> {
        let _g = self.lifecycle.lock().await;
        tracing::info!(kernel = %self.id, "restarting kernel");
        self.hub.set_state("restarting", SystemTime::now());
        // Asked for: earlier deaths no longer count towards giving up.
        self.quick_deaths.store(0, Ordering::SeqCst);
        let old = std::mem::take(&mut *self.processes.write().await);
        let conn = old.first().map(|r| r.conn.clone());
        for r in &old {
            self.stop_process(r).await;
        }
        drop(old);
        // The old process's last statuses may have overwritten it.
        self.hub.set_state("restarting", SystemTime::now());
        // The cells the old processes ran or queued will never be answered.
        self.run_restart_hook();
        let ipykernel = match self.spawn_process(conn.as_ref()).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(kernel = %self.id, error = format!("{e:#}"), "the restarted kernel did not start; it is dead");
                self.declare_dead(&[]);
                return Err(e);
            }
        };
        self.wait_ready(&ipykernel).await
    }

    /// A ipykernel's process exited. The caller holds `lifecycle`, so a restart or
    /// shutdown that replaced the ipykernel has finished and it is no longer current.
    pub(super) async fn on_exit(self: &Arc<Self>, pid: u32, how: &str) {
        let current = self.processes.read().await.iter().any(|x| x.process.pid() == pid);
        if !current || self.stopping.load(Ordering::SeqCst) {
            return;
        }
        tracing::warn!(kernel = %self.id, pid, exit = %how, "kernel process died");
        self.metrics.kernel_deaths_total.inc();
        let conn = {
            let mut processes = self.processes.write().await;
            let conn = processes.iter().find(|x| x.process.pid() == pid).map(|x| x.conn.clone());
            processes.retain(|x| x.process.pid() != pid);
            conn
        };
        if !self.auto_restart.load(Ordering::SeqCst) {
            self.hub.set_state("dead", SystemTime::now());
            self.run_exit_hook(&[pid]);
            return;
        }
        let lived = self.started_at.lock().unwrap_or_else(std::sync::PoisonError::into_inner).elapsed();
        let quick = if lived < STABLE_START_TIME {
            self.quick_deaths.fetch_add(1, Ordering::SeqCst) + 1
        } else {
            self.quick_deaths.store(0, Ordering::SeqCst);
            0
        };
        if quick > RESTART_LIMIT {
            self.give_up(pid);
            return;
        }
        self.auto_restart(pid, conn.as_ref()).await;
    }

    /// Restarts the kernel after its process `pid` died, as jupyter_server's
    /// KernelRestarter does: `restarting` on IOPub (clients reconnect and drop what they
    /// waited for), a new process with the same key, then `starting` and `idle`. The
    /// caller holds `lifecycle` throughout, so client messages wait for the new process.
    pub(super) async fn auto_restart(self: &Arc<Self>, pid: u32, conn: Option<&ConnectionInfo>) {
        self.metrics.kernel_auto_restarts_total.inc();
        tracing::warn!(kernel = %self.id, pid, quick_deaths = self.quick_deaths.load(Ordering::SeqCst), "restarting the kernel after its process died");
        self.publish_status("restarting");
        // Waiting cells are answered (KernelRestarted), the dead process's GPUs freed.
        self.run_restart_hook();
        let ipykernel = loop {
            match self.spawn_process(conn).await {
                Ok(r) => break r,
                Err(e) => {
                    tracing::warn!(kernel = %self.id, error = format!("{e:#}"), "the restarted kernel did not start");
                    // A start that fails is a quick death too.
                    if self.quick_deaths.fetch_add(1, Ordering::SeqCst) + 1 > RESTART_LIMIT {
                        self.give_up(pid);
                        return;
                    }
                    self.metrics.kernel_auto_restarts_total.inc();
                }
            }
        };
        self.publish_status("starting");
        match self.wait_ready(&ipykernel).await {
            Ok(()) => self.publish_status("idle"),
            // A process that exited is handled by its exit watcher once the lock is free.
            Err(e) => {
                tracing::warn!(kernel = %self.id, pid = ipykernel.process.pid(), error = format!("{e:#}"), "the restarted kernel is not ready")
            }
        }
    }

    /// Stops restarting a kernel that keeps dying right after its start.
    pub(super) fn give_up(&self, pid: u32) {
        tracing::warn!(
            kernel = %self.id, pid, deaths_in_a_row = RESTART_LIMIT + 1, within_s_of_start = STABLE_START_TIME.as_secs(),
            "the kernel keeps dying right after it starts; not restarting it again"
        );
        self.declare_dead(&[pid]);
    }

    /// The kernel has no process and gets none: `dead` (shown and published), its GPUs
    /// and leases freed.
    pub(super) fn declare_dead(&self, pids: &[u32]) {
        self.hub.set_state("dead", SystemTime::now());
        self.publish_status("dead");
        self.run_exit_hook(pids);
    }

    pub(super) fn watch_exit(self: &Arc<Self>, r: &Arc<Ipykernel>) {
        let weak_kernel = Arc::downgrade(self);
        let weak_ipykernel = Arc::downgrade(r);
        tokio::spawn(async move {
            let Some(ipykernel) = weak_ipykernel.upgrade() else { return };
            let how = ipykernel.process.wait().await;
            let pid = ipykernel.process.pid();
            drop(ipykernel);
            let Some(kernel) = weak_kernel.upgrade() else { return };
            // After a restart or shutdown under way: one that replaced this ipykernel makes
            // its exit expected (no longer current).
            let _g = kernel.lifecycle.lock().await;
            kernel.on_exit(pid, &how).await;
        });
    }
}
