//! The replica-host side of a cell (F-cluster step 4).
//!
//! The front-end sends each live replica host the client's `execute_request` with
//! `metadata.nbos_election = {"cell", "round", "role": "lead"|"yield", "expected"}`
//! over its internal WebSocket (`/internal/v1/replicas/{id}/channels`). `gateway/cell.rs` hands such a
//! request to [`ReplicaHost::handle_execute`] before the single-host path:
//!
//! - `yield`: a best-effort `yield/…` note; nothing is sent back.
//! - `lead`: LEAD if the local binder can commit the cell's GPUs now (and the local
//!   namespace follows the group), else YIELD, by swap of `elect/{cell}`
//!   ([`election::propose`]). Unless it won, the front-end gets an `execute_reply`
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

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use raft_store::RaftStore;
use serde::{Deserialize, Serialize};

use super::election::{self, Decision, Outcome, Proposer};
use super::objects::Objects;
use super::state_sync::{self, Applier, NsCell, SyncConfig};
use super::sync_metrics::{PathLabels, SideLabels, SyncMetrics};
use crate::cluster::control::records::{keys, ElectionRecord, RunningRecord};
use crate::jupyter::{Channel, Message};
use crate::kernel::binding::Dispatch;
use crate::kernel::hub::ClientId;
use crate::kernel::{Kernel, Kernels};

/// How long a won cell waits for the local namespace to catch up before it fails.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);
/// Cells remembered per replica to ignore a duplicated `lead` for a cell already run here.
const REMEMBERED_CELLS: usize = 1024;

/// What [`ReplicaHost::handle_execute`] did with a message.
#[derive(Debug)]
pub enum Handled {
    /// It was an election request; the replica host answers it (or runs the cell).
    Handled,
    /// Not an election request: send it down the single-host path as usual.
    PassThrough(Message),
}

/// `metadata.nbos_election` of a front-end's `execute_request`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ElectionRequest {
    /// The cell (the client's msg_id).
    pub cell: String,
    /// Round, from 0.
    pub round: u32,
    /// `lead` or `yield`.
    pub role: Role,
    /// The last record the front-end knows (`null` in round 0).
    #[serde(default)]
    pub expected: Option<ElectionRecord>,
    /// The kernel's lock as the front-end last saw it, held by a host that is gone: a LEAD
    /// swap may take it over.
    #[serde(default)]
    pub steal: Option<RunningRecord>,
}

/// The front-end's designation for this host in a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Propose LEAD or YIELD.
    Lead,
    /// Do not propose.
    Yield,
}

/// One local replica of a cluster kernel.
pub struct LocalReplica {
    /// Kernel id.
    pub kernel_id: String,
    /// Replica number.
    pub replica: u32,
    /// The kernel's raft group.
    pub group: u64,
    /// Applies the group's namespace to the local kernel.
    pub applier: Applier,
    /// Cells this replica won (most recent last).
    won: Mutex<VecDeque<String>>,
    /// Lead requests being decided and won cells running ([`Busy`] guards).
    busy: AtomicU32,
    /// A move takes this replica away: it yields every cell from now on.
    moving_out: AtomicBool,
}

/// Counts a lead request or won cell as running on its replica while alive. Taken before a
/// lead request reads [`LocalReplica::moving_out`], so that a replica seen idle after its
/// move was flagged starts no cell (both sides use sequentially consistent atomics).
struct Busy(Arc<LocalReplica>);

impl Busy {
    fn enter(local: &Arc<LocalReplica>) -> Self {
        local.busy.fetch_add(1, Ordering::SeqCst);
        Busy(local.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

impl std::fmt::Debug for LocalReplica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalReplica").field("kernel", &self.kernel_id).field("replica", &self.replica).finish()
    }
}

impl LocalReplica {
    /// A replica record for the host's map.
    pub fn new(kernel_id: String, replica: u32, group: u64, applier: Applier) -> Self {
        Self {
            kernel_id,
            replica,
            group,
            applier,
            won: Mutex::new(VecDeque::new()),
            busy: AtomicU32::new(0),
            moving_out: AtomicBool::new(false),
        }
    }

