//! The [`Cluster`] handle itself: what this host was configured with, its raft store and
//! the meta group, this host's liveness state, and the reads every other part uses
//! (hosts, loads, kernels, readiness marks). The other files of this folder add the
//! leader's decisions to the same handle.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use raft_store::{Kv, LeaseId, RaftStore};
use tokio::task::JoinHandle;

use super::demand::Demand;
use super::error::{ClusterError, Result};
use crate::cluster::control::elastic_metrics::ElasticMetrics;
use crate::cluster::control::records::{self, keys, GpuRecord, HostRecord, KernelRecord, LoadRecord, META_GROUP};

/// Produces this host's current load (from the local binder and kernel registry).
pub type LoadProbe = Arc<dyn Fn() -> BoxFuture<'static, LoadRecord> + Send + Sync>;

/// Everything the cluster needs to know about this host.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    /// Raft node id.
    pub node_id: u64,
    /// Host name for people.
    pub name: String,
    /// Base URL of this host's HTTP API as other hosts reach it.
    pub gateway_url: String,
    /// Raft transport address (as others reach it).
    pub raft_addr: SocketAddr,
    /// Founding meta voters: node id → raft address.
    pub seeds: BTreeMap<u64, SocketAddr>,
    /// Heartbeat lease TTL.
    pub host_ttl: Duration,
    /// Replicas per kernel.
    pub replicas: u32,
    /// Subscription ratio bound used by placement.
    pub subscription_ratio: f64,
    /// How long creating a kernel waits for a host when placement finds none (the
    /// autoscaler adds hosts; zero without one: refused at once).
    pub placement_wait: Duration,
    /// Namespace objects up to this size go through the raft log.
    pub sync_inline_max_bytes: u64,
    /// Large-object store URL.
    pub object_store: String,
    /// The API token, the same on every host (`None`: loopback dev cluster without tokens).
    pub token: Option<String>,
    /// This host's GPUs.
    pub gpus: Vec<GpuRecord>,
    /// Host memory.
    pub memory_bytes: u64,
}

/// The cluster as one host sees it. Cheap to share (`Arc<Cluster>`).
pub struct Cluster {
    pub(super) settings: ClusterSettings,
    pub(super) store: RaftStore,
    pub(super) meta: Kv,
    load_probe: LoadProbe,
    pub(in crate::cluster) state: Mutex<HostState>,
    /// Placement and re-placement on the leader run one at a time, so that each sees
    /// the subscriptions the previous one committed.
    pub(super) placing: tokio::sync::Mutex<()>,
    /// For calls forwarded to the meta leader.
    pub(super) http: ureq::Agent,
    /// Background work, aborted at shutdown.
    pub(in crate::cluster) tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Replica moves this host began, finished, aborted or found no host for.
    pub(super) moves: ElasticMetrics,
    /// Demand this host (as meta leader) could not meet: what the autoscaler adds.
    pub(super) demand: Demand,
}

/// This host's liveness state, shared with the heartbeat.
#[derive(Debug, Default)]
pub(in crate::cluster) struct HostState {
    /// The host lease, while held.
    pub lease: Option<LeaseId>,
    /// The last load record written.
    pub last_load: Option<LoadRecord>,
    /// Kernels with a ready replica here (re-put when the lease is re-granted).
    pub ready: BTreeSet<String>,
    /// The host left the cluster: no more heartbeats.
    pub left: bool,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("node_id", &self.settings.node_id).finish_non_exhaustive()
    }
}

impl Cluster {
    /// A handle over an open store. Nothing runs until [`Cluster::start`].
    pub fn new(settings: ClusterSettings, store: RaftStore, load_probe: LoadProbe) -> Arc<Self> {
        let meta = store.kv(META_GROUP);
        // TLS with the node certificate when this host has one (see `link::host`).
        let http = crate::link::host::agent(Duration::from_secs(10));
        Arc::new(Self {
            settings,
            store,
            meta,
            load_probe,
            state: Mutex::new(HostState::default()),
            placing: tokio::sync::Mutex::new(()),
            http,
            tasks: Mutex::new(Vec::new()),
            moves: ElasticMetrics::default(),
            demand: Demand::default(),
        })
    }

    /// Stops the background work and ends this host's lease, so that the others see it
    /// down at once instead of after `host_ttl`.
    pub async fn shutdown(&self) {
        let tasks = self.tasks.lock().map(|mut t| std::mem::take(&mut *t)).unwrap_or_default();
        for t in tasks {
            t.abort();
        }
        let lease = self.state.lock().ok().and_then(|mut s| s.lease.take());
        if let Some(l) = lease {
            if let Err(e) = self.meta.lease_revoke(l).await {
                tracing::debug!(error = %e, "could not revoke the host lease at shutdown (it expires by itself)");
            }
        }
    }

    /// Creates the meta group on a host's first start, and recovers it from the log on later
    /// starts (never bootstraps twice). A host outside the seeds is a member only once
    /// `nbos cluster join` added it.
    pub(in crate::cluster) async fn bootstrap(&self) -> Result<()> {
        let me = self.settings.node_id;
        if self.store.groups().await?.contains(&META_GROUP) {
            tracing::info!(node = me, "meta group recovered from the durable log");
            return Ok(());
        }
        let voters: Vec<u64> = self.settings.seeds.keys().copied().collect();
        // A host outside the seeds starts from the very same bootstrap state as the seeds
        // (their voters at the bootstrap index) rather than from an empty replica: the leader
        // then streams it the log from the start, conf changes included, and it becomes a
        // member when it applies its own AddLearner. An empty replica would need a snapshot,
        // and the seeds' only snapshot until the first log compaction is the bootstrap one,
        // which does not name the new host (raft refuses to install it).
        self.store.create_group(META_GROUP, &voters).await?;
        if self.settings.seeds.contains_key(&me) {
            tracing::info!(node = me, ?voters, "meta group created (first start of a seed)");
        } else {
            tracing::info!(node = me, seeds = ?voters, "meta replica created from the seeds' bootstrap state: add this host with `nbos cluster join`");
        }
        Ok(())
    }

