//! Wires one host together: config -> components -> run -> graceful shutdown.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use tokio::net::TcpListener;

use crate::cluster::{Cluster, ClusterSettings};
use crate::config::Config;
use crate::gateway::conn_caps::ConnCaps;
use crate::gateway::listener::HttpListener;
use crate::gateway::serve::Timeouts;
use crate::gateway::{self, AppState};
use crate::gpu;
use crate::kernel::binding::{Binder, LeaseControl, LogOnlyLeases};
use crate::kernel::identity::{self, KernelUsers};
use crate::kernel::server_leases::ServerLeases;
use crate::kernel::shim_env::ShimEnvironment;
use crate::kernel::Kernels;
use crate::lease::LeaseServer;
use crate::link::credential::Credentials;
use crate::link::endpoint::{Endpoint, ENDPOINT_FILE};
use crate::metrics::{BuildLabels, Metrics};

/// How the node was started, beyond its config.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Started with `--dev`.
    pub dev: bool,
    /// A directory the node created for itself and removes on shutdown.
    pub remove_on_exit: Option<PathBuf>,
}

/// Name of the file in `runtime_dir` holding a generated API token.
pub const GENERATED_TOKEN_FILE: &str = "api-token";

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

    let (token, token_file) = api_token(&config)?;
    let credentials = Credentials {
        token: token.clone(),
        operator_token: config
            .http
            .operator_token_file
            .as_deref()
            .map(crate::link::token::read_token_file)
            .transpose()
            .context("reading http.operator_token_file")?,
        // Hosts prove themselves with node certificates when every host has one (cluster.tls)
        // and verifies them (http.tls.client_ca); see `set_host_identity`.
        node_certificates: config.cluster.tls.is_some()
            && config.http.tls.as_ref().is_some_and(|t| t.client_ca.is_some()),
    };
    if credentials.operator_token.is_some() && credentials.operator_token == token {
        anyhow::bail!("http.operator_token_file must hold a different token from http.token_file");
    }
    if let Some(t) = &credentials.operator_token {
        crate::link::host::set_operator_token(t.clone());
    }
    if config.cluster.enabled && !credentials.node_certificates {
        // No certificates to check: hosts call each other with the operator token, never
        // with the users' (which would let any notebook user act as a host).
        match &credentials.operator_token {
            Some(t) => {
                crate::link::host::set_fallback_token(t.clone());
            }
            None if token.is_some() => anyhow::bail!(
                "a cluster host needs node certificates (cluster.tls and http.tls.client_ca) or, \
                 without them, http.operator_token_file: hosts never call each other with the users' token"
            ),
            None => {}
        }
    }
    let inventory = gpu::inventory::discover(&config.gpu).context("taking the GPU inventory")?;

    let mut metrics = Metrics::new();
    let leasing = if inventory.gpus.is_empty() {
        None
    } else {
        Some(start_leasing(&config, &inventory, metrics.registry_mut()).context("starting GPU leasing")?)
    };
    let observer = start_observer(&config, leasing.as_ref(), metrics.registry_mut())?;
    let device_cgroups = start_device_guard(&config, &inventory, leasing.as_ref(), metrics.registry_mut())?;
    metrics
        .build_info
        .get_or_create(&BuildLabels { version: env!("CARGO_PKG_VERSION").into(), node: node.clone() })
        .set(1);
    metrics.gpus_total.set(i64::try_from(inventory.gpus.len()).unwrap_or(i64::MAX));
    let metrics = Arc::new(metrics);

    let listener = TcpListener::bind(config.http.listen)
        .await
        .with_context(|| format!("binding http.listen = {}", config.http.listen))?;
    let addr: SocketAddr = listener.local_addr().context("reading the bound address")?;
    let caps = ConnCaps::new(config.http.max_connections, config.http.max_connections_per_source);
    let (listener, url) = match &config.http.tls {
        Some(tls) => {
            let server = crate::link::tls::server_config(&tls.cert, &tls.key, tls.client_ca.as_deref())
                .context("loading http.tls")?;
            (HttpListener::tls(listener, server, caps, config.http.header_read_timeout), format!("https://{addr}"))
        }
        None => (HttpListener::plain(listener, caps), format!("http://{addr}")),
    };

    // On disk under the state directory, not in the runtime directory's tmpfs (/run, shared
    // with systemd and the lease socket): kernels' homes have a quota there (kernel/home.rs).
    let kernels_dir = config.node.state_dir.join("kernels");
    create_private_dir(&kernels_dir)?;
    crate::kernel::sandbox::configure(crate::kernel::sandbox::Sandbox::from_config(
        &config.kernel,
        identity::daemon_is_root(),
    ));
    // Kernels a killed predecessor left (outside systemd): none is ever adopted.
    let orphans =
        crate::kernel::orphans::kill_left_over(&std::path::absolute(&kernels_dir).unwrap_or(kernels_dir.clone()));
    if orphans > 0 {
        tracing::warn!(count = orphans, dir = %kernels_dir.display(), "killed kernel processes a previous daemon of this host left running");
    }
    // And their cgroups (memory, pids, device guard), which only a daemon that ends can remove.
    let host_tag = crate::kernel::registry::host_tag(&kernels_dir);
    let cgroups = crate::kernel::orphans::remove_left_over_cgroups(
        &crate::kernel::orphans::kernel_cgroup_parents(
            Path::new("/sys/fs/cgroup"),
            &std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default(),
        ),
        &host_tag,
    );
    if cgroups > 0 {
        tracing::warn!(count = cgroups, "removed kernel cgroups a previous daemon of this host left");
    }
    if let Some(dc) = &device_cgroups {
        // Named like the kernels' other cgroups, so the next daemon finds what this one leaves.
        dc.set_tag(host_tag);
    }
    // Their directories (no kernel is adopted): on disk now, they would pile up.
    crate::kernel::home::remove_left_over(&kernels_dir);
    if kernel_users.switches_user() {
        open_to_kernels(&config, &kernels_dir, leasing.as_ref().map(|(_, shim)| shim))?;
    }
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
        tokio::spawn(async move {
            let mut every = tokio::time::interval(std::time::Duration::from_secs(1));
            loop {
                every.tick().await;
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
        kernels = kernels.with_device_cgroups(dc);
    }
    let kernels = Arc::new(kernels);

    // Cluster mode: the raft store and the meta group. Never blocks on other hosts: a host
    // whose peers are down serves /healthz and reports the cluster as not ready.
    let cluster = if config.cluster.enabled {
        set_host_identity(&config)?;
        Some(start_cluster(&config, &node, &url, token.clone(), &inventory, kernels.clone()).await?)
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
        inventory: inventory.clone(),
        metrics,
        kernels: kernels.clone(),
        leases: leasing.as_ref().map(|(server, _)| server.clone()),
        limits: crate::gateway::limits::Limits::new(config.limits.clone()),
    });

    let endpoint = Endpoint {
        url: url.clone(),
        pid: std::process::id(),
        token_file: token_file.clone(),
        state_dir: config.node.state_dir.clone(),
    };
    let endpoint_path = config.node.runtime_dir.join(ENDPOINT_FILE);
    write_file_atomically(&endpoint_path, serde_json::to_string_pretty(&endpoint)?.as_bytes())?;

    tracing::info!(
        node = %node, %url, state_dir = %config.node.state_dir.display(),
        gpus = inventory.gpus.len(), gpu_source = %inventory.source, dev = opts.dev,
        "notebookosd listening"
    );
    // One plain line on stdout for people and scripts (the logs go to stderr).
    // One block, written at once: a reader that stops after the URL line must not
    // leave the later lines to a closed pipe. Stdout is informational: a closed
    // stdout is logged, never fatal.
    let mut block = String::new();
    {
        use std::fmt::Write as _;
        let _ = writeln!(block, "notebookosd {}: listening on {url}", env!("CARGO_PKG_VERSION"));
        let _ = writeln!(block, "notebookosd: state in {}", config.node.state_dir.display());
        match (&token, &token_file) {
            (None, _) => {
                let _ = writeln!(block, "notebookosd: API open without a token (loopback, dev mode)");
            }
            (Some(_), Some(f)) => {
                let _ = writeln!(block, "notebookosd: API token in {}", f.display());
            }
            (Some(_), None) => {}
        }
        if config.cluster.enabled {
            let _ = writeln!(
                block,
                "notebookosd: cluster node {}, raft on {}, seeds {}",
                config.cluster.node_id,
                config.cluster.raft_listen,
                config.cluster.seeds.join(",")
            );
        }
        let _ = writeln!(
            block,
            "notebookosd: {} GPU(s) ({}){}",
            inventory.gpus.len(),
            inventory.source,
            if inventory.source == "fake" { " — SIMULATED by the fake-cuda test double" } else { "" }
        );
    }
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(block.as_bytes()).and_then(|()| out.flush()) {
        tracing::warn!(error = %e, "could not write the start-up lines to stdout");
    }
    drop(out);

    let watchdog = systemd_ready();

    let mut app = gateway::router(state.clone());
    if let Some(c) = &cluster {
        app = gateway::cluster::enable(
            app,
            state.clone(),
            c.cluster.clone(),
            c.replicas.clone(),
            c.collector.clone(),
            token.clone(),
        );
        app = app.merge(crate::cluster::http::router(c.cluster.clone(), c.collector.clone(), credentials.clone()));
    }
    // A raft store whose log can no longer be written (a full disk) stops this host as a
    // signal does, and the daemon then exits with the reason (fail-stop, as etcd on a failed
    // WAL write): a host that looked alive with a dead store would never answer.
    let store = cluster.as_ref().map(|c| c.cluster.store().clone());
    let store_failure = Arc::new(std::sync::Mutex::new(None::<String>));
    let stop = {
        let store_failure = store_failure.clone();
        async move {
            let failed = async {
                match &store {
                    Some(s) => s.failed().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown_signal() => {}
                reason = failed => {
                    tracing::error!(reason = %reason, "the raft store stopped: stopping this host");
                    if let Ok(mut f) = store_failure.lock() {
                        *f = Some(reason);
                    }
                }
            }
        }
    };
    // Each request carries its connection's `Peer` (the verified client certificate).
    let timeouts = Timeouts { header_read: config.http.header_read_timeout, idle: config.http.idle_timeout };
    crate::gateway::serve::serve(listener, app, timeouts, stop).await;

    if let Some(w) = watchdog {
        w.abort();
    }
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    tracing::info!("shutting down");
    // Leave the heartbeat first: the other hosts see this one down at once.
    if let Some(c) = &cluster {
        c.supervisor.abort();
        if let Some(a) = &c.autoscaler {
            a.abort();
        }
        if let Some(t) = &c.collecting {
            t.abort();
        }
        c.cluster.shutdown().await;
    }
    // Tell every kernel to stop, kill what does not, so nothing is orphaned.
    kernels.shutdown_all().await;
    ticker.abort();
    if let Some(e) = exits {
        e.abort();
    }
    // Dropping the lease server stops its threads and removes the socket; the
    // observer's thread stops with its last handle.
    drop(leasing);
    drop(observer);
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

/// This host's identity on calls to other hosts (see [`crate::link::host`]): its node
/// certificate (`cluster.tls`), when the HTTP API verifies client certificates, so that
/// the other hosts (configured alike) verify it in turn.
fn set_host_identity(config: &Config) -> anyhow::Result<()> {
    let (Some(raft), Some(http)) = (&config.cluster.tls, &config.http.tls) else { return Ok(()) };
    if http.client_ca.is_none() {
        return Ok(());
    }
    let tls = crate::link::tls::client_config(&raft.ca_cert, Some((&raft.cert, &raft.key)))
        .context("loading cluster.tls as this host's client identity")?;
    crate::link::host::set_identity(crate::link::host::HostIdentity { node_id: config.cluster.node_id, tls });
    Ok(())
}

/// Opens the raft store under `state_dir/raft` and starts this host's cluster membership.
async fn start_cluster(
    config: &Config,
    node: &str,
    url: &str,
    token: Option<String>,
    inventory: &gpu::Inventory,
    kernels: Arc<Kernels>,
) -> anyhow::Result<ClusterNode> {
    use crate::cluster::autoscale::provider::ExecProvider;
    use crate::cluster::objects::collector::Collector;
    use crate::cluster::objects::{Objects, S3Options};
    use crate::cluster::records::{GpuRecord, LoadRecord};
    use crate::cluster::replica_host::ReplicaHost;
    use crate::cluster::state_sync::SyncConfig;
    use crate::cluster::supervisor::Supervisor;
    use crate::config::AutoscaleProvider;
    use raft_store::{RaftStore, StoreConfig, TransportSecurity};

    let c = &config.cluster;
    let mut seeds = std::collections::BTreeMap::new();
    for seed in c.seed_list().map_err(|e| anyhow::anyhow!("cluster.seeds: {e}"))? {
        let addr = tokio::net::lookup_host(seed.addr.as_str())
            .await
            .ok()
            .and_then(|mut a| a.next())
            .with_context(|| format!("cluster.seeds: cannot resolve {}={}", seed.node_id, seed.addr))?;
        seeds.insert(seed.node_id, addr);
    }
    let security = match &c.tls {
        Some(t) => {
            TransportSecurity::MutualTls { ca_cert: t.ca_cert.clone(), cert: t.cert.clone(), key: t.key.clone() }
        }
        None => TransportSecurity::Plaintext,
    };
    let mut store_cfg = StoreConfig::new(c.node_id, config.node.state_dir.join("raft"), c.raft_listen, security);
    store_cfg.peers = seeds.iter().filter(|(&id, _)| id != c.node_id).map(|(&id, &a)| (id, a)).collect();
    let store = RaftStore::open(store_cfg).with_context(|| {
        format!(
            "opening the raft store in {} (cluster.raft_listen = {})",
            config.node.state_dir.join("raft").display(),
            c.raft_listen
        )
    })?;
    // Others reach this host's raft at its seed address when it has one (raft_listen may be
    // 0.0.0.0), else at the address it advertises.
    let raft_addr = seeds.get(&c.node_id).copied().or(c.raft_advertise).unwrap_or(c.raft_listen);
    let settings = ClusterSettings {
        node_id: c.node_id,
        name: node.to_owned(),
        gateway_url: if c.advertise_url.is_empty() {
            url.to_owned()
        } else {
            c.advertise_url.trim_end_matches('/').to_owned()
        },
        raft_addr,
        seeds,
        host_ttl: c.host_ttl,
        replicas: c.replicas,
        subscription_ratio: config.gpu.subscription_ratio,
        placement_wait: match config.autoscale.provider {
            AutoscaleProvider::None => std::time::Duration::ZERO,
            AutoscaleProvider::Exec => config.autoscale.placement_wait,
        },
        sync_inline_max_bytes: c.sync_inline_max_bytes,
        object_store: config.object_store_url(),
        token,
        gpus: inventory
            .gpus
            .iter()
            .map(|g| GpuRecord { uuid: g.uuid.clone(), model: g.name.clone(), memory_bytes: g.memory_mib << 20 })
            .collect(),
        memory_bytes: host_memory_bytes(),
    };
    let node_id = c.node_id;
    let kernels_for_replicas = kernels.clone();
    let probe: crate::cluster::meta::LoadProbe = Arc::new(move || {
        let kernels = kernels.clone();
        Box::pin(async move {
            let snap = kernels.binder().snapshot();
            LoadRecord {
                node_id,
                gpus_total: snap.total,
                gpus_committed: snap.committed.saturating_add(snap.idle_held),
                // Idle-held GPUs are taken back for a cell that needs them: a cell could take them now.
                gpus_idle: snap.total.saturating_sub(snap.committed),
                replicas: u32::try_from(kernels.len().await).unwrap_or(u32::MAX),
                subscribed_gpus: snap.requested,
            }
        })
    });
    let cluster = Cluster::new(settings, store.clone(), probe);
    cluster.start();
    tracing::info!(node_id, raft = %c.raft_listen, "cluster member starting (meta group in the background)");

    // Replica hosting: the supervisor starts a local replica (and joins its kernel group)
    // for every kernel record that places one here.
    let s3 = S3Options { request_timeout: c.object_store_timeout, ..S3Options::default() };
    let objects = Objects::open_with(Some(c.object_store.as_str()), &config.node.state_dir.join("objects"), &s3)
        .context("opening cluster.object_store")?;
    let collector = Collector::new(cluster.clone(), objects.clone(), c.object_gc_grace);
    let collecting = collector.start(c.object_gc_interval);
    let mut sync = SyncConfig::new(config.node.state_dir.join("sync"));
    sync.inline_max_bytes = c.sync_inline_max_bytes;
    match sync.remove_leftovers() {
        Ok(0) => {}
        Ok(n) => {
            tracing::info!(removed = n, dir = %sync.work_dir.display(), "removed the namespace sync scratch directories a previous run left")
        }
        // Not fatal: the host works, the space stays taken until the next start.
        Err(e) => tracing::warn!(
            error = format!("{e:#}"),
            "could not remove the namespace sync scratch directories a previous run left"
        ),
    }
    let replicas = Arc::new(ReplicaHost::new(node_id, store, kernels_for_replicas, objects, sync));
    let supervisor = Supervisor::start(cluster.clone(), replicas.clone());
    let autoscaler = match config.autoscale.provider {
        AutoscaleProvider::None => None,
        AutoscaleProvider::Exec => {
            let a = &config.autoscale;
            tracing::info!(command = ?a.command, rule = ?a.rule, min = a.min_hosts, max = a.max_hosts, "autoscaling through an exec provider");
            let provider = Arc::new(ExecProvider::new(a.command.clone(), a.command_timeout));
            Some(crate::cluster::autoscale::start(cluster.clone(), a.clone(), provider))
        }
    };
    Ok(ClusterNode { cluster, replicas, supervisor, autoscaler, collector, collecting })
}

/// The cluster side of a node.
struct ClusterNode {
    cluster: Arc<Cluster>,
    replicas: Arc<crate::cluster::replica_host::ReplicaHost>,
    supervisor: tokio::task::JoinHandle<()>,
    /// The autoscaler, when `[autoscale]` names a provider (it acts while this host leads).
    autoscaler: Option<tokio::task::JoinHandle<()>>,
    /// The large-object store's collector (it acts while this host leads).
    collector: Arc<crate::cluster::objects::collector::Collector>,
    /// Its periodic task, unless `cluster.object_gc_interval` is 0.
    collecting: Option<tokio::task::JoinHandle<()>>,
}

/// `MemTotal` from /proc/meminfo, in bytes (0 when unreadable).
fn host_memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            let line = t.lines().find(|l| l.starts_with("MemTotal:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kib| kib << 10)
}

/// Starts the lease server on `runtime_dir/lease.sock` with GPU control through
/// the driver's checkpoint API, and prepares the shim environment of kernels.
fn start_leasing(
    config: &Config,
    inventory: &gpu::Inventory,
    registry: &mut prometheus_client::registry::Registry,
) -> anyhow::Result<(Arc<LeaseServer>, ShimEnvironment)> {
    use crate::gpu::checkpoint::{CheckpointApi, DriverCheckpoint};
    use crate::lease::metrics::LeaseMetrics;
    use crate::lease::table::Policy;
    use crate::lease::LeaseServerConfig;

    let socket = config.node.runtime_dir.join("lease.sock");
    let shim = ShimEnvironment::prepare(&config.gpu, &config.node.runtime_dir, &socket)?;
    let lease_metrics = LeaseMetrics::default();
    lease_metrics.register(registry);
    if config.gpu.driver == crate::config::GpuDriver::Fake {
        // The fake-cuda test double reads its settings from the environment once, when
        // this process first loads it (just below). The daemon's own driver and NVML calls
        // (checkpoint, per-process memory) must see the same simulated GPUs and capacity
        // ledgers as the kernels. Fake mode only; nothing else reads these variables.
        for (key, value) in shim.fake_env() {
            std::env::set_var(key, value);
        }
    }
    let api: Option<Box<dyn CheckpointApi>> = match DriverCheckpoint::load(&shim.driver) {
        Ok(api) => Some(Box::new(api)),
        Err(e) => {
            tracing::warn!(driver = %shim.driver.display(), error = %e, "no checkpoint API: revoked GPU memory stays resident");
            None
        }
    };
    let mut control = gpu::control::GpuControl::new(api, lease_metrics.clone());
    if config.gpu.driver == crate::config::GpuDriver::Fake {
        // The test double carries its own NVML (per-process memory from its ledgers).
        match gpu::process_memory::ProcessGpuMemory::open(Some(&shim.driver)) {
            Ok(memory) => control = control.with_process_memory(memory),
            Err(e) => tracing::debug!(error = %e, "no per-process GPU memory: evicted bytes are not counted"),
        }
    }
    let cfg = LeaseServerConfig {
        socket,
        // Idle detection follows the shim's activity reports; the scheduler core
        // decides release (its idle_release), the lease table only backs it up.
        policy: Policy { idle_grace: std::time::Duration::from_secs(1), idle_release: config.gpu.idle_release },
        activity_interval: crate::kernel::shim_env::ACTIVITY_INTERVAL,
        memory_limit_bytes: 0,
        driver_path: shim.driver.clone(),
    };
    let server =
        LeaseServer::start(cfg, inventory.gpus.clone(), control, lease_metrics).context("starting the lease server")?;
    tracing::info!(socket = %server.socket().display(), gpus = inventory.gpus.len(), "lease server listening");
    Ok((Arc::new(server), shim))
}

/// Loads the GPU device guard when `gpu.device_guard = "ebpf"` and tells it every change of
/// the GPUs a kernel holds; refuses to start when it is asked for and cannot load. Without
/// GPUs (no lease server) there is nothing to guard.
fn start_device_guard(
    config: &Config,
    inventory: &gpu::Inventory,
    leasing: Option<&(Arc<LeaseServer>, ShimEnvironment)>,
    registry: &mut prometheus_client::registry::Registry,
) -> anyhow::Result<Option<Arc<crate::kernel::device_cgroup::DeviceCgroups>>> {
    use crate::config::DeviceGuardMode;
    use crate::kernel::device_cgroup::{self, DeviceCgroups, DeviceGuardMetrics};
    if config.gpu.device_guard.unwrap_or(DeviceGuardMode::Off) == DeviceGuardMode::Off {
        return Ok(None);
    }
    let Some((server, _)) = leasing else {
        tracing::info!("gpu.device_guard = \"ebpf\" but this host has no GPUs: nothing to guard");
        return Ok(None);
    };
    let mount = device_cgroup::cgroup2_mount(std::path::Path::new("/sys/fs/cgroup")).context(
        "gpu.device_guard = \"ebpf\" needs a cgroup v2 mount (/sys/fs/cgroup or /sys/fs/cgroup/unified); none found",
    )?;
    let minors = device_cgroup::gpu_minors(&inventory.gpus, std::path::Path::new("/proc/driver/nvidia/gpus"));
    let metrics = DeviceGuardMetrics::default();
    metrics.register(registry);
    let dc = DeviceCgroups::load(&mount, minors.clone(), metrics).map_err(|e| {
        anyhow::anyhow!(
            "gpu.device_guard = \"ebpf\" but the GPU device guard cannot load: {e} (it needs root, or CAP_BPF and \
             CAP_SYS_ADMIN, and a kernel with BPF cgroup device programs; gpu.device_guard = \"off\" runs without it)"
        )
    })?;
    let dc = Arc::new(dc);
    let weak = Arc::downgrade(&dc);
    server.set_device_hook(Arc::new(move |kernel, gpus| {
        if let Some(dc) = weak.upgrade() {
            dc.set_gpus(kernel, gpus);
        }
    }));
    tracing::info!(cgroups = %mount.join("notebookos").display(), gpu_minors = ?minors, "GPU device guard loaded");
    Ok(Some(dc))
}

/// Starts the GPU activity observer (`[observer]`); `auto` falls back to procfs
/// with a log line. Without GPUs there is nothing to observe.
fn start_observer(
    config: &Config,
    leasing: Option<&(Arc<LeaseServer>, ShimEnvironment)>,
    registry: &mut prometheus_client::registry::Registry,
) -> anyhow::Result<Option<Arc<nbos_ebpf::Observer>>> {
    use crate::config::ObserverMode;
    use nbos_ebpf::ModeRequest;
    let Some((server, shim)) = leasing else { return Ok(None) };
    let mode = match config.observer.mode {
        ObserverMode::Auto => ModeRequest::Auto,
        ObserverMode::Ebpf => ModeRequest::Ebpf,
        ObserverMode::Procfs => ModeRequest::Procfs,
    };
    // Probe the configured libraries, else the driver the shim forwards to.
    let libraries = if config.observer.probe_libraries.is_empty() {
        vec![shim.driver.clone()]
    } else {
        config.observer.probe_libraries.clone()
    };
    let cfg = nbos_ebpf::ObserverConfig {
        mode,
        libraries,
        // Kernels run under the shim, which writes NBOS_SHIM_COUNTERS_DIR/<pid> (exact launch
        // counts at a few ns each): no launch uprobes; copy/memset/sync probes stay on.
        launch_probes: false,
        counters_dir: Some(shim.counters_dir.clone()),
        ..nbos_ebpf::ObserverConfig::default()
    };
    let observer = nbos_ebpf::Observer::start(cfg).context("starting the GPU observer ([observer] mode)")?;
    observer.metrics().register(registry);
    tracing::info!(mode = observer.mode().as_str(), probes = observer.probe_count(), "GPU observer running");
    let observer = Arc::new(observer);
    // The shims' lease-protocol activity reports feed the observer too. A weak handle: the
    // observer's thread stops with its last strong handle, whatever the lease server does.
    let weak = Arc::downgrade(&observer);
    server.set_activity_hook(Arc::new(move |pid, calls| {
        if let Some(o) = weak.upgrade() {
            if let Err(e) = o.record_shim_activity(pid, calls) {
                tracing::debug!(pid, error = %e, "observer did not take a shim activity report");
            }
        }
    }));
    Ok(Some(observer))
}

/// The token clients must present, and the file it lives in.
fn api_token(config: &Config) -> anyhow::Result<(Option<String>, Option<PathBuf>)> {
    if let Some(path) = &config.http.token_file {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading http.token_file {}", path.display()))?;
        let token = text.lines().next().unwrap_or("").trim().to_owned();
        anyhow::ensure!(
            token.len() >= 16,
            "http.token_file {}: the token must be at least 16 characters",
            path.display()
        );
        return Ok((Some(token), Some(path.clone())));
    }
    if config.http.listen.ip().is_loopback() && config.http.allow_unauthenticated_loopback {
        tracing::warn!(listen = %config.http.listen, "API open without a token (loopback only)");
        return Ok((None, None));
    }
    // Loopback without a configured token: generate one readable only by root, as Jupyter does.
    let path = config.node.runtime_dir.join(GENERATED_TOKEN_FILE);
    let token = random_token()?;
    write_file_atomically(&path, format!("{token}\n").as_bytes())?;
    Ok((Some(token), Some(path)))
}

/// 32 random bytes, hex-encoded.
fn random_token() -> anyhow::Result<String> {
    use std::io::Read;
    let mut buf = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .context("reading /dev/urandom for an API token")?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Kernels run as another uid: it must pass through the daemon's runtime directory and
/// `kernels/` (0711: enter, not list) to its own directory and the lease socket, load the
/// CUDA shim (0755), and write
/// the shim's counters (1733: create, not list, not remove others') and the fake GPUs'
/// ledgers (1777). In cluster mode they also pass through the state directory to their
/// namespace export directories under `sync/` (the raft log and objects stay 0700). Only
/// the daemon's own directories change, never anything above them.
fn open_to_kernels(config: &Config, kernels_dir: &Path, shim: Option<&ShimEnvironment>) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let chmod = |dir: &Path, mode: u32| {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("making {} mode {mode:o} for kernels", dir.display()))
    };
    let (runtime_dir, state_dir) = (&config.node.runtime_dir, &config.node.state_dir);
    chmod(runtime_dir, 0o711)?;
    chmod(kernels_dir, 0o711)?;
    // Kernels' directories are in the state directory: kernels pass through it.
    if kernels_dir.starts_with(state_dir) || config.cluster.enabled || runtime_dir.starts_with(state_dir) {
        if config.cluster.enabled {
            for private in [state_dir.join("raft"), state_dir.join("objects")] {
                create_private_dir(&private)?;
                chmod(&private, 0o700)?;
            }
        }
        chmod(state_dir, 0o711)?;
    }
    if let Some(shim) = shim {
        // The shim kernels load as libcuda.so.1 (the unit's UMask=0077 would keep it private).
        chmod(&shim.dir, 0o755)?;
        chmod(&shim.dir.join("libcuda.so.1"), 0o755)?;
    }
    for (key, value) in shim.map(|s| s.env.as_slice()).unwrap_or_default() {
        match key.as_str() {
            "NBOS_SHIM_COUNTERS_DIR" => chmod(Path::new(value), 0o1733)?,
            "FAKE_CUDA_STATE_DIR" => chmod(Path::new(value), 0o1777)?,
            _ => {}
        }
    }
    Ok(())
}

fn create_private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating directory {}", dir.display()))
}

/// Writes `path` via a temporary file and rename, mode 0600, so readers never see half a file.
fn write_file_atomically(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(contents).with_context(|| format!("writing {}", tmp.display()))?;
    f.sync_all().with_context(|| format!("syncing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

/// Tells systemd we are ready and, when it asks for one, keeps its watchdog fed.
fn systemd_ready() -> Option<tokio::task::JoinHandle<()>> {
    if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
        tracing::debug!(error = %e, "sd_notify READY failed (not under systemd?)");
    }
    let interval = sd_notify::watchdog_enabled().filter(|d| !d.is_zero())?;
    // Ping at half the interval, as sd_watchdog_enabled(3) recommends.
    let period = interval / 2;
    tracing::info!(?period, "systemd watchdog enabled");
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        loop {
            tick.tick().await;
            let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
        }
    }))
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot install the SIGTERM handler");
            return std::future::pending().await;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}
