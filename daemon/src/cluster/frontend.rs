//! The front-end of a replicated kernel on one host (F-cluster "path of a cell"):
//! one [`FrontendKernel`] per kernel per host, shared by this host's client sockets.
//!
//! It keeps one internal WebSocket per replica host (`…/channels?replica=local` with
//! the cluster token, reconnected with backoff), serialises the kernel's cells, and
//! runs each cell's election rounds: pre-selection ([`crate::sched::preselect`]),
//! `execute_request` to every live replica with `metadata.nbos_election`, then the
//! outcomes: `executed` → the reply goes to the client; `yielded` → the next round
//! (after telling the client once that the cell waits for GPUs, and waiting for a
//! `load/` change); `stale` → the next round from the current record; `taken` → the
//! winner's outputs, or `ExecutorHostDied` when its host is gone.
//!
//! Clients see one kernel: IOPub is forwarded only from the replica host a request
//! went to (the cell's executor), so the other replicas and the daemons' own silent
//! requests never reach them. A replica host counts as live when its `hosts/` record
//! exists and its WebSocket is connected.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use futures_util::{SinkExt, StreamExt};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use raft_store::{Kv, RaftStore};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message as WsFrame;

use super::local_link::{LocalLink, LocalReplicas};
use super::records::{decode, keys, ElectionRecord, HostRecord, KernelRecord, LoadRecord};
use crate::gateway::client::{ChannelsSocket, GatewayClient};
use crate::jupyter::{ws, Channel, Message};
use crate::kernel::hub::{ClientId, Hub};
use crate::sched::preselect::{preselect, Candidate};

/// How long a round waits for its designee's outcome before asking again.
const OUTCOME_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a cell waits for any replica host to be reachable before it fails.
const NO_REPLICA_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause between retry rounds when every live replica yielded and no `load/` changed.
const YIELD_RETRY: Duration = Duration::from_millis(500);
/// Request ids remembered per kernel to route late IOPub (bounded).
const MAX_ROUTED: usize = 4096;
/// Reconnect backoff of an internal WebSocket.
const LINK_BACKOFF_MIN: Duration = Duration::from_millis(50);
const LINK_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Longest a cached `hosts/` + `load/` read serves pre-selection without a change seen.
const META_CACHE_MAX_AGE: Duration = Duration::from_secs(1);

/// Metrics of the front-end.
#[derive(Debug, Clone)]
pub struct FrontendMetrics {
    /// Election rounds started (a cell takes one, more when replicas yield).
    pub election_rounds_total: Counter,
    /// Cell submitted at this gateway → its executor started it (first IOPub), seconds.
    pub election_latency_seconds: Histogram,
    /// Cells elected on another replica because the previous executor's host was down.
    pub cells_failed_over_total: Counter,
    /// Cells answered `ExecutorHostDied` (their executor's host died mid-cell).
    pub cells_executor_died_total: Counter,
}

impl Default for FrontendMetrics {
    fn default() -> Self {
        Self {
            election_rounds_total: Counter::default(),
            election_latency_seconds: Histogram::new(exponential_buckets(0.000_125, 2.0, 20)),
            cells_failed_over_total: Counter::default(),
            cells_executor_died_total: Counter::default(),
        }
    }
}

impl FrontendMetrics {
    /// Registers the metrics (names as exported, units in the names).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "notebookos_election_rounds",
            "Executor election rounds started by this front-end",
            self.election_rounds_total.clone(),
        );
        registry.register(
            "notebookos_election_latency_seconds",
            "Cell submitted at the gateway until its elected replica starts it",
            self.election_latency_seconds.clone(),
        );
        registry.register(
            "notebookos_cells_failed_over",
            "Cells elected on another replica because the previous executor's host was down",
            self.cells_failed_over_total.clone(),
        );
        registry.register(
            "notebookos_cells_executor_died",
            "Cells answered ExecutorHostDied because their executor's host died mid-cell",
            self.cells_executor_died_total.clone(),
        );
    }
}

/// The front-end's metrics in a registry of their own, rendered after the daemon's.
pub struct MetricsRegistry {
    registry: Registry,
}

impl MetricsRegistry {
    /// A registry holding `metrics`.
    pub fn new(metrics: &FrontendMetrics) -> Self {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        Self { registry }
    }

    /// Appends these metrics to an OpenMetrics exposition (before its `# EOF`).
    pub fn append_to(&self, exposition: &mut String) {
        crate::metrics::append_registry(&self.registry, exposition);
    }
}

/// What every front-end kernel of this host shares.
struct Shared {
    meta: Kv,
    /// This host's raft store, to read a kernel group's last executor when this host is a member.
    store: Option<RaftStore>,
    token: Option<String>,
    metrics: FrontendMetrics,
    /// Bumped on every `hosts/` or `load/` change.
    changes: watch::Receiver<u64>,
    /// `hosts/` and `load/` as last read, with the `changes` count they were read at.
    cache: Mutex<Option<MetaCache>>,
    /// This host's node id and its replicas, linked in-process (set once the gateway runs).
    local: std::sync::OnceLock<(u64, Arc<dyn LocalReplicas>)>,
}

/// The meta records a cell's pre-selection reads, kept between changes: reading them from
/// the store queues behind the raft engine's log writes, on every cell's path.
#[derive(Clone)]
struct MetaCache {
    changes: u64,
    read_at: Instant,
    hosts: HashMap<u64, HostRecord>,
    loads: HashMap<u64, LoadRecord>,
}