    /// This host's raft node id.
    pub fn node_id(&self) -> u64 {
        self.settings.node_id
    }

    /// The embedded raft store (kernel groups live here too).
    pub fn store(&self) -> &RaftStore {
        &self.store
    }

    /// The meta group's key-value API.
    pub fn meta(&self) -> &Kv {
        &self.meta
    }

    /// Demand this host, as meta leader, could not meet (refused kernels, waiting cells).
    pub fn demand(&self) -> &Demand {
        &self.demand
    }

    /// The metrics of replica moves and scaling.
    pub fn elastic_metrics(&self) -> &ElasticMetrics {
        &self.moves
    }

    /// What this host was configured with.
    pub fn settings(&self) -> &ClusterSettings {
        &self.settings
    }

    /// The host lease, while held (records that must vanish with this host attach to it).
    pub fn host_lease(&self) -> Option<LeaseId> {
        self.state.lock().ok().and_then(|s| s.lease)
    }

    /// The meta leader as this host knows it.
    pub async fn meta_leader(&self) -> Option<u64> {
        self.store.status(META_GROUP).await.ok().and_then(|s| s.leader)
    }

    /// True once the meta group has a leader.
    pub async fn is_ready(&self) -> bool {
        self.meta_leader().await.is_some()
    }

    async fn range<T: serde::de::DeserializeOwned>(&self, prefix: &str) -> Result<Vec<T>> {
        let out = self.meta.range_stale(prefix, 0).await?;
        Ok(out
            .kvs
            .iter()
            .filter_map(|kv| match records::decode::<T>(&kv.key, &kv.value) {
                Ok(v) => Some(v),
                Err(e) => {
                    tracing::warn!(error = %e, "skipping an undecodable meta record");
                    None
                }
            })
            .collect())
    }

    /// Live hosts (those whose heartbeat record exists), by node id.
    pub async fn hosts(&self) -> Result<Vec<HostRecord>> {
        self.range(keys::HOSTS).await
    }

    /// One live host's record.
    pub async fn host(&self, node_id: u64) -> Result<Option<HostRecord>> {
        Ok(self.hosts().await?.into_iter().find(|h| h.node_id == node_id))
    }

    /// Live hosts' loads, by node id.
    pub async fn loads(&self) -> Result<Vec<LoadRecord>> {
        self.range(keys::LOAD).await
    }

    /// Every kernel record.
    pub async fn kernels(&self) -> Result<Vec<KernelRecord>> {
        self.range(keys::KERNELS).await
    }

    /// One kernel's record.
    pub async fn kernel(&self, id: &str) -> Result<Option<KernelRecord>> {
        let out = self.meta.get_stale(keys::kernel(id)).await?;
        match out.kvs.first() {
            Some(kv) => {
                Ok(Some(records::decode(&kv.key, &kv.value).map_err(|e| ClusterError::Conflict(e.to_string()))?))
            }
            None => Ok(None),
        }
    }

    /// Marks this host's replica of `kernel` ready (caught up), on the host lease: the mark
    /// vanishes with the host and is re-put when the lease is re-granted.
    pub async fn put_ready(&self, kernel: &str) -> Result<()> {
        let lease = {
            let mut st = self.state.lock().map_err(|_| ClusterError::NotReady("state lock poisoned".into()))?;
            st.ready.insert(kernel.to_owned());
            st.lease
        };
        let Some(lease) = lease else {
            // Put by the heartbeat once the lease is granted.
            return Err(ClusterError::NotReady("this host has no heartbeat lease yet; the mark is put with it".into()));
        };
        self.meta.put_with_lease(keys::ready(kernel, self.settings.node_id), Vec::new(), lease).await?;
        Ok(())
    }

    /// Withdraws this host's ready mark for `kernel` (its replica stopped).
    pub async fn clear_ready(&self, kernel: &str) -> Result<()> {
        if let Ok(mut st) = self.state.lock() {
            st.ready.remove(kernel);
        }
        self.meta.delete(keys::ready(kernel, self.settings.node_id)).await?;
        Ok(())
    }

    /// Hosts whose replica of `kernel` is ready, by node id.
    pub async fn ready_hosts(&self, kernel: &str) -> Result<Vec<u64>> {
        let prefix = format!("{}{kernel}/", keys::READY);
        let out = self.meta.range_stale(prefix.as_bytes().to_vec(), 0).await?;
        Ok(out
            .kvs
            .iter()
            .filter_map(|kv| std::str::from_utf8(&kv.key[prefix.len().min(kv.key.len())..]).ok()?.parse().ok())
            .collect())
    }

    /// Writes this host's load now if it changed since the last write.
    pub async fn publish_load(&self) -> Result<()> {
        let load = (self.load_probe)().await;
        let (lease, changed) = match self.state.lock() {
            Ok(st) => (st.lease, st.last_load.as_ref() != Some(&load)),
            Err(_) => return Ok(()),
        };
        let Some(lease) = lease else { return Ok(()) };
        if !changed {
            return Ok(());
        }
        self.meta.put_with_lease(keys::load(self.settings.node_id), records::encode(&load), lease).await?;
        if let Ok(mut st) = self.state.lock() {
            st.last_load = Some(load);
        }
        Ok(())
    }

    /// This host's load as the probe sees it now.
    pub async fn local_load(&self) -> LoadRecord {
        (self.load_probe)().await
    }
}