    /// Remembers `cell` as won here; false when it already was (a duplicate request).
    fn first_win(&self, cell: &str) -> bool {
        let mut won = self.won.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if won.iter().any(|c| c == cell) {
            return false;
        }
        if won.len() >= REMEMBERED_CELLS {
            won.pop_front();
        }
        won.push_back(cell.to_owned());
        true
    }
}

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
    replicas: Mutex<HashMap<String, Arc<LocalReplica>>>,
}

impl std::fmt::Debug for ReplicaHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaHost").field("node_id", &self.node_id).finish()
    }
}

fn outcome_reply(request: &Message, election: serde_json::Value, content: serde_json::Value) -> Message {
    let session = request.header().map(|h| h.session).unwrap_or_default();
    let mut reply = Message::new(
        "execute_reply",
        &session,
        &uuid::Uuid::new_v4().to_string(),
        SystemTime::now(),
        Some(&request.header),
        &content,
    );
    reply.metadata = bytes::Bytes::from(serde_json::json!({ "nbos_election": election }).to_string());
    reply
}

fn not_run_content() -> serde_json::Value {
    serde_json::json!({ "status": "aborted", "execution_count": 0, "user_expressions": {}, "payload": [] })
}

/// Reads `metadata.nbos_election` of an `execute_request`: `None` without it.
pub fn election_request(msg: &Message) -> Option<Result<ElectionRequest, String>> {
    let meta: serde_json::Value = serde_json::from_slice(&msg.metadata).ok()?;
    let e = meta.get("nbos_election")?;
    Some(serde_json::from_value(e.clone()).map_err(|err| format!("bad metadata.nbos_election: {err}")))
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

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<LocalReplica>>> {
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
    pub fn attach(&self, kernel: Arc<Kernel>, replica: u32, group: u64) -> Arc<LocalReplica> {
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
        let local = Arc::new(LocalReplica::new(kernel.id.clone(), replica, group, applier));
        self.lock().insert(kernel.id.clone(), local.clone());
        local
    }

    /// Forgets a local replica (its applier stops).
    pub fn detach(&self, kernel_id: &str) -> Option<Arc<LocalReplica>> {
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
    pub fn replica(&self, kernel_id: &str) -> Option<Arc<LocalReplica>> {
        self.lock().get(kernel_id).cloned()
    }

    /// Handles a client message for a local kernel: election requests are answered
    /// here (and won cells run from here); anything else passes through unchanged.
    pub async fn handle_execute(self: &Arc<Self>, kernel: &Arc<Kernel>, client: ClientId, msg: Message) -> Handled {
        let Ok(header) = msg.header() else { return Handled::PassThrough(msg) };
        if header.msg_type != "execute_request" {
            return Handled::PassThrough(msg);
        }
        let req = match election_request(&msg) {
            None => return Handled::PassThrough(msg),
            Some(Ok(r)) => r,
            Some(Err(reason)) => {
                self.answer_error(kernel, client, &msg, &reason);
                return Handled::Handled;
            }
        };
        let Some(local) = self.replica(&kernel.id) else {
            let reason = format!("host {} has no replica of kernel {}", self.node_id, kernel.id);
            self.answer_error(kernel, client, &msg, &reason);
            return Handled::Handled;
        };
        let kv = self.store.kv(local.group);
        // The kernel's lock names this replica but nothing runs here (a lock left by this
        // host's previous daemon, or an unreleased one): free it, or the kernel stays busy.
        if local.busy.load(Ordering::SeqCst) == 0 {
            if let Some(held) = election::running_stale(&kv).await {
                if held.node_id == self.node_id && held.replica == local.replica {
                    tracing::info!(kernel = %kernel.id, cell = %held.cell, "releasing the kernel's lock of a cell this replica no longer runs");
                    election::release_running(&kv, &held).await;
                }
            }
        }
        if req.role == Role::Yield {
            let (cell, round, replica) = (req.cell.clone(), req.round, local.replica);
            tokio::spawn(async move { election::note_yield(&kv, &cell, round, replica).await });
            return Handled::Handled;
        }
        let busy = Busy::enter(&local);
        let decision = if local.moving_out.load(Ordering::SeqCst) {
            Decision::Yield {
                reason: format!("replica {} on host {} is moving to another host", local.replica, self.node_id),
            }
        } else if kernel.hub.activity().execution_state == "dead" {
            Decision::Yield { reason: format!("replica {} on host {} is dead", local.replica, self.node_id) }
        } else if let Some(why) = local.applier.broken() {
            Decision::Yield { reason: format!("replica {} cannot follow the namespace: {why}", local.replica) }
        } else if self.kernels.binder().can_commit_now(&kernel.id, kernel.gpus) {
            Decision::Lead
        } else {
            Decision::Yield { reason: format!("host {} cannot commit {} GPU(s) now", self.node_id, kernel.gpus) }
        };
        if let Decision::Yield { reason } = &decision {
            tracing::debug!(kernel = %kernel.id, cell = %req.cell, round = req.round, reason, "replica yields");
        }
        let me = Proposer { replica: local.replica, node_id: self.node_id };
        let started = Instant::now();
        let proposed =
            election::propose(&kv, &req.cell, req.round, req.expected.as_ref(), me, decision, req.steal.as_ref());
        let outcome = match proposed.await {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(kernel = %kernel.id, cell = %req.cell, round = req.round, error = %e, "election failed");
                self.answer_error(kernel, client, &msg, &e.to_string());
                return Handled::Handled;
            }
        };
        tracing::debug!(
            kernel = %kernel.id, cell = %req.cell, round = req.round, outcome = outcome.name(),
            took_us = started.elapsed().as_micros() as u64, "election proposal decided"
        );
        match outcome {
            Outcome::Won(record) => {
                if local.first_win(&req.cell) {
                    let (host, kernel) = (self.clone(), kernel.clone());
                    let won = Won { cell: req.cell, record, started };
                    tokio::spawn(async move {
                        host.run_won(kernel, local, client, msg, header.msg_id, won).await;
                        drop(busy);
                    });
                }
            }
            Outcome::Busy(held) => {
                let election = serde_json::json!({ "outcome": "busy", "record": req.expected, "running": held });
                kernel.hub.release(
                    client,
                    Channel::Shell,
                    outcome_reply(&msg, election, not_run_content()),
                    SystemTime::now(),
                );
            }
            other => {
                let election = serde_json::json!({ "outcome": other.name(), "record": other.record() });
                kernel.hub.release(
                    client,
                    Channel::Shell,
                    outcome_reply(&msg, election, not_run_content()),
                    SystemTime::now(),
                );
            }
        }
        Handled::Handled
    }

    fn answer_error(&self, kernel: &Kernel, client: ClientId, msg: &Message, reason: &str) {
        let election = serde_json::json!({ "outcome": "error", "reason": reason, "node_id": self.node_id });
        kernel.hub.release(client, Channel::Shell, outcome_reply(msg, election, not_run_content()), SystemTime::now());
    }

    /// Runs a won cell: catch up, execute, export + commit, then release the reply.
    async fn run_won(
        self: Arc<Self>,
        kernel: Arc<Kernel>,
        local: Arc<LocalReplica>,
        client: ClientId,
        msg: Message,
        msg_id: String,
        won: Won,
    ) {
        let Won { cell, record, started } = won;
        // The kernel's lock this win took: the namespace commit removes it; every other end
        // of the cell releases it here.
        let kv = self.store.kv(local.group);
        let lock = RunningRecord { cell: cell.clone(), replica: local.replica, node_id: self.node_id };
        let executed = |revision: u64| {
            serde_json::json!({
                "outcome": "executed",
                "replica": local.replica,
                "node_id": self.node_id,
                "revision": revision,
            })
        };
        // The swap committed at some revision R and this node applies entries in order: once
        // its own state shows the record, every cell committed before R is in its state too, so
        // the namespace is caught up when the applier reaches the local `ns-cell` (no
        // linearizable read through the leader on the cell's path).
        let key = keys::elect(&cell);
        let elected = |v: &[u8]| {
            crate::cluster::control::records::decode::<ElectionRecord>(key.as_bytes(), v).is_ok_and(|r| r == record)
        };
        let caught_up = local.applier.catch_up_after(key.as_bytes(), elected, CATCH_UP_TIMEOUT).await;
        let caught_up_us = started.elapsed().as_micros() as u64;
        if let Err(e) = caught_up {
            tracing::warn!(kernel = %kernel.id, cell, error = format!("{e:#}"), "won a cell but cannot catch up");
            let evalue = format!("replica {} on host {} could not catch up: {e:#}", local.replica, self.node_id);
            let content = serde_json::json!({
                "status": "error", "execution_count": 0, "ename": "NamespaceNotCaughtUp", "evalue": evalue,
                "traceback": [format!("NamespaceNotCaughtUp: {evalue}")],
            });
            kernel.hub.release(client, Channel::Shell, outcome_reply(&msg, executed(0), content), SystemTime::now());
            election::release_running(&kv, &lock).await;
            return;
        }
        let held = kernel.hub.hold_reply(&msg_id);
        kernel.hub.note_submitted(&msg_id, Instant::now());
        // When the cell was written to the kernel's shell socket (after binding committed its
        // GPUs): the end of its election as a user meets it, which `nbos bench election`
        // measures. A GPU cell is written by binding's own task, which reports the time.
        let forwarded = match self.kernels.binder().dispatch(&kernel, client, Channel::Shell, msg.clone()) {
            Dispatch::Now(m) => kernel
                .send_from_client(client, Channel::Shell, m)
                .await
                .map(|()| Some(Dispatched { gpus_bound: None, written: SystemTime::now() })),
            Dispatch::Bound(written) => tokio::select! {
                w = written => match w {
                    Ok(Ok(w)) => Ok(Some(Dispatched { gpus_bound: Some(w.bound), written: w.written })),
                    Ok(Err(e)) => Err(anyhow::anyhow!(e)),
                    // Refused (binding sent the error reply) or dropped with the kernel.
                    Err(_) => Ok(None),
                },
                () = wait_dead(&kernel) => Ok(None),
            },
        };
        tracing::debug!(
            kernel = %kernel.id, cell, caught_up_us, sent_us = started.elapsed().as_micros() as u64,
            "won cell sent to the kernel (times since the proposal started)"
        );
        let dispatched = match forwarded {
            Ok(d) => d,
            Err(e) => {
                kernel.hub.unhold_reply(&msg_id);
                tracing::warn!(kernel = %kernel.id, cell, error = format!("{e:#}"), "could not start a won cell");
                kernel.reject_cell(client, &msg, "KernelUnavailable", &format!("{e:#}"));
                election::release_running(&kv, &lock).await;
                return;
            }
        };
        let reply = tokio::select! {
            r = held => r.ok(),
            () = wait_dead(&kernel) => None,
        };
        let Some(mut reply) = reply else {
            kernel.hub.unhold_reply(&msg_id);
            tracing::warn!(kernel = %kernel.id, cell, "the replica died while running a won cell");
            election::release_running(&kv, &lock).await;
            return;
        };
        let me = Proposer { replica: local.replica, node_id: self.node_id };
        let export_started = Instant::now();
        let exported =
            state_sync::export_and_commit(&kernel, &kv, &self.objects, &self.sync, &cell, me, &local.applier).await;
        let m = &self.sync_metrics;
        m.export_seconds.observe(export_started.elapsed().as_secs_f64());
        let revision = match exported {
            Ok(x) => {
                m.cells_exported.inc();
                m.bytes.get_or_create(&PathLabels { path: "log" }).inc_by(x.inline_bytes);
                m.bytes.get_or_create(&PathLabels { path: "object_store" }).inc_by(x.object_bytes);
                m.unpicklable_names.inc_by(x.unpicklable.len() as u64);
                if !x.unpicklable.is_empty() {
                    let names: Vec<String> =
                        x.unpicklable.iter().map(|u| format!("  {}: {}", u.name, u.error)).collect();
                    let text = format!(
                        "[NotebookOS] not synchronised to the other replicas (cannot be pickled); they will lack:\n{}\n",
                        names.join("\n")
                    );
                    kernel.publish(&msg, "stream", &serde_json::json!({ "name": "stderr", "text": text }));
                }
                x.revision
            }
            Err(e) => {
                m.failures.get_or_create(&SideLabels { side: "export" }).inc();
                tracing::error!(kernel = %kernel.id, cell, error = format!("{e:#}"), "namespace sync failed");
                let text = format!(
                    "[NotebookOS] this cell's namespace changes were NOT synchronised to the other replicas: {e:#}\n"
                );
                kernel.publish(&msg, "stream", &serde_json::json!({ "name": "stderr", "text": text }));
                // Not acknowledged: the cell ran here only. This replica's namespace now
                // differs from the group's, so it yields every later cell (another replica
                // runs them) until the supervisor has started its kernel afresh.
                local.applier.mark_diverged(format!("cell {cell}'s changes could not be synchronised: {e:#}"));
                election::release_running(&kv, &lock).await;
                let count = serde_json::from_slice::<serde_json::Value>(&reply.content)
                    .ok()
                    .and_then(|c| c.get("execution_count").cloned())
                    .unwrap_or_else(|| serde_json::json!(0));
                let evalue = format!(
                    "the cell ran on replica {} (host {}) but its namespace changes could not be synchronised to the \
                     other replicas ({e:#}); the kernel's next cells run on another replica, without this cell's changes",
                    local.replica, self.node_id
                );
                let content = serde_json::json!({
                    "status": "error", "execution_count": count, "ename": "NamespaceSyncFailed", "evalue": evalue,
                    "traceback": [format!("NamespaceSyncFailed: {evalue}")],
                });
                reply.content = bytes::Bytes::from(content.to_string());
                0
            }
        };
        let mut meta: serde_json::Value =
            serde_json::from_slice(&reply.metadata).unwrap_or_else(|_| serde_json::json!({}));
        if !meta.is_object() {
            meta = serde_json::json!({});
        }
        meta["nbos_election"] = executed(revision);
        if let Some(d) = dispatched {
            meta["nbos_election"]["dispatched_unix_us"] = serde_json::json!(unix_us(d.written));
            if let Some(b) = d.gpus_bound {
                meta["nbos_election"]["gpus_bound_unix_us"] = serde_json::json!(unix_us(b));
            }
        }
        reply.metadata = bytes::Bytes::from(meta.to_string());
        kernel.hub.release(client, Channel::Shell, reply, SystemTime::now());
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

    /// The replicas hosted here (`GET /api/v1/cluster/replicas`).
    pub async fn replicas(&self) -> Vec<ReplicaStatus> {
        let all: Vec<Arc<LocalReplica>> = self.lock().values().cloned().collect();
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

/// A cell this replica won: its id, the committed record and when the proposal started.
struct Won {
    cell: String,
    record: ElectionRecord,
    started: Instant,
}

/// When a won cell reached its kernel.
#[derive(Debug, Clone, Copy)]
struct Dispatched {
    /// Binding committed the cell's GPUs (kernels with GPUs).
    gpus_bound: Option<SystemTime>,
    /// The `execute_request` was written to the kernel's shell socket.
    written: SystemTime,
}

/// Resolves when the kernel has no live process (died or shut down).
async fn wait_dead(kernel: &Kernel) {
    let mut every = tokio::time::interval(Duration::from_millis(500));
    loop {
        every.tick().await;
        if kernel.hub.activity().execution_state == "dead" {
            return;
        }
    }
}

/// Microseconds since the Unix epoch (0 for a clock before it).
fn unix_us(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}