impl Shared {
    /// Live hosts and their loads (local meta state: a host whose lease expired is gone),
    /// from the cache while no `hosts/` or `load/` change was seen (and at most
    /// [`META_CACHE_MAX_AGE`] old, in case the watch is down).
    async fn hosts_and_loads(&self) -> (HashMap<u64, HostRecord>, HashMap<u64, LoadRecord>) {
        let changes = *self.changes.borrow();
        {
            let cache = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(c) = cache.as_ref().filter(|c| c.changes == changes && c.read_at.elapsed() < META_CACHE_MAX_AGE)
            {
                return (c.hosts.clone(), c.loads.clone());
            }
        }
        let hosts: HashMap<u64, HostRecord> =
            self.range::<HostRecord>(keys::HOSTS).await.into_iter().map(|h| (h.node_id, h)).collect();
        let loads: HashMap<u64, LoadRecord> =
            self.range::<LoadRecord>(keys::LOAD).await.into_iter().map(|l| (l.node_id, l)).collect();
        let fresh = MetaCache { changes, read_at: Instant::now(), hosts: hosts.clone(), loads: loads.clone() };
        *self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(fresh);
        (hosts, loads)
    }

    /// Live hosts by node id.
    async fn hosts(&self) -> HashMap<u64, HostRecord> {
        self.hosts_and_loads().await.0
    }

    async fn range<T: serde::de::DeserializeOwned>(&self, prefix: &str) -> Vec<T> {
        match self.meta.range_stale(prefix.as_bytes(), 0).await {
            Ok(out) => out
                .kvs
                .iter()
                .filter_map(|kv| match decode::<T>(&kv.key, &kv.value) {
                    Ok(v) => Some(v),
                    Err(e) => {
                        tracing::warn!(error = format!("{e:#}"), "skipping a record");
                        None
                    }
                })
                .collect(),
            Err(e) => {
                tracing::warn!(prefix, error = %e, "cannot read the meta store");
                Vec::new()
            }
        }
    }

    /// The replica (and host) that executed the kernel's last synchronised cell, from the
    /// kernel group's `ns-cell` (local state; `None` when this host is not a member).
    async fn group_last_executor(&self, group: u64) -> Option<(u32, u64)> {
        let out = self.store.as_ref()?.kv(group).get_stale(keys::NS_CELL.as_bytes()).await.ok()?;
        let kv = out.kvs.first()?;
        let cell: super::state_sync::NsCell = decode(&kv.key, &kv.value).ok()?;
        Some((cell.replica, cell.node_id))
    }

    async fn kernel(&self, id: &str) -> Option<KernelRecord> {
        let key = keys::kernel(id);
        let out = self.meta.get_stale(key.as_bytes()).await.ok()?;
        let kv = out.kvs.first()?;
        decode(&kv.key, &kv.value).ok()
    }
}

/// The front-end kernels of this host.
pub struct Frontends {
    shared: Arc<Shared>,
    registry: MetricsRegistry,
    kernels: Mutex<HashMap<String, Arc<FrontendKernel>>>,
    watcher: JoinHandle<()>,
}

