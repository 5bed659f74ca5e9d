//! Starts this host's cluster side (`[cluster]`): its identity on calls to other hosts,
//! the raft store, membership, replica hosting, the object collector and the autoscaler.

use std::sync::Arc;

use anyhow::Context;

use crate::cluster::{Cluster, ClusterSettings};
use crate::config::Config;
use crate::gpu;
use crate::kernel::Kernels;

/// This host's identity on calls to other hosts (see [`crate::link::host`]): its node
/// certificate (`cluster.tls`), when the HTTP API verifies client certificates, so that
/// the other hosts (configured alike) verify it in turn.
pub(super) fn set_host_identity(config: &Config) -> anyhow::Result<()> {
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
pub(super) async fn start_cluster(
    config: &Config,
    node: &str,
    url: &str,
    token: Option<String>,
    inventory: &gpu::Inventory,
    kernels: Arc<Kernels>,
) -> anyhow::Result<ClusterNode> {
    use crate::cluster::cells::object_collector::Collector;
    use crate::cluster::cells::objects::{Objects, S3Options};
    use crate::cluster::cells::replica_host::ReplicaHost;
    use crate::cluster::cells::state_sync::SyncConfig;
    use crate::cluster::cells::supervisor::Supervisor;
    use crate::cluster::control::autoscale::provider::ExecProvider;
    use crate::cluster::control::meta::memory;
    use crate::cluster::control::records::{GpuRecord, LoadRecord};
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
    let binder = kernels.binder().clone();
    let memory_capacity_mib =
        crate::config::kernel_memory_capacity_mib(c.kernel_memory_mib, settings.memory_bytes >> 20);
    tracing::info!(
        memory_capacity_mib,
        "host memory for kernels (cluster.kernel_memory_mib, 0: MemTotal less a reserve)"
    );
    // The replica host starts after the cluster handle the probe belongs to: the namespace
    // sizes are there once it is.
    let replica_host: Arc<std::sync::OnceLock<Arc<ReplicaHost>>> = Arc::default();
    let replica_host_for_probe = replica_host.clone();
    let last_measured: Arc<tokio::sync::Mutex<Option<(std::time::Instant, MeasuredMemory)>>> = Arc::default();
    let probe: crate::cluster::control::meta::LoadProbe = Arc::new(move || {
        let kernels = kernels.clone();
        let replica_host = replica_host_for_probe.clone();
        let last_measured = last_measured.clone();
        Box::pin(async move {
            let snap = kernels.binder().snapshot();
            let (usage_day, gpu_seconds_today, group_gpu_seconds_today) =
                super::gpu_usage::published(&kernels.binder().usage_today());
            // Memory is measured every few seconds, not at every heartbeat: placement needs
            // no finer, and the load record is rewritten whenever it changes.
            let measured = {
                let mut last = last_measured.lock().await;
                match &*last {
                    Some((at, m)) if at.elapsed() < MEMORY_MEASURE_EVERY => m.clone(),
                    _ => {
                        let m = kernels.memory_bytes().await;
                        *last = Some((std::time::Instant::now(), m.clone()));
                        m
                    }
                }
            };
            let namespace = replica_host.get().map(|r| r.namespace_bytes()).unwrap_or_default();
            let (memory_used_mib, kernel_memory_mib) = memory::report(&measured, &namespace);
            let metrics = kernels.metrics();
            let bytes = |mib: u64| i64::try_from(mib.saturating_mul(1 << 20)).unwrap_or(i64::MAX);
            metrics.host_memory_replicas_bytes.set(i64::try_from(measured.values().sum::<u64>()).unwrap_or(i64::MAX));
            metrics.host_memory_replicas_capacity_bytes.set(bytes(memory_capacity_mib));
            LoadRecord {
                node_id,
                gpus_total: snap.total,
                gpus_committed: snap.committed.saturating_add(snap.idle_held),
                // Idle-held GPUs are taken back for a cell that needs them: a cell could take them
                // now. Fenced ones hold another kernel's memory: no new cell may.
                gpus_idle: snap.total.saturating_sub(snap.committed).saturating_sub(snap.fenced),
                replicas: u32::try_from(kernels.len().await).unwrap_or(u32::MAX),
                subscribed_gpus: snap.requested,
                memory_capacity_mib,
                memory_used_mib,
                kernel_memory_mib,
                usage_day,
                gpu_seconds_today,
                group_gpu_seconds_today,
            }
        })
    });
    let cluster = Cluster::new(settings, store.clone(), probe);
    cluster.start();
    // gpu_hours_per_day counts the other hosts' published GPU time too.
    let other_hosts = Arc::new(super::gpu_usage::PublishedUsage::default());
    binder.set_other_hosts(other_hosts.clone());
    let reading_usage = super::gpu_usage::start(cluster.clone(), node_id, other_hosts);
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
    let _ = replica_host.set(replicas.clone());
    let supervisor = Supervisor::start(cluster.clone(), replicas.clone());
    let autoscaler = match config.autoscale.provider {
        AutoscaleProvider::None => None,
        AutoscaleProvider::Exec => {
            let a = &config.autoscale;
            tracing::info!(command = ?a.command, rule = ?a.rule, min = a.min_hosts, max = a.max_hosts, "autoscaling through an exec provider");
            let provider = Arc::new(ExecProvider::new(a.command.clone(), a.command_timeout));
            Some(crate::cluster::control::autoscale::start(cluster.clone(), a.clone(), provider))
        }
    };
    Ok(ClusterNode { cluster, replicas, supervisor, autoscaler, collector, collecting, reading_usage })
}

/// Bytes of host memory each kernel uses, by kernel id.
type MeasuredMemory = std::collections::BTreeMap<String, u64>;

/// How often a host measures its kernels' memory for its load record.
const MEMORY_MEASURE_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// The cluster side of a node.
pub(super) struct ClusterNode {
    pub(super) cluster: Arc<Cluster>,
    pub(super) replicas: Arc<crate::cluster::cells::replica_host::ReplicaHost>,
    supervisor: tokio::task::JoinHandle<()>,
    /// The autoscaler, when `[autoscale]` names a provider (it acts while this host leads).
    autoscaler: Option<tokio::task::JoinHandle<()>>,
    /// The large-object store's collector (it acts while this host leads).
    pub(super) collector: Arc<crate::cluster::cells::object_collector::Collector>,
    /// Its periodic task, unless `cluster.object_gc_interval` is 0.
    collecting: Option<tokio::task::JoinHandle<()>>,
    /// Reads the other hosts' GPU time today ([`super::gpu_usage`]).
    reading_usage: tokio::task::JoinHandle<()>,
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

impl ClusterNode {
    /// Leaves the cluster: stops this host's tasks, then its membership (the heartbeat
    /// first, so the other hosts see this one down at once).
    pub(super) async fn shutdown(&self) {
        self.supervisor.abort();
        self.reading_usage.abort();
        if let Some(a) = &self.autoscaler {
            a.abort();
        }
        if let Some(t) = &self.collecting {
            t.abort();
        }
        self.cluster.shutdown().await;
    }
}
