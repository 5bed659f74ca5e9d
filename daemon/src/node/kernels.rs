//! Starts the kernels: GPU binding (with the tasks that feed it exits and activity) and the
//! kernel table with its pre-warm pool.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;

use super::gpus::Gpus;
use crate::config::Config;
use crate::kernel::binding::{Binder, LeaseControl, LogOnlyLeases};
use crate::kernel::identity::KernelUsers;
use crate::kernel::server_leases::ServerLeases;
use crate::kernel::Kernels;
use crate::metrics::Metrics;

/// The kernels of a node and the tasks that keep their GPU binding current.
pub(super) struct RunningKernels {
    /// The kernel table.
    pub(super) kernels: Arc<Kernels>,
    /// Frees a dead kernel process's leases on the observer's exit events.
    exits: Option<tokio::task::JoinHandle<()>>,
    /// The binder's one-second tick (idle release, observed activity, guard metrics).
    ticker: tokio::task::JoinHandle<()>,
}

/// What the binder needs of `[auth]`: users-file entries' quotas, the audit log.
pub(super) struct Users {
    /// The users' sources (the users file's quotas).
    pub(super) authenticator: Option<Arc<crate::users::Authenticator>>,
    /// `auth.audit_log`.
    pub(super) audit: Option<Arc<crate::users::audit::AuditLog>>,
}

/// Starts the binder, its tasks, and the kernel table in `kernels_dir`.
pub(super) fn start_kernels(
    config: &Config,
    kernels_dir: PathBuf,
    kernel_users: KernelUsers,
    gpus: &Gpus,
    metrics: &Arc<Metrics>,
    users: Users,
) -> anyhow::Result<RunningKernels> {
    let Users { authenticator, audit } = users;
    let Gpus { inventory, leasing, observer, device_cgroups } = gpus;
    let leases: Arc<dyn LeaseControl> = match &leasing {
        Some((server, _)) => Arc::new(ServerLeases::new(server.clone())),
        None => Arc::new(LogOnlyLeases),
    };
    let binder = Binder::new(
        u32::try_from(inventory.gpus.len()).unwrap_or(u32::MAX),
        config.gpu.idle_release,
        config.gpu.subscription_ratio,
        leases,
        metrics.clone(),
    );
    // The fair share reads each kernel's owner (and their groups' weight) from the book the
    // registry keeps; a kernel without an owner is the anonymous user.
    let owners = Arc::new(crate::kernel::fair_share::KernelOwners::new(&config.limits));
    binder.set_fair_share(config.gpu.fair_share, config.gpu.fair_share_half_life, owners.clone());
    binder.set_fair_share_headroom(config.gpu.fair_share_headroom);
    // gpu_hours_per_day: a users-file entry's own limit, else [limits.user]'s; groups' too.
    let own: crate::kernel::gpu_hours::OwnLimit =
        Arc::new(move |name| authenticator.as_ref().and_then(|a| a.quota_of(name).gpu_hours_per_day));
    binder.set_gpu_hours(crate::kernel::gpu_hours::GpuHoursLimits::new(&config.limits, own));
    if let Some(a) = audit {
        binder.set_audit(a);
    }
    // Exit events free a dead kernel process's leases at once.
    let exits = observer.as_ref().map(|o| {
        let mut rx = o.exit_events();
        let binder = binder.clone();
        tokio::spawn(async move {
            while let Some(ev) = rx.recv().await {
                binder.process_exited(ev.pid);
            }
        })
    });
    let ticker = {
        let (binder, observer, device_cgroups) = (binder.clone(), observer.clone(), device_cgroups.clone());
        let lease_server = leasing.as_ref().map(|(server, _)| server.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(std::time::Duration::from_secs(1));
            loop {
                every.tick().await;
                // GPUs a failed eviction fenced are given to no other kernel's cell.
                if let Some(server) = &lease_server {
                    let fences: Vec<(u32, String)> = server
                        .fenced()
                        .into_iter()
                        .filter_map(|f| u32::try_from(f.index).ok().map(|g| (g, f.kernel_id)))
                        .collect();
                    binder.set_fences(&fences);
                }
                if let Some(dc) = &device_cgroups {
                    dc.refresh_metrics();
                }
                // Idle-held GPUs stay held while the observer sees their kernel use them
                // (eBPF only: procfs counts CPU time, which an idle kernel also spends).
                if let Some(o) = observer.as_ref().filter(|o| o.mode() == nbos_ebpf::Mode::Ebpf) {
                    for (kernel, pids) in binder.idle_holders() {
                        if let Some(ago) = pids.iter().filter_map(|&p| o.idle_for(p)).min() {
                            binder.observed_activity(&kernel, ago);
                        }
                    }
                }
                binder.tick();
            }
        })
    };
    let shim_env = leasing.as_ref().map(|(_, shim)| shim.env.clone()).unwrap_or_default();
    let mut kernels = Kernels::new(
        config.kernel.python.clone(),
        kernels_dir,
        shim_env,
        metrics.clone(),
        binder,
        config.kernel.memory_limit_mib,
    )
    .with_accounts(kernel_users, config.kernel.notebook_dir.clone(), config.kernel.pids_max)
    .with_owners(owners)
    .with_max_message_bytes(usize::try_from(config.kernel.max_message_bytes).unwrap_or(usize::MAX))
    .with_prewarm(config.kernel.prewarm_min, config.kernel.prewarm_max)
    .context("starting the kernel pre-warm pool (kernel.prewarm_max)")?;
    if let Some(o) = &observer {
        let o = o.clone();
        kernels = kernels.with_process_watch(Arc::new(move |kernel, pid| {
            o.set_kernel_label(pid, kernel);
            if let Err(e) = o.watch(pid) {
                tracing::warn!(pid, error = %e, "the observer cannot watch a kernel process");
            }
        }));
    }
    if let Some(dc) = device_cgroups {
        kernels = kernels.with_device_cgroups(dc.clone());
    }
    let kernels = Arc::new(kernels);
    Ok(RunningKernels { kernels, exits, ticker })
}

impl RunningKernels {
    /// Tells every kernel to stop, kills what does not (so nothing is orphaned), then
    /// stops the binder's tasks.
    pub(super) async fn shutdown(self) {
        self.kernels.shutdown_all().await;
        self.ticker.abort();
        if let Some(e) = self.exits {
            e.abort();
        }
    }
}