impl Drop for Frontends {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

impl Frontends {
    /// Front-ends reading the cluster from `meta` (the meta group's [`Kv`]) and, where this
    /// host is a member of a kernel's group, the group from `store`; authenticating to
    /// other hosts with `token` (the cluster's API token).
    pub fn new(meta: Kv, store: Option<RaftStore>, token: Option<String>, metrics: FrontendMetrics) -> Arc<Self> {
        let (tx, rx) = watch::channel(0u64);
        let watcher = tokio::spawn(watch_hosts_and_loads(meta.clone(), tx));
        Arc::new(Self {
            registry: MetricsRegistry::new(&metrics),
            shared: Arc::new(Shared {
                meta,
                store,
                token,
                metrics,
                changes: rx,
                cache: Mutex::new(None),
                local: std::sync::OnceLock::new(),
            }),
            kernels: Mutex::new(HashMap::new()),
            watcher,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<FrontendKernel>>> {
        self.kernels.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Links front-ends to node `node_id`'s (this host's) replicas in-process from now on,
    /// instead of by WebSocket to this host's own gateway. Set once; later calls are ignored.
    pub fn set_local(&self, node_id: u64, replicas: Arc<dyn LocalReplicas>) {
        let _ = self.shared.local.set((node_id, replicas));
    }

    /// The front-end of `record`'s kernel, opened on first use.
    pub fn open(&self, record: &KernelRecord) -> Arc<FrontendKernel> {
        let mut g = self.lock();
        if let Some(k) = g.get(&record.id) {
            return k.clone();
        }
        let k = FrontendKernel::start(record.clone(), self.shared.clone());
        g.insert(record.id.clone(), k.clone());
        k
    }

    /// The front-end of a kernel, if one is open here.
    pub fn get(&self, id: &str) -> Option<Arc<FrontendKernel>> {
        self.lock().get(id).cloned()
    }

    /// Closes the front-ends of kernels not in `ids` (deleted through another host).
    pub fn retain(&self, ids: &HashSet<&str>) {
        let gone: Vec<Arc<FrontendKernel>> = {
            let mut g = self.lock();
            let ids_gone: Vec<String> = g.keys().filter(|k| !ids.contains(k.as_str())).cloned().collect();
            ids_gone.iter().filter_map(|id| g.remove(id)).collect()
        };
        for k in gone {
            k.close();
        }
    }

    /// Closes a kernel's front-end (kernel deleted): its clients and links go.
    pub fn close(&self, id: &str) {
        if let Some(k) = self.lock().remove(id) {
            k.close();
        }
    }

    /// The replica that executed `record`'s last cell: from the kernel group when this
    /// host is a member, else as this host's front-end saw it.
    pub async fn last_executor(&self, record: &KernelRecord) -> Option<(u32, u64)> {
        match self.shared.group_last_executor(record.group).await {
            Some(x) => Some(x),
            None => self.get(&record.id).and_then(|f| f.state().last_executor),
        }
    }

    /// The live hosts (for the gateway's models and internal calls).
    pub async fn hosts(&self) -> HashMap<u64, HostRecord> {
        self.shared.hosts().await
    }

    /// The metrics.
    pub fn metrics(&self) -> &FrontendMetrics {
        &self.shared.metrics
    }

    /// Appends the front-end metrics to the daemon's exposition.
    pub fn append_metrics(&self, exposition: &mut String) {
        self.registry.append_to(exposition);
    }
}

/// Bumps `tx` on every committed change under `hosts/` or `load/` (re-watching when a
/// watch ends), so waiting cells retry when GPUs or hosts come and go.
async fn watch_hosts_and_loads(meta: Kv, tx: watch::Sender<u64>) {
    let mut from = [0u64, 0u64];
    loop {
        let hosts = meta.watch(keys::HOSTS.as_bytes(), from[0]).await;
        let loads = meta.watch(keys::LOAD.as_bytes(), from[1]).await;
        let (mut hosts, mut loads) = match (hosts, loads) {
            (Ok(h), Ok(l)) => (h, l),
            (h, l) => {
                let e = h.err().or(l.err()).map(|e| e.to_string()).unwrap_or_default();
                tracing::debug!(error = %e, "cannot watch hosts/load yet; retrying");
                from = [0, 0];
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        loop {
            let (i, ev) = tokio::select! {
                ev = hosts.next() => (0, ev),
                ev = loads.next() => (1, ev),
            };
            let Some(ev) = ev else { break };
            from[i] = ev.revision + 1;
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
        // A watch ended (fell behind, snapshot): state may have changed unseen.
        tx.send_modify(|n| *n = n.wrapping_add(1));
        from = [0, 0];
    }
}

/// What the cell worker hears from the replica links.
#[derive(Debug)]
enum Event {
    /// The designee's election outcome for `cell`.
    Outcome { cell: String, node: u64, outcome: String, record: Option<ElectionRecord> },
    /// The executor's final reply for `cell`.
    Executed { cell: String, node: u64, reply: Message },
    /// `node` produced the first IOPub of `cell`: it executes it.
    Started { cell: String },
    /// A link connected or dropped.
    Link { node: u64, up: bool },
}

/// A cell waiting for its turn.
struct Cell {
    request: Message,
    msg_id: String,
    submitted: Instant,
}

#[derive(Default)]
struct State {
    /// The kernel's last executor (replica number, node).
    last_executor: Option<(u32, u64)>,
    /// The cell being elected or executed.
    current: Option<Current>,
    /// Which node each recent request (cell or other) went to, for IOPub and replies.
    routed: HashMap<String, u64>,
    routed_order: VecDeque<String>,
    /// Cells executed through this front-end.
    executed: u64,
    closed: bool,
}

struct Current {
    msg_id: String,
    round: u32,
    executor: Option<u64>,
    submitted: Instant,
}

impl State {
    fn route(&mut self, msg_id: &str, node: u64) {
        if self.routed.insert(msg_id.to_owned(), node).is_none() {
            self.routed_order.push_back(msg_id.to_owned());
        }
        while self.routed_order.len() > MAX_ROUTED {
            if let Some(old) = self.routed_order.pop_front() {
                self.routed.remove(&old);
            }
        }
    }
}

/// The execution facts of a front-end kernel (in the cluster kernel model).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExecutionInfo {
    /// Replica number of the last executor seen by this front-end.
    pub last_executor_replica: Option<u32>,
    /// Its host.
    pub last_executor_node: Option<u64>,
    /// The cell being elected or executed (msg id), and its round.
    pub current_cell: Option<String>,
    /// Round of the current cell.
    pub current_round: Option<u32>,
    /// Host executing the current cell, once known.
    pub current_executor_node: Option<u64>,
    /// Cells executed through this host's front-end.
    pub cells_executed: u64,
    /// Replica hosts whose internal WebSocket is connected.
    pub connected_nodes: Vec<u64>,
}

/// One kernel's front-end on this host.
pub struct FrontendKernel {
    /// Kernel id.
    pub id: String,
    /// GPUs each cell needs.
    pub gpus: u32,
    /// This host's clients of the kernel.
    pub hub: Arc<Hub>,
    shared: Arc<Shared>,
    record: Mutex<KernelRecord>,
    links: Mutex<HashMap<u64, Link>>,
    state: Mutex<State>,
    cells: mpsc::UnboundedSender<Cell>,
    events: mpsc::UnboundedSender<Event>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

struct Link {
    out: mpsc::UnboundedSender<(Channel, Message)>,
    connected: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

impl Drop for FrontendKernel {
    fn drop(&mut self) {
        self.close();
    }
}

impl std::fmt::Debug for FrontendKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrontendKernel").field("id", &self.id).finish()
    }
}

impl FrontendKernel {
    fn start(record: KernelRecord, shared: Arc<Shared>) -> Arc<Self> {
        let (cells_tx, cells_rx) = mpsc::unbounded_channel();
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let k = Arc::new(Self {
            id: record.id.clone(),
            gpus: record.gpus,
            hub: Arc::new(Hub::new("idle", SystemTime::now())),
            shared,
            record: Mutex::new(record.clone()),
            links: Mutex::new(HashMap::new()),
            state: Mutex::new(State::default()),
            cells: cells_tx,
            events: events_tx,
            worker: Mutex::new(None),
        });
        for r in &record.replicas {
            k.ensure_link(r.node_id);
        }
        let worker = tokio::spawn(cell_worker(Arc::downgrade(&k), cells_rx, events_rx));
        *k.worker.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(worker);
        k
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn links(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Link>> {
        self.links.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stops the worker and the links.
    fn close(&self) {
        self.state().closed = true;
        if let Some(w) = self.worker.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take() {
            w.abort();
        }
        for (_, l) in self.links().drain() {
            l.task.abort();
        }
        self.hub.set_state("dead", SystemTime::now());
    }

    /// What the kernel model shows about execution here.
    pub fn execution(&self) -> ExecutionInfo {
        let connected_nodes = {
            let mut v: Vec<u64> = self.links().iter().filter(|(_, l)| *l.connected.borrow()).map(|(n, _)| *n).collect();
            v.sort_unstable();
            v
        };
        let s = self.state();
        ExecutionInfo {
            last_executor_replica: s.last_executor.map(|(r, _)| r),
            last_executor_node: s.last_executor.map(|(_, n)| n),
            current_cell: s.current.as_ref().map(|c| c.msg_id.clone()),
            current_round: s.current.as_ref().map(|c| c.round),
            current_executor_node: s.current.as_ref().and_then(|c| c.executor),
            cells_executed: s.executed,
            connected_nodes,
        }
    }

    /// The host executing the current cell, else the last executor's host.
    pub fn executing_node(&self) -> Option<u64> {
        let s = self.state();
        s.current.as_ref().and_then(|c| c.executor).or(s.last_executor.map(|(_, n)| n))
    }

    fn is_connected(&self, node: u64) -> bool {
        self.links().get(&node).is_some_and(|l| *l.connected.borrow())
    }

    /// Starts (once) the internal WebSocket to `node`'s replica.
    fn ensure_link(self: &Arc<Self>, node: u64) {
        let mut links = self.links();
        if links.contains_key(&node) {
            return;
        }
        let (out_tx, out_rx) = mpsc::unbounded_channel();
        let (conn_tx, conn_rx) = watch::channel(false);
        let task = tokio::spawn(run_link(Arc::downgrade(self), node, out_rx, conn_tx));
        links.insert(node, Link { out: out_tx, connected: conn_rx, task });
    }

    fn send_to(&self, node: u64, channel: Channel, msg: Message) -> bool {
        self.links().get(&node).is_some_and(|l| *l.connected.borrow() && l.out.send((channel, msg)).is_ok())
    }

    /// A client's message: cells are queued for election, everything else goes to the
    /// executing (or last executing, or any connected) replica host.
    pub fn on_client_message(self: &Arc<Self>, client: ClientId, channel: Channel, msg: Message) -> anyhow::Result<()> {
        let h = msg.header()?;
        let now = SystemTime::now();
        if matches!(channel, Channel::Shell | Channel::Control) && h.msg_type.ends_with("_request") {
            self.hub.expect_reply(&h.msg_id, client, now);
        }
        match (channel, h.msg_type.as_str()) {
            (Channel::Shell, "execute_request") => {
                self.hub.note_submitted(&h.msg_id, Instant::now());
                self.cells
                    .send(Cell { request: msg, msg_id: h.msg_id, submitted: Instant::now() })
                    .map_err(|_| anyhow::anyhow!("the kernel's front-end is closed"))?;
            }
            (Channel::Control, "shutdown_request") => self.shutdown(&msg),
            (Channel::Stdin, _) => {
                // input_reply: to whoever asked (the executor of the parent cell).
                let parent = parent_msg_id(&msg);
                let node = parent.and_then(|p| self.state().routed.get(&p).copied()).or(self.executing_node());
                if let Some(node) = node {
                    self.send_to(node, channel, msg);
                }
            }
            _ => match self.pick_any_node() {
                Some(node) => self.send_request(node, channel, msg, &h.msg_id),
                None => {
                    // Just opened (links connecting) or every replica host is down: wait
                    // for one, as a cell would, then answer with an error.
                    let (weak, msg_id) = (Arc::downgrade(self), h.msg_id);
                    tokio::spawn(async move {
                        let deadline = Instant::now() + NO_REPLICA_TIMEOUT;
                        loop {
                            let Some(k) = weak.upgrade() else { return };
                            if let Some(node) = k.pick_any_node() {
                                k.send_request(node, channel, msg, &msg_id);
                                return;
                            }
                            if Instant::now() >= deadline {
                                k.answer_error(
                                    &msg,
                                    "NoReplicaReachable",
                                    "no replica host of this kernel is reachable from this gateway",
                                );
                                return;
                            }
                            drop(k);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    });
                }
            },
        }
        Ok(())
    }

    fn send_request(&self, node: u64, channel: Channel, msg: Message, msg_id: &str) {
        self.state().route(msg_id, node);
        if !self.send_to(node, channel, msg.clone()) {
            self.answer_error(&msg, "NoReplicaReachable", "the replica host went away; retry");
        }
    }

    /// A client's `shutdown_request` is about the whole kernel, not one replica: the
    /// record is deleted (every replica host stops its replica) and the client answered.
    /// A restart goes through `POST /api/kernels/{id}/restart` (every replica).
    fn shutdown(self: &Arc<Self>, request: &Message) {
        let restart = request.content_json().ok().and_then(|c| c.get("restart")?.as_bool()).unwrap_or(false);
        if restart {
            self.answer_error(
                request,
                "RestartThroughRest",
                "a replicated kernel restarts all its replicas: use POST /api/kernels/{id}/restart",
            );
            return;
        }
        let Ok(h) = request.header() else { return };
        let reply = Message::new(
            "shutdown_reply",
            &h.session,
            &uuid::Uuid::new_v4().to_string(),
            SystemTime::now(),
            Some(&request.header),
            &serde_json::json!({ "status": "ok", "restart": false }),
        );
        let (meta, id, weak) = (self.shared.meta.clone(), self.id.clone(), Arc::downgrade(self));
        tokio::spawn(async move {
            match meta.delete(keys::kernel(&id).into_bytes()).await {
                Ok(_) => tracing::info!(kernel = %id, "kernel shut down by a client"),
                Err(e) => tracing::warn!(kernel = %id, error = %e, "could not delete the kernel on shutdown_request"),
            }
            if let Some(k) = weak.upgrade() {
                k.hub.deliver(Channel::Control, reply, SystemTime::now());
            }
        });
    }

    /// The current executor, else the last one, else the connected replica with the lowest number.
    fn pick_any_node(&self) -> Option<u64> {
        if let Some(n) = self.executing_node().filter(|n| self.is_connected(*n)) {
            return Some(n);
        }
        let mut replicas = self.record.lock().unwrap_or_else(std::sync::PoisonError::into_inner).replicas.clone();
        replicas.sort_by_key(|r| r.replica);
        replicas.into_iter().map(|r| r.node_id).find(|n| self.is_connected(*n))
    }

    /// A message from replica host `node`'s local replica.
    fn on_replica_message(&self, node: u64, channel: Channel, msg: Message) {
        let parent = parent_msg_id(&msg);
        if let Some(el) = election_meta(&msg) {
            let Some(cell) = parent else { return };
            let outcome = el.get("outcome").and_then(|o| o.as_str()).unwrap_or("").to_owned();
            let ev = if outcome == "executed" {
                Event::Executed { cell, node, reply: msg }
            } else {
                let record = el.get("record").and_then(|r| serde_json::from_value(r.clone()).ok());
                Event::Outcome { cell, node, outcome, record }
            };
            let _ = self.events.send(ev);
            return;
        }
        let Some(parent) = parent else {
            tracing::trace!(kernel = %self.id, node, "dropping a parentless message from a replica");
            return;
        };
        let mut started = None;
        {
            let mut s = self.state();
            if let Some(c) = s.current.as_mut() {
                if c.msg_id == parent && c.executor.is_none() && channel == Channel::Iopub {
                    c.executor = Some(node);
                    started = Some(c.submitted);
                }
            }
            if started.is_some() {
                s.route(&parent, node);
            }
            if s.routed.get(&parent) != Some(&node) {
                // Another replica's or the daemon's own traffic: never the client's.
                return;
            }
        }
        if let Some(t) = started {
            tracing::debug!(
                kernel = %self.id, cell = %parent, node,
                since_submit_us = u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX), "cell started"
            );
            self.shared.metrics.election_latency_seconds.observe(t.elapsed().as_secs_f64());
            let _ = self.events.send(Event::Started { cell: parent.clone() });
        }
        self.hub.deliver(channel, msg, SystemTime::now());
    }

    /// Publishes a daemon-originated IOPub message in reply to `parent`.
    fn publish(&self, parent: &Message, msg_type: &str, content: &serde_json::Value) {
        let session = parent.header().map(|h| h.session).unwrap_or_default();
        let msg = Message::new(
            msg_type,
            &session,
            &uuid::Uuid::new_v4().to_string(),
            SystemTime::now(),
            Some(&parent.header),
            content,
        );
        self.hub.deliver(Channel::Iopub, msg, SystemTime::now());
    }

    /// Answers `request` with an error reply (and, for a cell, error + idle on IOPub).
    fn answer_error(&self, request: &Message, ename: &str, evalue: &str) {
        let Ok(h) = request.header() else { return };
        let error =
            serde_json::json!({ "ename": ename, "evalue": evalue, "traceback": [format!("{ename}: {evalue}")] });
        let is_cell = h.msg_type == "execute_request";
        if is_cell {
            self.publish(request, "error", &error);
        }
        let mut content = error;
        content["status"] = "error".into();
        if is_cell {
            content["execution_count"] = 0.into();
        }
        let reply_type =
            h.msg_type.strip_suffix("_request").map_or_else(|| h.msg_type.clone(), |t| format!("{t}_reply"));
        let reply = Message::new(
            &reply_type,
            &h.session,
            &uuid::Uuid::new_v4().to_string(),
            SystemTime::now(),
            Some(&request.header),
            &content,
        );
        self.hub.deliver(Channel::Shell, reply, SystemTime::now());
        if is_cell {
            self.publish(request, "status", &serde_json::json!({ "execution_state": "idle" }));
        }
    }

    /// The replica candidates for a round: live = `hosts/` record and connected link.
    async fn candidates(&self) -> (Vec<Candidate>, Option<KernelRecord>) {
        let record = self.shared.kernel(&self.id).await;
        if let Some(r) = &record {
            *self.record.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = r.clone();
        }
        let Some(rec) = record.clone() else { return (Vec::new(), None) };
        let (hosts, loads) = self.shared.hosts_and_loads().await;
        let cands = rec
            .replicas
            .iter()
            .map(|r| Candidate {
                replica: r.replica,
                node_id: r.node_id,
                live: hosts.contains_key(&r.node_id) && self.is_connected(r.node_id),
                gpus_idle: loads.get(&r.node_id).map_or(0, |l| l.gpus_idle),
                local: self.shared.local.get().is_some_and(|(me, _)| *me == r.node_id),
            })
            .collect();
        (cands, record)
    }
}

fn parent_msg_id(msg: &Message) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(&msg.parent_header).ok()?;
    v.get("msg_id")?.as_str().map(str::to_owned)
}

/// `metadata.nbos_election` of a replica's reply, when it is an election outcome.
fn election_meta(msg: &Message) -> Option<serde_json::Value> {
    if !msg.metadata.windows(13).any(|w| w == b"nbos_election") {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&msg.metadata).ok()?;
    let el = v.get("nbos_election")?;
    el.get("outcome").is_some().then(|| el.clone())
}

/// `request` with `metadata.nbos_election` set for one replica in one round.
fn with_election(request: &Message, cell: &str, round: u32, lead: bool, expected: Option<&ElectionRecord>) -> Message {
    let mut meta: serde_json::Value =
        serde_json::from_slice(&request.metadata).unwrap_or_else(|_| serde_json::json!({}));
    if !meta.is_object() {
        meta = serde_json::json!({});
    }
    meta["nbos_election"] = serde_json::json!({
        "cell": cell,
        "round": round,
        "role": if lead { "lead" } else { "yield" },
        "expected": expected,
    });
    Message { metadata: bytes::Bytes::from(meta.to_string()), ..request.clone() }
}

/// Keeps the link to one replica host up while the kernel lives.
async fn run_link(
    kernel: Weak<FrontendKernel>,
    node: u64,
    mut out: mpsc::UnboundedReceiver<(Channel, Message)>,
    connected: watch::Sender<bool>,
) {
    let mut backoff = LINK_BACKOFF_MIN;
    loop {
        let Some(k) = kernel.upgrade() else { return };
        let (id, shared, events) = (k.id.clone(), k.shared.clone(), k.events.clone());
        drop(k);
        // This host's own replica in-process; another host's through its gateway.
        let local = shared.local.get().filter(|(me, _)| *me == node).map(|(_, l)| l.clone());
        let session = match local {
            Some(local) => local.connect(&id).await.map(Session::Local),
            None => connect_remote(&shared, node, &id).await.map(|s| Session::Remote(Box::new(s))),
        };
        let Some(session) = session else {
            if shared.kernel(&id).await.is_none() {
                tracing::info!(kernel = %id, node, "kernel deleted; replica link stops");
                return;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(LINK_BACKOFF_MAX);
            continue;
        };
        backoff = LINK_BACKOFF_MIN;
        let how = session.name();
        tracing::info!(kernel = %id, node, how, "replica link connected");
        // Whatever was queued for the previous connection belongs to rounds already decided.
        while out.try_recv().is_ok() {}
        connected.send_replace(true);
        let _ = events.send(Event::Link { node, up: true });
        let gone = match session {
            Session::Local(link) => run_local_link(&kernel, node, &id, link, &mut out).await,
            Session::Remote(socket) => run_remote_link(&kernel, node, &id, *socket, &mut out).await,
        };
        if gone {
            return;
        }
        tracing::warn!(kernel = %id, node, how, "replica link lost");
        connected.send_replace(false);
        let _ = events.send(Event::Link { node, up: false });
    }
}

/// One connection of a replica link.
enum Session {
    /// This host's replica, in-process.
    Local(LocalLink),
    /// Another host's replica, by WebSocket to its gateway (`?replica=local`).
    Remote(Box<ChannelsSocket>),
}

impl Session {
    fn name(&self) -> &'static str {
        match self {
            Session::Local(_) => "in-process",
            Session::Remote(_) => "websocket",
        }
    }
}

/// Opens the internal WebSocket to `node`'s replica of kernel `id` (`None`: not now).
async fn connect_remote(shared: &Shared, node: u64, id: &str) -> Option<ChannelsSocket> {
    let url = shared.hosts().await.get(&node).map(|h| h.gateway_url.clone())?;
    let client = GatewayClient::new(&url, shared.token.clone());
    match tokio::time::timeout(Duration::from_secs(5), client.connect_local_replica(id)).await {
        Ok(Ok(s)) => Some(s),
        Ok(Err(e)) => {
            tracing::debug!(kernel = %id, node, error = format!("{e:#}"), "replica link not up yet");
            None
        }
        Err(_) => None,
    }
}

/// Carries one WebSocket link until it breaks (`false`) or the front-end is gone (`true`).
async fn run_remote_link(
    kernel: &Weak<FrontendKernel>,
    node: u64,
    id: &str,
    socket: ChannelsSocket,
    out: &mut mpsc::UnboundedReceiver<(Channel, Message)>,
) -> bool {
    let (mut tx, mut rx) = socket.split();
    loop {
        tokio::select! {
            m = out.recv() => {
                let Some((channel, msg)) = m else { return true };
                if let Err(e) = tx.send(WsFrame::Binary(ws::to_v1_binary(channel, &msg).into())).await {
                    tracing::debug!(kernel = %id, node, error = %e, "replica link send failed");
                    return false;
                }
            }
            f = rx.next() => match f {
                Some(Ok(WsFrame::Binary(b))) => match ws::from_v1_binary(&b) {
                    Ok((channel, msg)) => match kernel.upgrade() {
                        Some(k) => k.on_replica_message(node, channel, msg),
                        None => return true,
                    },
                    Err(e) => tracing::warn!(kernel = %id, node, error = %e, "undecodable message from a replica host"),
                },
                Some(Ok(WsFrame::Close(_))) | None => return false,
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::debug!(kernel = %id, node, error = %e, "replica link failed");
                    return false;
                }
            },
        }
    }
}

/// Carries one in-process link until it breaks (`false`) or the front-end is gone (`true`).
async fn run_local_link(
    kernel: &Weak<FrontendKernel>,
    node: u64,
    id: &str,
    link: LocalLink,
    out: &mut mpsc::UnboundedReceiver<(Channel, Message)>,
) -> bool {
    let LocalLink { mut rx, send, close } = link;
    let gone = loop {
        tokio::select! {
            m = out.recv() => {
                let Some((channel, msg)) = m else { break true };
                // As the WebSocket handler does: a message the replica refuses is logged, the
                // link stays.
                if let Err(e) = send(channel, msg).await {
                    tracing::warn!(kernel = %id, node, error = format!("{e:#}"), "could not forward a message to the local replica");
                }
            }
            m = rx.recv() => match m {
                Some((channel, msg)) => match kernel.upgrade() {
                    Some(k) => k.on_replica_message(node, channel, msg),
                    None => break true,
                },
                None => break false,
            },
        }
    };
    close();
    gone
}

/// Runs the kernel's cells one at a time.
async fn cell_worker(
    kernel: Weak<FrontendKernel>,
    mut cells: mpsc::UnboundedReceiver<Cell>,
    mut events: mpsc::UnboundedReceiver<Event>,
) {
    while let Some(cell) = cells.recv().await {
        let Some(k) = kernel.upgrade() else { return };
        run_cell(&k, &cell, &mut events).await;
        k.state().current = None;
    }
}

/// Why a cell ended without an `executed` outcome.
enum Failure {
    HostDied(u64),
    NoReplica,
    Deleted,
}

async fn run_cell(k: &Arc<FrontendKernel>, cell: &Cell, events: &mut mpsc::UnboundedReceiver<Event>) {
    k.state().current =
        Some(Current { msg_id: cell.msg_id.clone(), round: 0, executor: None, submitted: cell.submitted });
    let mut changes = k.shared.changes.clone();
    let mut round: u32 = 0;
    let mut expected: Option<ElectionRecord> = None;
    let mut yielded: Vec<u32> = Vec::new();
    let mut told_waiting = false;
    let no_replica_since = Instant::now();
    let failure = 'cell: loop {
        // Who is live now; a new replica (re-placed) gets a link.
        let (cands, record) = k.candidates().await;
        let Some(record) = record else { break 'cell Failure::Deleted };
        for r in &record.replicas {
            k.ensure_link(r.node_id);
        }
        // The kernel's last executor whichever front-end sent its cell (the group's record),
        // else the last one this front-end saw.
        let last = k.shared.group_last_executor(record.group).await;
        let last = last.or(k.state().last_executor);
        let previous = last.map(|(r, _)| r);
        // The kernel's own last cell is over (cells are serialised): GPUs its executor still
        // holds for it (idle-held, or not yet republished in `load/`, sampled every 100 ms) are
        // its own to take, so they do not count against the previous executor. Without this
        // a stale load moves every other cell to another replica (and its group leadership
        // with it). The replica host's binder decides for real.
        let mut cands = cands;
        if let Some(p) = previous {
            for c in cands.iter_mut().filter(|c| c.replica == p) {
                c.gpus_idle = c.gpus_idle.saturating_add(record.gpus);
            }
        }
        let live: HashSet<u32> = cands.iter().filter(|c| c.live).map(|c| c.replica).collect();
        if !yielded.is_empty() && live.iter().all(|r| yielded.contains(r)) {
            // Every live replica said it cannot: the cell waits for GPUs.
            if !told_waiting {
                told_waiting = true;
                let reason = expected.as_ref().map(|e| e.reason.clone()).filter(|r| !r.is_empty());
                let text = format!(
                    "[NotebookOS] waiting for {} GPU(s): no replica's host can commit them now{}; the cell starts when GPUs free up\n",
                    record.gpus,
                    reason.map(|r| format!(" ({r})")).unwrap_or_default()
                );
                k.publish(&cell.request, "stream", &serde_json::json!({ "name": "stderr", "text": text }));
            }
            yielded.clear();
            let _ = tokio::time::timeout(YIELD_RETRY, changes.changed()).await;
            continue;
        }
        let Some(plan) = preselect(&cands, record.gpus, previous, &yielded) else {
            if no_replica_since.elapsed() > NO_REPLICA_TIMEOUT {
                break 'cell Failure::NoReplica;
            }
            // Wait for a link or host to come back.
            tokio::select! {
                _ = changes.changed() => {}
                ev = events.recv() => if ev.is_none() { return },
                () = tokio::time::sleep(YIELD_RETRY) => {}
            }
            continue;
        };
        let lead_node = cands.iter().find(|c| c.replica == plan.lead).map_or(0, |c| c.node_id);
        if let Some((p, prev_node)) = last {
            if round == 0 && p != plan.lead && !cands.iter().any(|c| c.replica == p && c.live) {
                tracing::info!(kernel = %k.id, cell = %cell.msg_id, from = prev_node, to = lead_node, "failing over to another replica");
                k.shared.metrics.cells_failed_over_total.inc();
            }
        }
        k.shared.metrics.election_rounds_total.inc();
        if let Some(c) = k.state().current.as_mut() {
            c.round = round;
        }
        tracing::debug!(
            kernel = %k.id, cell = %cell.msg_id, round, lead = plan.lead,
            since_submit_us = u64::try_from(cell.submitted.elapsed().as_micros()).unwrap_or(u64::MAX),
            "election round"
        );
        // The designee first: its swap is on the cell's path, the yield notes are not.
        let mut live_cands: Vec<&Candidate> = cands.iter().filter(|c| c.live).collect();
        live_cands.sort_by_key(|c| c.replica != plan.lead);
        for c in live_cands {
            let msg = with_election(&cell.request, &cell.msg_id, round, c.replica == plan.lead, expected.as_ref());
            k.send_to(c.node_id, Channel::Shell, msg);
        }
        // Wait for this round's outcome (or the execution it starts).
        let deadline = tokio::time::Instant::now() + OUTCOME_TIMEOUT;
        loop {
            let executor = k.state().current.as_ref().and_then(|c| c.executor);
            let ev = if executor.is_some() {
                // Executing: no timeout, cells run as long as they run.
                events.recv().await
            } else {
                match tokio::time::timeout_at(deadline, events.recv()).await {
                    Ok(ev) => ev,
                    Err(_) => {
                        tracing::warn!(kernel = %k.id, cell = %cell.msg_id, round, lead = plan.lead, "no election outcome in time; next round");
                        yielded.push(plan.lead);
                        round += 1;
                        continue 'cell;
                    }
                }
            };
            let Some(ev) = ev else { return };
            match ev {
                Event::Executed { cell: c, node, reply } if c == cell.msg_id => {
                    let replica = record.replicas.iter().find(|r| r.node_id == node).map_or(0, |r| r.replica);
                    {
                        let mut s = k.state();
                        s.last_executor = Some((replica, node));
                        s.executed += 1;
                        s.route(&cell.msg_id, node);
                    }
                    k.hub.deliver(Channel::Shell, reply, SystemTime::now());
                    return;
                }
                Event::Started { cell: c, .. } if c == cell.msg_id => {}
                Event::Outcome { cell: c, node, outcome, record: rec } if c == cell.msg_id => {
                    match outcome.as_str() {
                        "yielded" => {
                            if node != lead_node {
                                continue; // an outcome from an earlier round's designee
                            }
                            yielded.push(plan.lead);
                            expected = rec;
                            round = expected.as_ref().map_or(round, |e| e.round.max(round)) + 1;
                            continue 'cell;
                        }
                        "stale" => {
                            if node != lead_node {
                                continue;
                            }
                            round = rec.as_ref().map_or(round, |e| e.round.max(round)) + 1;
                            expected = rec;
                            continue 'cell;
                        }
                        "taken" => {
                            let Some(rec) = rec else { continue };
                            let winner_live =
                                k.is_connected(rec.node_id) && cands.iter().any(|c| c.node_id == rec.node_id && c.live);
                            if !winner_live {
                                break 'cell Failure::HostDied(rec.node_id);
                            }
                            let mut s = k.state();
                            if let Some(c) = s.current.as_mut() {
                                c.executor.get_or_insert(rec.node_id);
                            }
                            s.route(&cell.msg_id, rec.node_id);
                        }
                        "error" => {
                            // The designee could not take part (no replica there yet, store
                            // failure): ask another replica.
                            if node != lead_node {
                                continue;
                            }
                            tracing::warn!(kernel = %k.id, cell = %cell.msg_id, node, "designee answered an election error; next round");
                            yielded.push(plan.lead);
                            round += 1;
                            continue 'cell;
                        }
                        other => {
                            tracing::warn!(kernel = %k.id, cell = %cell.msg_id, node, outcome = other, "unknown election outcome");
                        }
                    }
                }
                Event::Link { node, up: false } => {
                    let executor = k.state().current.as_ref().and_then(|c| c.executor);
                    if executor == Some(node) {
                        break 'cell Failure::HostDied(node);
                    }
                    if executor.is_none() && node == lead_node {
                        // The designee went away before saying anything: ask again; the
                        // record (if it won before dying) answers `taken`.
                        yielded.push(plan.lead);
                        round += 1;
                        continue 'cell;
                    }
                }
                _ => {} // late events of earlier cells or rounds, links coming up
            }
        }
    };
    let (ename, evalue) = match failure {
        Failure::HostDied(node) => {
            k.shared.metrics.cells_executor_died_total.inc();
            let name = k.shared.hosts().await.get(&node).map_or_else(|| format!("node {node}"), |h| h.name.clone());
            ("ExecutorHostDied", format!("the host executing this cell ({name}, node {node}) died or became unreachable; the kernel's next cell runs on a surviving replica with the state of the last completed cell"))
        }
        Failure::NoReplica => (
            "NoReplicaReachable",
            format!("no replica host of this kernel was reachable from this gateway within {NO_REPLICA_TIMEOUT:?}"),
        ),
        Failure::Deleted => ("KernelDeleted", "the kernel was deleted".to_owned()),
    };
    tracing::warn!(kernel = %k.id, cell = %cell.msg_id, ename, evalue = %evalue, "cell failed");
    // The client may have seen `busy` from the dead executor: error, idle, reply.
    k.answer_error(&cell.request, ename, &evalue);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> Message {
        let mut m = Message::new(
            "execute_request",
            "s",
            "cell-1",
            SystemTime::UNIX_EPOCH,
            None,
            &serde_json::json!({ "code": "1" }),
        );
        m.metadata = bytes::Bytes::from_static(br#"{"cellId":"abc"}"#);
        m
    }

    #[test]
    fn election_metadata_is_added_without_losing_the_clients() {
        let rec = ElectionRecord { round: 0, winner: None, node_id: 2, reason: "busy".into() };
        let m = with_election(&request(), "cell-1", 1, true, Some(&rec));
        let meta: serde_json::Value = serde_json::from_slice(&m.metadata).expect("json");
        assert_eq!(meta["cellId"], "abc");
        assert_eq!(meta["nbos_election"]["cell"], "cell-1");
        assert_eq!(meta["nbos_election"]["round"], 1);
        assert_eq!(meta["nbos_election"]["role"], "lead");
        assert_eq!(meta["nbos_election"]["expected"]["node_id"], 2);
        let y = with_election(&request(), "cell-1", 0, false, None);
        let meta: serde_json::Value = serde_json::from_slice(&y.metadata).expect("json");
        assert_eq!(meta["nbos_election"]["role"], "yield");
        assert!(meta["nbos_election"]["expected"].is_null());
        // A request is not an outcome.
        assert!(election_meta(&m).is_none());
    }

    #[test]
    fn outcomes_are_recognised_and_plain_replies_are_not() {
        let mut reply = request();
        reply.metadata = bytes::Bytes::from_static(
            br#"{"nbos_election":{"outcome":"taken","record":{"round":0,"winner":3,"node_id":7}}}"#,
        );
        let el = election_meta(&reply).expect("outcome");
        assert_eq!(el["outcome"], "taken");
        reply.metadata = bytes::Bytes::from_static(br#"{"started":"x"}"#);
        assert!(election_meta(&reply).is_none());
        reply.metadata = bytes::Bytes::from_static(b"not json nbos_election");
        assert!(election_meta(&reply).is_none());
    }

    #[test]
    fn front_end_metrics_go_before_the_eof_marker() {
        let m = FrontendMetrics::default();
        m.election_rounds_total.inc();
        m.election_latency_seconds.observe(0.002);
        let mut text = "# HELP x y\n# TYPE x counter\nx_total 1\n# EOF\n".to_owned();
        MetricsRegistry::new(&m).append_to(&mut text);
        assert!(text.ends_with("# EOF\n"));
        assert_eq!(text.matches("# EOF").count(), 1);
        assert!(text.contains("notebookos_election_rounds_total 1"));
        assert!(text.contains("notebookos_election_latency_seconds_count 1"));
        assert!(text.contains("notebookos_cells_failed_over_total 0"));
    }

    #[test]
    fn routed_requests_are_bounded() {
        let mut s = State::default();
        for i in 0..(MAX_ROUTED + 10) {
            s.route(&format!("m{i}"), 1);
        }
        assert_eq!(s.routed.len(), MAX_ROUTED);
        assert!(!s.routed.contains_key("m0"));
        assert_eq!(s.routed.get(&format!("m{}", MAX_ROUTED + 9)), Some(&1));
    }
}
