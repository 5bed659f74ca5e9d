//! Wires one host together: config -> components -> run -> graceful shutdown.
//!
//! [`run`] is the list of steps; each component has a starter of its own in this
//! directory that takes what it needs and returns the handles `run` keeps until shutdown.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;

use crate::config::Config;
use crate::gateway::serve::Timeouts;
use crate::gateway::AppState;
use crate::gpu;
use crate::kernel::identity::{self, KernelUsers};
use crate::metrics::{BuildLabels, Metrics};

mod announce;
mod api;
mod cluster;
mod credentials;
mod device_guard;
mod fs;
mod gpu_usage;
mod gpus;
mod kernels;
mod kernels_dir;
mod leasing;
mod observer;
pub mod preflight;
mod shutdown;
mod systemd;

pub use credentials::GENERATED_TOKEN_FILE;

use fs::create_private_dir;

/// How the node was started, beyond its config.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Started with `--dev`.
    pub dev: bool,
    /// A directory the node created for itself and removes on shutdown.
    pub remove_on_exit: Option<PathBuf>,
}

/// Runs the node until SIGTERM or SIGINT.
pub async fn run(config: Config, opts: RunOptions) -> anyhow::Result<()> {
    let started = Instant::now();
    let node = config.node_name();
    create_private_dir(&config.node.state_dir)?;
    create_private_dir(&config.node.runtime_dir)?;
    // A kernel uid's files in the runtime directories kernels write go with the uid too
    // (before the uid range's first sweep, just below).
    crate::kernel::uid_leftovers::also_clean_runtime_dir(&config.node.runtime_dir);
    // Before anything else starts: a root daemon refuses to run without an unprivileged kernel account.
    let kernel_users = KernelUsers::from_config(&config.kernel, identity::daemon_is_root())
        .context("choosing the account kernels run as (kernel.user)")?;

    let (credentials, token_file) = credentials::credentials(&config)?;
    let token = credentials.token.clone();
    let inventory = gpu::inventory::discover(&config.gpu).context("taking the GPU inventory")?;

    let mut metrics = Metrics::new();
    let gpus = gpus::start_gpus(&config, inventory, metrics.registry_mut())?;
    metrics
        .build_info
        .get_or_create(&BuildLabels { version: env!("CARGO_PKG_VERSION").into(), node: node.clone() })
        .set(1);
    metrics.gpus_total.set(i64::try_from(gpus.inventory.gpus.len()).unwrap_or(i64::MAX));
    let metrics = Arc::new(metrics);

    let (listener, url) = api::bind(&config.http).await?;

    let kernels_dir = kernels_dir::prepare_kernels_dir(&config, &gpus, kernel_users.switches_user())?;
    let audit = config.auth.audit_log.as_deref().map(crate::users::audit::AuditLog::open).transpose()?.map(Arc::new);
    let users = kernels::Users { authenticator: credentials.authenticator.clone(), audit: audit.clone() };
    let kernels = kernels::start_kernels(&config, kernels_dir, kernel_users, &gpus, &metrics, users)?;

    // Cluster mode: the raft store and the meta group. Never blocks on other hosts: a host
    // whose peers are down serves /healthz and reports the cluster as not ready.
    let cluster = if config.cluster.enabled {
        cluster::set_host_identity(&config)?;
        Some(
            cluster::start_cluster(&config, &node, &url, token.clone(), &gpus.inventory, kernels.kernels.clone())
                .await?,
        )
    } else {
        None
    };

    let state = Arc::new(AppState {
        node: node.clone(),
        url: url.clone(),
        state_dir: config.node.state_dir.display().to_string(),
        dev: opts.dev,
        started,
        token: token.clone(),
        credentials: credentials.clone(),
        inventory: gpus.inventory.clone(),
        metrics,
        kernels: kernels.kernels.clone(),
        leases: gpus.leasing.as_ref().map(|(server, _)| server.clone()),
        limits: crate::gateway::limits::Limits::new(config.limits.clone()),
        audit,
    });
    let endpoint_path = announce::announce(&config, &state, token_file.as_deref())?;

    let status = format!("serving {url}, {} GPU(s)", state.inventory.gpus.len());
    let watchdog = systemd::systemd_ready(&status);

    let app = api::router(&state, cluster.as_ref());
    let (stop, store_failure) = shutdown::stop_signal(cluster.as_ref().map(|c| c.cluster.store().clone()));
    // Each request carries its connection's `Peer` (the verified client certificate).
    let timeouts = Timeouts { header_read: config.http.header_read_timeout, idle: config.http.idle_timeout };
    crate::gateway::serve::serve(listener, app, timeouts, stop).await;

    if let Some(w) = watchdog {
        w.abort();
    }
    systemd::systemd_stopping();
    tracing::info!("shutting down");
    // Leave the heartbeat first: the other hosts see this one down at once.
    if let Some(c) = &cluster {
        c.shutdown().await;
    }
    // Tell every kernel to stop, kill what does not, so nothing is orphaned.
    kernels.shutdown().await;
    // Dropping the lease server stops its threads and removes the socket; the
    // observer's thread stops with its last handle.
    drop(gpus);
    let _ = std::fs::remove_file(&endpoint_path);
    if let Some(dir) = &opts.remove_on_exit {
        if let Err(e) = std::fs::remove_dir_all(dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "could not remove the temporary state directory");
        }
    }
    if let Some(reason) = store_failure.lock().ok().and_then(|mut f| f.take()) {
        anyhow::bail!(
            "{reason}\nThis host stopped (fail-stop: nothing it had not persisted was acknowledged; its kernels \
             go on on their other replicas). Free space under {} and start it again (systemd restarts it): it \
             recovers its raft log and catches up.",
            config.node.state_dir.display()
        );
    }
    Ok(())
}
