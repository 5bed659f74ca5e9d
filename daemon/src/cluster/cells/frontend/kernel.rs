//! One kernel's front-end on this host ([`FrontendKernel`]): the clients' hub, the
//! client messages it takes (cells to the worker's queue, everything else to a replica
//! host), and the replica messages it passes on to the clients (only the executor's).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::election_message::{election_meta, parent_msg_id};
use super::events::{Cell, Event};
use super::shared::Shared;
use super::state::{ExecutionInfo, State};
use crate::cluster::control::records::{keys, KernelRecord};
use crate::jupyter::message::error_reply;
use crate::jupyter::{Channel, Message};
use crate::kernel::hub::{ClientId, Hub};
use nbos_sched::preselect::Candidate;

/// How long a cell waits for any replica host to be reachable before it fails.
pub(super) const NO_REPLICA_TIMEOUT: Duration = Duration::from_secs(30);

/// One kernel's front-end on this host.
pub struct FrontendKernel {
    /// Kernel id.
    pub id: String,
    /// GPUs each cell needs.
    pub gpus: u32,
    /// This host's clients of the kernel.
    pub hub: Arc<Hub>,
    /// What every front-end of this host shares.
    pub(super) shared: Arc<Shared>,
    /// The kernel's record as last read (its replicas).
    pub(super) record: Mutex<KernelRecord>,
    /// The links to the replica hosts, by node id.
    pub(super) links: Mutex<HashMap<u64, Link>>,
    /// What it knows of its cells.
    pub(super) state: Mutex<State>,
    /// The cell worker's queue.
    pub(super) cells: mpsc::UnboundedSender<Cell>,
    /// What the links tell the cell worker.
    pub(super) events: mpsc::UnboundedSender<Event>,
    /// The cell worker's task.
    worker: Mutex<Option<JoinHandle<()>>>,
}

/// A front-end kernel's handle on its link to one replica host.
pub(super) struct Link {
    /// Messages for the replica.
    pub(super) out: mpsc::UnboundedSender<(Channel, Message)>,
    /// Whether the link is up now.
    pub(super) connected: watch::Receiver<bool>,
    /// The task keeping it up.
    pub(super) task: JoinHandle<()>,
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
    /// A front-end of `record`'s kernel, and the receiving ends of its cell queue and event
    /// channel for its cell worker. Nothing runs yet: the links and the worker are started
    /// by whoever opens it.
    pub(super) fn new(
        record: KernelRecord,
        shared: Arc<Shared>,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<Cell>, mpsc::UnboundedReceiver<Event>) {
        let (cells_tx, cells_rx) = mpsc::unbounded_channel();
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let k = Arc::new(Self {
            id: record.id.clone(),
            gpus: record.gpus,
            hub: Arc::new(Hub::new("idle", SystemTime::now())),
            shared,
            record: Mutex::new(record),
            links: Mutex::new(HashMap::new()),
            state: Mutex::new(State::default()),
            cells: cells_tx,
            events: events_tx,
            worker: Mutex::new(None),
        });
        (k, cells_rx, events_rx)
    }

    /// Keeps the cell worker's task, to stop it on close.
    pub(super) fn set_worker(&self, worker: JoinHandle<()>) {
        *self.worker.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(worker);
    }

    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn links(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Link>> {
        self.links.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stops the worker and the links.
    pub(super) fn close(&self) {
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

    /// Whether the link to `node`'s replica is up.
    pub(super) fn is_connected(&self, node: u64) -> bool {
        self.links().get(&node).is_some_and(|l| *l.connected.borrow())
    }

    /// Sends `msg` to `node`'s replica; false when its link is down.
    pub(super) fn send_to(&self, node: u64, channel: Channel, msg: Message) -> bool {
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
    pub(super) fn on_replica_message(&self, node: u64, channel: Channel, msg: Message) {
        let parent = parent_msg_id(&msg);
        if let Some(el) = election_meta(&msg) {
            let Some(cell) = parent else { return };
            let outcome = el.get("outcome").and_then(|o| o.as_str()).unwrap_or("").to_owned();
            let ev = if outcome == "executed" {
                Event::Executed { cell, node, reply: msg }
            } else {
                let record = el.get("record").and_then(|r| serde_json::from_value(r.clone()).ok());
                let running = el.get("running").and_then(|r| serde_json::from_value(r.clone()).ok());
                Event::Outcome { cell, node, outcome, record, running }
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
    pub(super) fn publish(&self, parent: &Message, msg_type: &str, content: &serde_json::Value) {
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
    pub(super) fn answer_error(&self, request: &Message, ename: &str, evalue: &str) {
        let Ok(h) = request.header() else { return };
        let now = SystemTime::now();
        let Ok((error, reply)) = error_reply(request, ename, evalue, &uuid::Uuid::new_v4().to_string(), now) else {
            return;
        };
        let is_cell = h.msg_type == "execute_request";
        if is_cell {
            self.publish(request, "error", &error);
        }
        self.hub.deliver(Channel::Shell, reply, now);
        if is_cell {
            self.publish(request, "status", &serde_json::json!({ "execution_state": "idle" }));
        }
    }

    /// The replica candidates for a round: live = `hosts/` record and connected link.
    pub(super) async fn candidates(&self) -> (Vec<Candidate>, Option<KernelRecord>) {
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
