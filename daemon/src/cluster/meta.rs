//! The [`Cluster`] handle: this host's view of the meta group (hosts, loads, kernels,
//! readiness) and the cluster decisions the meta leader takes (placement, re-placement).
//!
//! Reads are served from this host's replica of the meta group (`*_stale`): the meta
//! leader's own state is current, a follower's trails by at most a heartbeat, and every
//! decision that must be exact (placing a kernel, replacing a replica) runs on the leader
//! and commits by compare-and-swap. A call that must run on the leader and finds another
//! host leading is forwarded to that host's HTTP API (`/api/v1/cluster/...`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::future::BoxFuture;
use raft_store::{Kv, LeaseId, Membership, MembershipChange, RaftStore, WatchEventKind};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::records::{self, keys, GpuRecord, HostRecord, KernelRecord, LoadRecord, ReplicaRecord, META_GROUP};
use crate::sched::placement::{self, HostLoad, PlacementError};

/// Prefix of the durable raft addresses of members (`peers/{node:020}`), written when a
/// host joins so that every host can reach it even while its `hosts/` record is gone.
pub const PEERS: &str = "peers/";

/// `peers/{node:020}`.
pub fn peer_key(node_id: u64) -> String {
    format!("{PEERS}{node_id:020}")
}

/// A member's raft address (`peers/…`), and the body of `POST /api/v1/cluster/members`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerRecord {
    /// Raft node id.
    pub node_id: u64,
    /// Raft transport address.
    pub raft_addr: SocketAddr,
}

/// What a client asks for when it creates a kernel (`POST /api/v1/cluster/kernels`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelSpec {
    /// Kernel id; `None` lets the leader pick a UUID.
    #[serde(default)]
    pub id: Option<String>,
    /// Kernelspec name.
    pub name: String,
    /// GPUs each cell needs.
    #[serde(default)]
    pub gpus: u32,
    /// Environment (already filtered by the gateway).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// A change under `kernels/`, as [`Cluster::watch_kernels`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelEvent {
    /// The kernel exists with this record (created, re-placed, or present when the watch started).
    Put(KernelRecord),
    /// The kernel was deleted.
    Delete(String),
}

/// Why a cluster call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The raft store refused or failed.
    #[error("meta store: {0}")]
    Store(#[from] raft_store::Error),
    /// The kernel cannot be placed.
    #[error("cannot place the kernel: {0}")]
    Placement(#[from] PlacementError),
    /// The meta group has no leader (yet), or the leader cannot be reached.
    #[error("the cluster is not ready: {0}")]
    NotReady(String),
    /// This host is not the meta leader (a forwarded call arrived at a former leader).
    #[error("host {me} is not the meta leader (leader: {leader:?})")]
    NotLeader {
        /// This host.
        me: u64,
        /// The leader this host believes in.
        leader: Option<u64>,
    },
    /// No such kernel.
    #[error("no kernel {0} in the cluster")]
    NoSuchKernel(String),
    /// The request contradicts the cluster's state.
    #[error("{0}")]
    Conflict(String),
    /// The request is malformed.
    #[error("{0}")]
    BadRequest(String),
    /// Another host answered a forwarded call with an error.
    #[error("host at {url} answered HTTP {status}: {message}")]
    Remote {
        /// The host's URL.
        url: String,
        /// HTTP status.
        status: u16,
        /// Its error message.
        message: String,
    },
}

/// Result of cluster calls.
pub type Result<T, E = ClusterError> = std::result::Result<T, E>;

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

/// One member as `nbos cluster status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberStatus {
    /// Raft node id.
    pub node_id: u64,
    /// "voter", "learner", or "none" (a host record without meta membership).
    pub role: String,
    /// Its heartbeat record is present.
    pub up: bool,
    /// Its host record, while up.
    pub host: Option<HostRecord>,
    /// Its load, while up.
    pub load: Option<LoadRecord>,
}

