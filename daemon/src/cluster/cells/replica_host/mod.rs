//! The replica-host side of a cell (F-cluster step 4): this host's replicas, and what
//! each does with the election requests of a front-end.
//!
//! The front-end sends each live replica host the client's `execute_request` with
//! `metadata.nbos_election = {"cell", "round", "role": "lead"|"yield", "expected"}`
//! over its internal WebSocket (`/internal/v1/replicas/{id}/channels`). `gateway/cell.rs` hands such a
//! request to [`ReplicaHost::handle_execute`] ([`election_answer`]) before the single-host path:
//!
//! - `yield`: a best-effort `yield/…` note; nothing is sent back.
//! - `lead`: LEAD if the local binder can commit the cell's GPUs now (and the local
//!   namespace follows the group), else YIELD, by swap of `elect/{cell}`
//!   ([`super::election::propose`]). Unless it won, the front-end gets an `execute_reply`
//!   whose `metadata.nbos_election.outcome` is `yielded`, `taken` or `stale` (with
//!   `record`), or `error` (with `reason`: no such local replica, bad metadata, store
//!   failure) — the front-end swallows those.
//! - won: wait until the local replica applied the group's latest cell, run the cell
//!   through the single-host path (binder → lease → ipykernel; IOPub flows to the
//!   front-end as usual), hold ipykernel's `execute_reply`, export and commit the
//!   namespace ([`state_sync::export_and_commit`]), warn about unpicklable names with a
//!   `stream` message, and only then release the reply with
//!   `metadata.nbos_election = {"outcome": "executed", "replica", "node_id", "revision",
//!   "dispatched_unix_us", "gpus_bound_unix_us"}`: when the `execute_request` was written to
//!   the kernel's shell socket, and (kernels with GPUs) when binding committed its GPUs
//!   before that (absent when the cell never reached the kernel).
//!
//! One file per idea:
//! - this one: [`ReplicaHost`], this host's replicas (attach, detach, status);
//! - [`replica`]: one replica, and what runs on it;
//! - [`election_answer`]: a front-end's election request answered (LEAD or YIELD);
//! - [`won_cell`]: the won-cell sequence as a pure state machine, which
//!   [`won_cell_driver`] runs (catch-up, kernel, namespace export, reply);
//! - [`outcome_reply`]: the `execute_reply` that carries an election outcome.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use raft_store::RaftStore;
use serde::{Deserialize, Serialize};

mod election_answer;
mod outcome_reply;
mod replica;
mod won_cell;
mod won_cell_driver;

pub use election_answer::{election_request, ElectionRequest, Handled, Role};
pub use replica::Replica;

use super::election::Proposer;
use super::objects::Objects;
use super::state_sync::{self, Applier, NsCell, SyncConfig};
use super::sync_metrics::SyncMetrics;
use crate::cluster::control::records::keys;
use crate::kernel::{Kernels, LocalKernel};

/// One row of `GET /api/v1/cluster/replicas`: a replica hosted here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaStatus {
    /// Kernel id.
    pub kernel_id: String,
    /// Replica number.
    pub replica: u32,
    /// This host.
    pub node_id: u64,
    /// The kernel's raft group.
    pub group: u64,
    /// This node's raft role in the group (`leader`, `follower`, …; `unknown` if unreadable).
    pub raft_role: String,
    /// `executor` when this replica ran the group's last synchronised cell, else `standby`.
    pub role: String,
    /// The last group revision the replica's namespace reflects.
    pub applied_revision: u64,
    /// Revision of the last synchronised cell this node has in its log.
    pub latest_revision: u64,
    /// Cells' worth of revisions the namespace is behind (`latest - applied`, 0 when caught up).
    pub lag_revisions: u64,
    /// Why the namespace stopped following the group, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broken: Option<String>,
}

/// The replica-host role of this daemon: its local replicas of cluster kernels.
pub struct ReplicaHost {
    node_id: u64,
    store: RaftStore,
    kernels: Arc<Kernels>,
    objects: Objects,
    sync: SyncConfig,
    sync_metrics: SyncMetrics,
    replicas: Mutex<HashMap<String, Arc<Replica>>>,
}

impl std::fmt::Debug for ReplicaHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaHost").field("node_id", &self.node_id).finish()
    }
}

impl ReplicaHost {
    /// The replica host of node `node_id`.
    pub fn new(node_id: u64, store: RaftStore, kernels: Arc<Kernels>, objects: Objects, sync: SyncConfig) -> Self {
        let sync_metrics = SyncMetrics::default();
        Self { node_id, store, kernels, objects, sync, sync_metrics, replicas: Mutex::new(HashMap::new()) }
    }