/// `GET /api/v1/cluster/status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// The host answering.
    pub node_id: u64,
    /// Its raft address (what `nbos cluster join` hands to a member).
    pub raft_addr: SocketAddr,
    /// Its HTTP API as other hosts reach it.
    pub gateway_url: String,
    /// The meta group has a leader (kernels can be created, hosts can register).
    pub ready: bool,
    /// The meta leader as this host knows it.
    pub meta_leader: Option<u64>,
    /// Raft term of the meta group.
    pub term: u64,
    /// This host's heartbeat lease is held (its `hosts/` record is live).
    pub registered: bool,
    /// Members (voters, learners, and hosts with records), by node id.
    pub members: Vec<MemberStatus>,
    /// Kernels in the cluster.
    pub kernels: usize,
}

/// What `nbos cluster leave` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaveReport {
    /// The host that left.
    pub node_id: u64,
    /// Kernels whose replica on this host was re-placed: (kernel, new host).
    pub moved: Vec<(String, u64)>,
    /// Meta membership after the removal.
    pub membership: Membership,
}

/// The cluster as one host sees it. Cheap to share (`Arc<Cluster>`).
pub struct Cluster {
    settings: ClusterSettings,
    store: RaftStore,
    meta: Kv,
    load_probe: LoadProbe,
    pub(super) state: Mutex<HostState>,
    /// Placement and re-placement on the leader run one at a time, so that each sees
    /// the subscriptions the previous one committed.
    placing: tokio::sync::Mutex<()>,
    http: ureq::Agent,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// This host's liveness state, shared with the heartbeat.
#[derive(Debug, Default)]
pub(super) struct HostState {
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

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Cluster {
    /// A handle over an open store. Nothing runs until [`Cluster::start`].
    pub fn new(settings: ClusterSettings, store: RaftStore, load_probe: LoadProbe) -> Arc<Self> {
        let meta = store.kv(META_GROUP);
        let http = ureq::AgentBuilder::new().timeout(Duration::from_secs(10)).build();
        Arc::new(Self {
            settings,
            store,
            meta,
            load_probe,
            state: Mutex::new(HostState::default()),
            placing: tokio::sync::Mutex::new(()),
            http,
            tasks: Mutex::new(Vec::new()),
        })
    }

    /// Starts the background work: meta group bootstrap (or recovery), heartbeat and load
    /// publishing, peer discovery, and re-placement of lost replicas while this host leads.
    /// Returns at once: a cluster without a quorum leaves the host up and not ready.
    pub fn start(self: &Arc<Self>) {
        let this = self.clone();
        let main = tokio::spawn(async move {
            if let Err(e) = this.bootstrap().await {
                tracing::error!(error = %e, "cannot open the meta group; this host stays out of the cluster");
                return;
            }
            let tasks = [
                tokio::spawn(super::membership::heartbeat(this.clone())),
                tokio::spawn(super::membership::learn_peers(this.clone())),
                tokio::spawn(super::membership::replace_lost_replicas(this.clone())),
            ];
            if let Ok(mut t) = this.tasks.lock() {
                t.extend(tasks);
            }
        });
        if let Ok(mut t) = self.tasks.lock() {
            t.push(main);
        }
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
    async fn bootstrap(&self) -> Result<()> {
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

    /// Every kernel record now, then each change under `kernels/` in commit order. When the
    /// underlying watch ends (fell behind, snapshot installed) it resynchronises from a full
    /// read: `Put` for every record, `Delete` for every kernel that vanished meanwhile.
    pub async fn watch_kernels(self: &Arc<Self>) -> Result<mpsc::Receiver<KernelEvent>> {
        let (tx, rx) = mpsc::channel(256);
        // The first read happens here so that a caller sees errors (no meta group) at once.
        let first = self.meta.range_stale(keys::KERNELS, 0).await?;
        let this = self.clone();
        let task = tokio::spawn(async move {
            let mut known: BTreeSet<String> = BTreeSet::new();
            let mut snapshot = Some(first);
            loop {
                let out = match snapshot.take() {
                    Some(s) => s,
                    None => match this.meta.range_stale(keys::KERNELS, 0).await {
                        Ok(s) => s,
                        Err(e) => {
                            tracing::warn!(error = %e, "kernel watch: cannot read kernels/; retrying");
                            tokio::time::sleep(Duration::from_millis(500)).await;
                            continue;
                        }
                    },
                };
                let mut now: BTreeSet<String> = BTreeSet::new();
                for kv in &out.kvs {
                    match records::decode::<KernelRecord>(&kv.key, &kv.value) {
                        Ok(r) => {
                            now.insert(r.id.clone());
                            if tx.send(KernelEvent::Put(r)).await.is_err() {
                                return;
                            }
                        }
                        Err(e) => tracing::warn!(error = %e, "kernel watch: skipping a record"),
                    }
                }
                for gone in known.difference(&now) {
                    if tx.send(KernelEvent::Delete(gone.clone())).await.is_err() {
                        return;
                    }
                }
                known = now;
                let mut watch = match this.meta.watch(keys::KERNELS, out.applied_index + 1).await {
                    Ok(w) => w,
                    Err(e) => {
                        tracing::debug!(error = %e, "kernel watch: re-reading kernels/");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                while let Some(ev) = watch.next().await {
                    let id = String::from_utf8_lossy(&ev.key[keys::KERNELS.len().min(ev.key.len())..]).into_owned();
                    let event = match (ev.kind, ev.value) {
                        (WatchEventKind::Put, Some(v)) => match records::decode::<KernelRecord>(&ev.key, &v) {
                            Ok(r) => {
                                known.insert(r.id.clone());
                                KernelEvent::Put(r)
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "kernel watch: skipping a record");
                                continue;
                            }
                        },
                        _ => {
                            known.remove(&id);
                            KernelEvent::Delete(id)
                        }
                    };
                    if tx.send(event).await.is_err() {
                        return;
                    }
                }
            }
        });
        if let Ok(mut t) = self.tasks.lock() {
            t.retain(|t| !t.is_finished());
            t.push(task);
        }
        Ok(rx)
    }

    /// Hosts as placement sees them: live hosts with the subscriptions the kernel records place on them.
    async fn host_loads(&self) -> Result<Vec<HostLoad>> {
        let hosts = self.hosts().await?;
        let kernels = self.kernels().await?;
        Ok(hosts
            .iter()
            .map(|h| {
                let mine = kernels.iter().filter(|k| k.replicas.iter().any(|r| r.node_id == h.node_id));
                let (mut subscribed, mut replicas) = (0u32, 0u32);
                for k in mine {
                    subscribed = subscribed.saturating_add(k.gpus);
                    replicas = replicas.saturating_add(1);
                }
                HostLoad {
                    node_id: h.node_id,
                    gpus_total: u32::try_from(h.gpus.len()).unwrap_or(u32::MAX),
                    subscribed_gpus: subscribed,
                    replicas,
                }
            })
            .collect())
    }

    /// Creates a kernel: places its replicas on `replicas` distinct live hosts (on the meta
    /// leader, forwarded there when this host is not it) and commits its record.
    pub async fn create_kernel(&self, spec: KernelSpec) -> Result<KernelRecord> {
        if spec.name.is_empty() {
            return Err(ClusterError::BadRequest("a kernel needs a kernelspec name".into()));
        }
        self.on_leader(HttpMethod::Post, "/api/v1/cluster/kernels", Some(&spec), || {
            self.create_kernel_here(spec.clone())
        })
        .await
    }

    /// [`Cluster::create_kernel`] on this host, which must be the meta leader.
    pub async fn create_kernel_here(&self, spec: KernelSpec) -> Result<KernelRecord> {
        self.require_leader().await?;
        let _placing = self.placing.lock().await;
        let hosts = self.host_loads().await?;
        let chosen = placement::place(
            &hosts,
            spec.gpus,
            usize::try_from(self.settings.replicas).unwrap_or(usize::MAX),
            self.settings.subscription_ratio,
        )?;
        let id = spec.id.clone().unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        if id.is_empty() || id.contains('/') {
            return Err(ClusterError::BadRequest(format!("kernel id {id:?} must be non-empty and contain no '/'")));
        }
        let record = KernelRecord {
            group: records::kernel_group_id(&id),
            id: id.clone(),
            name: spec.name,
            gpus: spec.gpus,
            replicas: chosen.iter().zip(1u32..).map(|(&node_id, replica)| ReplicaRecord { replica, node_id }).collect(),
            created_ms: now_ms(),
            env: spec.env,
        };
        let out = self.meta.cas(keys::kernel(&id), None, records::encode(&record)).await?;
        if !out.succeeded {
            return Err(ClusterError::Conflict(format!("kernel {id} already exists")));
        }
        tracing::info!(kernel = %id, hosts = ?chosen, gpus = record.gpus, "kernel placed");
        Ok(record)
    }

    /// Deletes a kernel's record (its replicas' hosts stop them); true when it existed.
    pub async fn delete_kernel(&self, id: &str) -> Result<bool> {
        let path = format!("/api/v1/cluster/kernels/{id}");
        let deleted: serde_json::Value = self
            .on_leader(HttpMethod::Delete, &path, None::<&()>, || async {
                let existed = self.meta.delete(keys::kernel(id)).await?;
                Ok(serde_json::json!({ "deleted": existed }))
            })
            .await?;
        Ok(deleted.get("deleted").and_then(serde_json::Value::as_bool).unwrap_or(false))
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

    /// Re-places the replica of `kernel` on `dead_node` on a live host that does not hold the
    /// kernel yet (new replica number). Runs on the meta leader (forwarded when needed).
    /// Returns the new record, the record unchanged when `dead_node` holds no replica of it,
    /// and `None` when no host can take the replica now.
    pub async fn replace_replica(&self, kernel: &str, dead_node: u64) -> Result<Option<KernelRecord>> {
        let path = format!("/api/v1/cluster/kernels/{kernel}/replace");
        let body = serde_json::json!({ "node_id": dead_node });
        self.on_leader(HttpMethod::Post, &path, Some(&body), || self.replace_replica_here(kernel, dead_node)).await
    }

    /// [`Cluster::replace_replica`] on this host, which must be the meta leader.
    pub async fn replace_replica_here(&self, kernel: &str, dead_node: u64) -> Result<Option<KernelRecord>> {
        self.require_leader().await?;
        let _placing = self.placing.lock().await;
        for _ in 0..5 {
            let out = self.meta.get_stale(keys::kernel(kernel)).await?;
            let Some(kv) = out.kvs.first() else { return Err(ClusterError::NoSuchKernel(kernel.to_owned())) };
            let record: KernelRecord =
                records::decode(&kv.key, &kv.value).map_err(|e| ClusterError::Conflict(e.to_string()))?;
            if !record.replicas.iter().any(|r| r.node_id == dead_node) {
                return Ok(Some(record));
            }
            let exclude: Vec<u64> = record.replicas.iter().map(|r| r.node_id).collect();
            let hosts = self.host_loads().await?;
            let Some(new_node) = placement::replace(&hosts, record.gpus, self.settings.subscription_ratio, &exclude)
            else {
                return Ok(None);
            };
            let next = record.replicas.iter().map(|r| r.replica).max().unwrap_or(0) + 1;
            let mut new = record.clone();
            for r in &mut new.replicas {
                if r.node_id == dead_node {
                    *r = ReplicaRecord { replica: next, node_id: new_node };
                }
            }
            let cas = self.meta.cas(keys::kernel(kernel), Some(kv.value.clone()), records::encode(&new)).await?;
            if cas.succeeded {
                tracing::info!(kernel, dead_node, new_node, replica = next, "replica re-placed");
                return Ok(Some(new));
            }
        }
        Err(ClusterError::Conflict(format!("kernel {kernel}: its record kept changing; try again")))
    }

    /// Adds a host to the meta group (learner, then voter). Runs on the meta leader.
    pub async fn add_member(&self, peer: PeerRecord) -> Result<Membership> {
        if peer.node_id == 0 {
            return Err(ClusterError::BadRequest("node id must be non-zero".into()));
        }
        self.store.add_peer(peer.node_id, peer.raft_addr);
        self.on_leader(HttpMethod::Post, "/api/v1/cluster/members", Some(&peer), || self.add_member_here(peer.clone()))
            .await
    }

    /// [`Cluster::add_member`] on this host, which must be the meta leader.
    pub async fn add_member_here(&self, peer: PeerRecord) -> Result<Membership> {
        self.require_leader().await?;
        self.store.add_peer(peer.node_id, peer.raft_addr);
        self.meta.put(peer_key(peer.node_id), serde_json::to_vec(&peer).unwrap_or_default()).await?;
        let status = self.store.status(META_GROUP).await?;
        if status.membership.voters.contains(&peer.node_id) {
            return Ok(status.membership);
        }
        if !status.membership.learners.contains(&peer.node_id) {
            self.store.change_membership(META_GROUP, &[MembershipChange::AddLearner(peer.node_id)]).await?;
        }
        // Give the learner a moment to receive the log before it counts in the quorum.
        let deadline = Instant::now() + self.settings.host_ttl;
        while Instant::now() < deadline {
            let st = self.store.status(META_GROUP).await?;
            if st.commit == st.applied {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let m = self.store.change_membership(META_GROUP, &[MembershipChange::AddVoter(peer.node_id)]).await?;
        tracing::info!(node = peer.node_id, addr = %peer.raft_addr, voters = ?m.voters, "host joined the meta group");
        Ok(m)
    }

    /// Removes a host from the meta group. Runs on the meta leader.
    pub async fn remove_member(&self, node_id: u64) -> Result<Membership> {
        let path = format!("/api/v1/cluster/members/{node_id}");
        self.on_leader(HttpMethod::Delete, &path, None::<&()>, || self.remove_member_here(node_id)).await
    }

    /// [`Cluster::remove_member`] on this host, which must be the meta leader.
    pub async fn remove_member_here(&self, node_id: u64) -> Result<Membership> {
        self.require_leader().await?;
        let status = self.store.status(META_GROUP).await?;
        let m = &status.membership;
        if !m.voters.contains(&node_id) && !m.learners.contains(&node_id) {
            return Ok(status.membership);
        }
        if m.voters == [node_id] {
            return Err(ClusterError::Conflict(format!("host {node_id} is the last meta voter; it cannot leave")));
        }
        let m = self.store.change_membership(META_GROUP, &[MembershipChange::Remove(node_id)]).await?;
        if let Err(e) = self.meta.delete(peer_key(node_id)).await {
            tracing::warn!(node = node_id, error = %e, "could not delete the peer record of a removed host");
        }
        tracing::info!(node = node_id, voters = ?m.voters, "host removed from the meta group");
        Ok(m)
    }

    /// This host leaves the cluster: [`Cluster::drain`], then [`Cluster::remove_self`].
    pub async fn leave(&self) -> Result<LeaveReport> {
        let moved = self.drain().await?;
        let mut report = self.remove_self().await?;
        report.moved = moved;
        Ok(report)
    }

    /// Moves every replica on this host to another host (the meta leader re-places each).
    /// Refused, with nothing changed, when a replica cannot be re-placed (checked before
    /// anything moves; should the leader still find no host for one, the moves already made
    /// stay). The host stays a member. Returns (kernel, new host) per moved replica.
    pub async fn drain(&self) -> Result<Vec<(String, u64)>> {
        let me = self.settings.node_id;
        let mine: Vec<KernelRecord> =
            self.kernels().await?.into_iter().filter(|k| k.replicas.iter().any(|r| r.node_id == me)).collect();
        // Check first that every replica has somewhere to go (this host's view; the leader
        // decides each move for real), so that a refusal leaves everything where it was.
        let mut hosts: Vec<HostLoad> = self.host_loads().await?.into_iter().filter(|h| h.node_id != me).collect();
        for k in &mine {
            let exclude: Vec<u64> = k.replicas.iter().map(|r| r.node_id).collect();
            let Some(to) = placement::replace(&hosts, k.gpus, self.settings.subscription_ratio, &exclude) else {
                return Err(ClusterError::Conflict(format!(
                    "host {me} cannot leave: no other live host can take its replica of kernel {} \
                     (every live host already holds it or has no room); nothing was changed",
                    k.id
                )));
            };
            if let Some(h) = hosts.iter_mut().find(|h| h.node_id == to) {
                h.subscribed_gpus = h.subscribed_gpus.saturating_add(k.gpus);
                h.replicas = h.replicas.saturating_add(1);
            }
        }
        let mut moved = Vec::new();
        for k in &mine {
            match self.replace_replica(&k.id, me).await? {
                Some(new) => {
                    let to = new
                        .replicas
                        .iter()
                        .map(|r| r.node_id)
                        .find(|n| !k.replicas.iter().any(|r| r.node_id == *n))
                        .unwrap_or(0);
                    moved.push((k.id.clone(), to));
                }
                None => {
                    return Err(ClusterError::Conflict(format!(
                        "host {me} cannot leave: no live host took its replica of kernel {}; still a member \
                         (replicas already moved: {moved:?})",
                        k.id
                    )));
                }
            }
        }
        Ok(moved)
    }

    /// Removes this host from the meta group and stops its heartbeat. Refused while a
    /// kernel record still places a replica here ([`Cluster::drain`] first).
    pub async fn remove_self(&self) -> Result<LeaveReport> {
        let me = self.settings.node_id;
        if let Some(k) = self.kernels().await?.iter().find(|k| k.replicas.iter().any(|r| r.node_id == me)) {
            return Err(ClusterError::Conflict(format!(
                "host {me} still holds a replica of kernel {}: drain it first (nbos cluster leave does)",
                k.id
            )));
        }
        let membership = self.remove_member(me).await?;
        let lease = self.state.lock().ok().and_then(|mut s| {
            s.left = true;
            s.lease.take()
        });
        if let Some(l) = lease {
            if let Err(e) = self.meta.lease_revoke(l).await {
                tracing::debug!(error = %e, "could not revoke the host lease after leaving");
            }
        }
        Ok(LeaveReport { node_id: me, moved: Vec::new(), membership })
    }

    /// The cluster as this host sees it.
    pub async fn status(&self) -> Result<ClusterStatus> {
        let st = match self.store.status(META_GROUP).await {
            Ok(st) => st,
            // Still opening the meta group (the first moments after start): not ready, no members.
            Err(raft_store::Error::GroupNotFound(_)) => raft_store::GroupStatus {
                group: META_GROUP,
                node: self.settings.node_id,
                role: "none".to_owned(),
                leader: None,
                term: 0,
                commit: 0,
                applied: 0,
                last_index: 0,
                snapshot_index: 0,
                membership: Membership::default(),
                hibernating: false,
            },
            Err(e) => return Err(e.into()),
        };
        let hosts = self.hosts().await.unwrap_or_default();
        let loads = self.loads().await.unwrap_or_default();
        let kernels = self.kernels().await.map(|k| k.len()).unwrap_or(0);
        let mut ids: BTreeSet<u64> = st.membership.voters.iter().chain(&st.membership.learners).copied().collect();
        ids.extend(hosts.iter().map(|h| h.node_id));
        let hosts: HashMap<u64, HostRecord> = hosts.into_iter().map(|h| (h.node_id, h)).collect();
        let loads: HashMap<u64, LoadRecord> = loads.into_iter().map(|l| (l.node_id, l)).collect();
        let members = ids
            .into_iter()
            .map(|id| MemberStatus {
                node_id: id,
                role: if st.membership.voters.contains(&id) {
                    "voter"
                } else if st.membership.learners.contains(&id) {
                    "learner"
                } else {
                    "none"
                }
                .to_owned(),
                up: hosts.contains_key(&id),
                host: hosts.get(&id).cloned(),
                load: loads.get(&id).cloned(),
            })
            .collect();
        Ok(ClusterStatus {
            node_id: self.settings.node_id,
            raft_addr: self.settings.raft_addr,
            gateway_url: self.settings.gateway_url.clone(),
            ready: st.leader.is_some(),
            meta_leader: st.leader,
            term: st.term,
            registered: self.host_lease().is_some(),
            members,
            kernels,
        })
    }

    async fn require_leader(&self) -> Result<()> {
        let leader = self.meta_leader().await;
        if leader == Some(self.settings.node_id) {
            Ok(())
        } else {
            Err(ClusterError::NotLeader { me: self.settings.node_id, leader })
        }
    }

    /// Runs `local` when this host leads the meta group, else sends the request to the
    /// leader's HTTP API. Retries while there is no leader, or it changes, for up to two
    /// election timeouts.
    async fn on_leader<B, T, F, Fut>(&self, method: HttpMethod, path: &str, body: Option<&B>, local: F) -> Result<T>
    where
        B: Serialize + ?Sized,
        T: serde::de::DeserializeOwned,
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let deadline = Instant::now() + self.store.config().election_timeout() * 3;
        loop {
            let outcome = match self.meta_leader().await {
                Some(l) if l == self.settings.node_id => local().await,
                Some(l) => match self.host(l).await? {
                    Some(h) => self.forward(method, &h.gateway_url, path, body).await,
                    None => Err(ClusterError::NotReady(format!("the meta leader (host {l}) has no host record yet"))),
                },
                None => Err(ClusterError::NotReady("the meta group has no leader".into())),
            };
            match outcome {
                Err(e @ (ClusterError::NotReady(_) | ClusterError::NotLeader { .. })) if Instant::now() < deadline => {
                    tracing::debug!(error = %e, path, "waiting for the meta leader");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(ClusterError::Remote { status: 503, .. }) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => return other,
            }
        }
    }

    /// One HTTP call to another host's cluster API.
    async fn forward<B, T>(&self, method: HttpMethod, base: &str, path: &str, body: Option<&B>) -> Result<T>
    where
        B: Serialize + ?Sized,
        T: serde::de::DeserializeOwned,
    {
        let url = format!("{}{path}", base.trim_end_matches('/'));
        let body = body.map(serde_json::to_string).transpose().map_err(|e| ClusterError::BadRequest(e.to_string()))?;
        let agent = self.http.clone();
        let token = self.settings.token.clone();
        let base = base.to_owned();
        let res = tokio::task::spawn_blocking(move || {
            let mut req = agent.request(method.as_str(), &url).set(super::http::FORWARDED_HEADER, "1");
            if let Some(t) = &token {
                req = req.set("Authorization", &format!("token {t}"));
            }
            let res = match body {
                Some(b) => req.set("Content-Type", "application/json").send_string(&b),
                None => req.call(),
            };
            match res {
                Ok(r) => {
                    r.into_string().map_err(|e| ClusterError::NotReady(format!("reading the answer of {url}: {e}")))
                }
                Err(ureq::Error::Status(status, r)) => {
                    let text = r.into_string().unwrap_or_default();
                    let message = serde_json::from_str::<serde_json::Value>(&text)
                        .ok()
                        .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned))
                        .unwrap_or(text);
                    Err(ClusterError::Remote { url: base, status, message })
                }
                Err(e) => Err(ClusterError::NotReady(format!("cannot reach {url}: {e}"))),
            }
        })
        .await
        .map_err(|e| ClusterError::NotReady(format!("forwarding task failed: {e}")))??;
        serde_json::from_str(&res).map_err(|e| ClusterError::Conflict(format!("undecodable answer from {path}: {e}")))
    }
}

/// The HTTP methods forwarded calls use.
#[derive(Debug, Clone, Copy)]
enum HttpMethod {
    Post,
    Delete,
}

impl HttpMethod {
    fn as_str(self) -> &'static str {
        match self {
            HttpMethod::Post => "POST",
            HttpMethod::Delete => "DELETE",
        }
    }
}