    /// Namespace sync metrics of this host.
    pub fn sync_metrics(&self) -> &SyncMetrics {
        &self.sync_metrics
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Replica>>> {
        self.replicas.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// This host's node id.
    pub fn node_id(&self) -> u64 {
        self.node_id
    }

    /// The raft store.
    pub fn store(&self) -> &RaftStore {
        &self.store
    }

    /// The large-object store.
    pub fn objects(&self) -> &Objects {
        &self.objects
    }

    /// Namespace sync settings.
    pub fn sync_config(&self) -> &SyncConfig {
        &self.sync
    }

    /// The local kernels.
    pub fn kernels(&self) -> &Arc<Kernels> {
        &self.kernels
    }

    /// Starts following `kernel`'s group as replica `replica` and registers it here.
    pub fn attach(&self, kernel: Arc<LocalKernel>, replica: u32, group: u64) -> Arc<Replica> {
        let me = Proposer { replica, node_id: self.node_id };
        let applier = Applier::start(
            kernel.clone(),
            self.store.clone(),
            self.store.kv(group),
            self.objects.clone(),
            self.sync.clone(),
            me,
            self.sync_metrics.clone(),
        );
        let local = Arc::new(Replica::new(kernel.id.clone(), replica, group, applier));
        self.lock().insert(kernel.id.clone(), local.clone());
        local
    }

    /// Forgets a local replica (its applier stops).
    pub fn detach(&self, kernel_id: &str) -> Option<Arc<Replica>> {
        self.lock().remove(kernel_id)
    }

    /// Flags the local replica of `kernel_id` as moving away (it yields every cell) or not.
    pub fn set_moving_out(&self, kernel_id: &str, moving: bool) {
        if let Some(local) = self.replica(kernel_id) {
            local.moving_out.store(moving, Ordering::SeqCst);
        }
    }

    /// True unless the local replica of `kernel_id` is deciding or running a cell.
    pub fn is_idle(&self, kernel_id: &str) -> bool {
        self.replica(kernel_id).is_none_or(|local| local.busy.load(Ordering::SeqCst) == 0)
    }

    /// The local replica of `kernel_id`, if this host has one.
    pub fn replica(&self, kernel_id: &str) -> Option<Arc<Replica>> {
        self.lock().get(kernel_id).cloned()
    }

    /// After every replica of `kernel_id` restarted: empties the group's namespace (see
    /// [`state_sync::reset_namespace`]). Call once, from the host that ran the restart, with a
    /// local replica of the kernel. Returns the revision the replicas converge to.
    pub async fn reset_namespace(&self, kernel_id: &str) -> anyhow::Result<u64> {
        let local = self
            .replica(kernel_id)
            .ok_or_else(|| anyhow::anyhow!("host {} has no replica of kernel {kernel_id}", self.node_id))?;
        state_sync::reset_namespace(&self.store.kv(local.group), self.node_id, local.applier.last_cell().as_ref()).await
    }

    /// Each local replica's namespace size as state sync knows it, bytes, by kernel id: a
    /// floor on the memory a replica of the kernel needs on a new host.
    pub fn namespace_bytes(&self) -> std::collections::BTreeMap<String, u64> {
        self.lock().iter().map(|(id, r)| (id.clone(), r.applier.namespace_bytes())).collect()
    }

    /// The replicas hosted here (`GET /api/v1/cluster/replicas`).
    pub async fn replicas(&self) -> Vec<ReplicaStatus> {
        let all: Vec<Arc<Replica>> = self.lock().values().cloned().collect();
        let mut out = Vec::with_capacity(all.len());
        for r in all {
            let raft_role = match self.store.status(r.group).await {
                Ok(s) => s.role,
                Err(_) => "unknown".to_owned(),
            };
            let latest = self
                .store
                .kv(r.group)
                .get_stale(keys::NS_CELL.as_bytes())
                .await
                .ok()
                .and_then(|o| o.kvs.into_iter().next());
            let latest_revision = latest.as_ref().map_or(0, |kv| kv.mod_revision);
            let last_cell: Option<NsCell> =
                latest.and_then(|kv| crate::cluster::control::records::decode(&kv.key, &kv.value).ok());
            let executor = last_cell.is_some_and(|c| c.replica == r.replica && c.node_id == self.node_id);
            let applied = r.applier.applied();
            out.push(ReplicaStatus {
                kernel_id: r.kernel_id.clone(),
                replica: r.replica,
                node_id: self.node_id,
                group: r.group,
                raft_role,
                role: if executor { "executor" } else { "standby" }.to_owned(),
                applied_revision: applied,
                latest_revision,
                lag_revisions: latest_revision.saturating_sub(applied),
                broken: r.applier.broken(),
            });
        }
        out.sort_by(|a, b| a.kernel_id.cmp(&b.kernel_id));
        out
    }
}
