//! The public handle: [`RaftStore`] (one per process) and [`Kv`] (one group's key-value API).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, oneshot};

use crate::config::StoreConfig;
use crate::engine::request::{
    Control, GroupRequest, GroupStatus, Inbound, Membership, MembershipChange, Query, ReadOutput,
};
use crate::engine::view::Views;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::forward::wire::{ForwardOp, ForwardReply, ForwardRequest, WireError};
use crate::forward::{self, Delivery, Forwarder, NotSent};
use crate::metrics::Metrics;
use crate::state_machine::{CasOutcome, Command, CommandOutput, KeyValue, Txn, TxnResponse, WatchEvent};
use crate::transport::Transport;

/// Depth of the engine's inbound queues (requests, and raft messages from the network).
const INBOX_DEPTH: usize = 65_536;
/// Longest lease TTL granted (liveness records live seconds; a year is plenty).
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(365 * 24 * 3600);
/// Room kept in a frame for what wraps a command's keys and values (raft message, entry, proposal,
/// length prefixes).
const ENTRY_OVERHEAD: usize = 4096;
/// Events buffered per watch before a slow watcher is cut off.
const WATCH_BUFFER: usize = 1024;
/// The least time left for which `route` starts another attempt after a pause.
const MIN_ATTEMPT: Duration = Duration::from_millis(20);

struct Inner {
    cfg: StoreConfig,
    control: crossbeam_channel::Sender<Control>,
    transport: Transport,
    forwarder: Arc<Forwarder>,
    /// Applied state of every local group: stale reads are served from it on the caller's thread.
    views: Views,
    metrics: Arc<Metrics>,
    registry: Mutex<Registry>,
    engine_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    /// Why the driving loop stopped on its own (a failed log write), once it has.
    failure: Arc<tokio::sync::watch::Sender<Option<String>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _ = self.control.send(Control::Shutdown);
        if let Some(t) = self.engine_thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = t.join();
        }
        if let Some(rt) = self.runtime.lock().ok().and_then(|mut r| r.take()) {
            rt.shutdown_background();
        }
    }
}

/// An embedded multi-group Raft store: one per process, hosting any number of groups.
///
/// All methods may be called from any thread; the async ones need a tokio runtime (for their
/// deadline). The store runs its own driving thread and its own small transport runtime.
#[derive(Clone)]
pub struct RaftStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RaftStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftStore").field("node_id", &self.inner.cfg.node_id).finish()
    }
}

impl RaftStore {
    /// Opens (or creates) the store: recovers every group from the log, binds the transport and
    /// starts the driving loop.
    pub fn open(cfg: StoreConfig) -> Result<Self> {
        cfg.validate()?;
        std::fs::create_dir_all(&cfg.data_dir)
            .map_err(|e| Error::io(format!("create data directory {}", cfg.data_dir.display()), e))?;
        let log_cfg = raft_engine::Config {
            dir: cfg.data_dir.join("raft-log").display().to_string(),
            // Small files: purge reclaims space sooner; many tiny groups should not pin big files.
            target_file_size: raft_engine::ReadableSize::mb(32),
            purge_threshold: raft_engine::ReadableSize::mb(256),
            ..Default::default()
        };
        let log = Arc::new(
            raft_engine::Engine::open(log_cfg)
                .map_err(|source| Error::Log { path: cfg.data_dir.display().to_string(), source })?,
        );
        let metrics = Arc::new(Metrics::default());
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(format!("raft-net-{}", cfg.node_id))
            .enable_all()
            .build()
            .map_err(|e| Error::io("start transport runtime", e))?;
        let (control_tx, control_rx) = crossbeam_channel::bounded(INBOX_DEPTH);
        let (inbound_tx, inbound_rx) = crossbeam_channel::bounded::<Inbound>(INBOX_DEPTH);
        let views = Views::default();
        let forwarder = Arc::new(Forwarder::new(control_tx.clone(), cfg.max_frame_bytes, metrics.clone()));
        let failure = Arc::new(tokio::sync::watch::Sender::new(None));
        let started = (|| {
            let failed = failure.clone();
            let transport =
                Transport::start(&cfg, metrics.clone(), inbound_tx, forwarder.clone(), runtime.handle().clone())?;
            let engine = Engine::open(cfg.clone(), log, transport.clone(), views.clone(), metrics.clone())?;
            let thread = std::thread::Builder::new()
                .name(format!("raft-engine-{}", cfg.node_id))
                .spawn(move || {
                    // Fail-stop: a panic in the driving loop (a broken invariant in raft or the log)
                    // must not leave a process that looks alive but never answers.
                    let run = std::panic::AssertUnwindSafe(|| engine.run(control_rx, inbound_rx));
                    match std::panic::catch_unwind(run) {
                        Ok(None) => {}
                        // The owner decides what the process does (notebookosd stops the host).
                        Ok(Some(reason)) => {
                            failed.send_replace(Some(reason));
                        }
                        Err(_) => {
                            tracing::error!("raft engine panicked; aborting the process");
                            std::process::abort();
                        }
                    }
                })
                .map_err(|e| Error::io("spawn raft engine thread", e))?;
            Ok((transport, thread))
        })();
        let (transport, thread) = match started {
            Ok(t) => t,
            Err(e) => {
                // Dropping a runtime blocks, which panics inside an async caller; let it go instead.
                runtime.shutdown_background();
                return Err(e);
            }
        };
        Ok(RaftStore {
            inner: Arc::new(Inner {
                cfg,
                control: control_tx,
                transport,
                forwarder,
                views,
                metrics,
                registry: Mutex::new(registry),
                engine_thread: Mutex::new(Some(thread)),
                runtime: Mutex::new(Some(runtime)),
                failure,
            }),
        })
    }

    /// This node's id.
    pub fn node_id(&self) -> u64 {
        self.inner.cfg.node_id
    }

    /// The configuration the store was opened with.
    pub fn config(&self) -> &StoreConfig {
        &self.inner.cfg
    }

    async fn call<T>(&self, group: u64, make: impl FnOnce(oneshot::Sender<Result<T>>) -> Control) -> Result<T> {
        forward::call(&self.inner.control, group, self.inner.cfg.request_timeout, make).await
    }

    pub(crate) async fn group_call<T>(
        &self,
        group: u64,
        make: impl FnOnce(oneshot::Sender<Result<T>>) -> GroupRequest,
    ) -> Result<T> {
        self.call(group, |tx| Control::Group { group, req: make(tx) }).await
    }

    /// Creates a group with the given founding voters (every founding member calls this with the
    /// same list). Durable when it returns.
    pub async fn create_group(&self, group: u64, voters: &[u64]) -> Result<()> {
        let voters = voters.to_vec();
        self.call(group, |reply| Control::Create { group, voters, join: false, reply }).await
    }

    /// Creates an empty replica of an existing group on this node; it receives a snapshot once the
    /// leader adds this node (see [`RaftStore::change_membership`]).
    pub async fn join_group(&self, group: u64) -> Result<()> {
        self.call(group, |reply| Control::Create { group, voters: Vec::new(), join: true, reply }).await
    }

    /// Removes the group's replica and its data from this node.
    pub async fn destroy_group(&self, group: u64) -> Result<()> {
        self.call(group, |reply| Control::Destroy { group, reply }).await
    }

    /// Ids of the groups hosted here.
    pub async fn groups(&self) -> Result<Vec<u64>> {
        let (tx, rx) = oneshot::channel();
        self.inner.control.try_send(Control::ListGroups { reply: tx }).map_err(|_| Error::Stopped)?;
        rx.await.map_err(|_| Error::Stopped)
    }

    /// The key-value API of one group. Writes and linearizable reads made on a node that is not
    /// the group's leader are forwarded to the leader (see [`Kv`]).
    pub fn kv(&self, group: u64) -> Kv {
        Kv { store: self.clone(), group, forward: true }
    }

    /// Proposes a membership change (on the leader). One change is applied directly; several at
    /// once use joint consensus (`ConfChangeV2`, left automatically). Returns the membership once
    /// the change is applied here.
    pub async fn change_membership(&self, group: u64, changes: &[MembershipChange]) -> Result<Membership> {
        let changes = changes.to_vec();
        self.group_call(group, |reply| GroupRequest::ChangeMembership { changes, reply }).await
    }

    /// Asks the leader to hand leadership to `to` (returns once the transfer started).
    pub async fn transfer_leader(&self, group: u64, to: u64) -> Result<()> {
        self.group_call(group, |reply| GroupRequest::TransferLeader { to, reply }).await
    }

    /// The group's raft status on this node.
    pub async fn status(&self, group: u64) -> Result<GroupStatus> {
        self.group_call(group, |reply| GroupRequest::Status { reply }).await
    }

    /// Adds or re-addresses a peer node.
    pub fn add_peer(&self, node_id: u64, addr: SocketAddr) {
        self.inner.transport.add_peer(node_id, addr);
    }

    /// Test seam: drop all transport traffic to and from `peer`, as a network partition would.
    pub fn set_peer_blocked(&self, peer: u64, blocked: bool) {
        self.inner.transport.set_blocked(peer, blocked);
    }

    /// The store's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// Resolves once the driving loop has stopped on a failure it cannot go on from (a log
    /// write that failed: a full disk, an I/O error), with the reason; never on a shutdown.
    /// Every group of this node is stopped then: its owner should stop the process, as
    /// etcd does on a failed WAL write, rather than look alive and never answer.
    pub async fn failed(&self) -> String {
        let mut rx = self.inner.failure.subscribe();
        let reason = rx.wait_for(Option::is_some).await.map(|r| r.clone().unwrap_or_default());
        match reason {
            Ok(reason) => reason,
            // The sender lives as long as this store.
            Err(_) => std::future::pending().await,
        }
    }

    /// Metrics in the Prometheus text format.
    pub fn metrics_text(&self) -> String {
        let mut out = String::new();
        if let Ok(reg) = self.inner.registry.lock() {
            let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
        }
        out
    }
}

/// The key-value API of one group. Writes return once committed and applied; errors are typed.
///
/// Any node hosting a replica of the group can be used: on a follower, writes (put, delete, CAS,
/// txn, lease grant/keepalive/revoke) and linearizable reads (`get`, `range`) are forwarded to the
/// leader over the authenticated node-to-node transport, following leader changes until the call's
/// deadline (`request_timeout`). Errors keep their meaning: `Timeout`, `LeadershipLost` and
/// `ForwardLost` mean "outcome unknown"; `NotLeader` (no leader known by the deadline) and
/// `LeaderUnreachable` mean "not proposed". Stale reads and watches are served from this node's
/// replica. [`Kv::local_only`] turns forwarding off.
#[derive(Clone, Debug)]
pub struct Kv {
    store: RaftStore,
    group: u64,
    forward: bool,
}

/// A lease id.
pub type LeaseId = u64;

/// A stream of committed changes under a prefix.
#[derive(Debug)]
pub struct Watch {
    /// The first revision this watch reports.
    pub start_revision: u64,
    rx: mpsc::Receiver<WatchEvent>,
}

impl Watch {
    /// The next change; `None` when the watch ended (group gone, snapshot installed, or the
    /// watcher fell more than its buffer behind): re-watch from the last revision + 1.
    pub async fn next(&mut self) -> Option<WatchEvent> {
        self.rx.recv().await
    }
}

fn unexpected(out: CommandOutput) -> Error {
    Error::Corrupt(format!("unexpected command output {out:?}"))
}

impl Kv {
    /// The group id.
    pub fn group(&self) -> u64 {
        self.group
    }

    /// This handle without forwarding: calls on a non-leader fail with `NotLeader { hint }`, as
    /// a leader-only client expects.
    pub fn local_only(mut self) -> Kv {
        self.forward = false;
        self
    }

    /// Whether calls on a follower are forwarded to the leader.
    pub fn forwards(&self) -> bool {
        self.forward
    }

    async fn propose(&self, cmd: Command) -> Result<CommandOutput> {
        // An entry must fit in one transport frame to replicate (and to be forwarded); refuse it
        // here rather than let the group retry sending it forever.
        let max = self.store.inner.cfg.max_frame_bytes.saturating_sub(ENTRY_OVERHEAD);
        if cmd.payload_len() > max {
            return Err(Error::InvalidArgument(format!(
                "a write of {} bytes of keys and values exceeds the {max}-byte limit of one log entry \
                 (max_frame_bytes {} less framing)",
                cmd.payload_len(),
                self.store.inner.cfg.max_frame_bytes
            )));
        }
        match self.route(ForwardOp::Propose(cmd)).await? {
            ForwardReply::Command(out) => Ok(out),
            other => Err(Error::Corrupt(format!("unexpected answer to a write: {other:?}"))),
        }
    }

    async fn read(&self, query: Query, linearizable: bool) -> Result<ReadOutput> {
        if !linearizable {
            return self.store.inner.views.read(self.group, &query);
        }
        match self.route(ForwardOp::Read(query)).await? {
            ForwardReply::Read(out) => Ok(out),
            other => Err(Error::Corrupt(format!("unexpected answer to a read: {other:?}"))),
        }
    }

    /// Runs `op` here if this node leads the group, else at the leader, following leader hints
    /// until the deadline.
    async fn route(&self, op: ForwardOp) -> Result<ForwardReply> {
        let inner = &self.store.inner;
        let after = inner.cfg.request_timeout;
        if !self.forward {
            return forward::execute_local(&inner.control, self.group, op, after).await;
        }
        let started = Instant::now();
        let deadline = started + after;
        let me = inner.cfg.node_id;
        // Between attempts when no leader is known: short next to an election, so a call that
        // arrives mid-election costs little more than the election itself.
        let pause = (inner.cfg.tick_interval / 2).clamp(Duration::from_millis(5), Duration::from_millis(50));
        let mut target: Option<u64> = None;
        // Who this node believed led when it last refused the call: a change of that view while a
        // forwarded request waits means leadership moved.
        let mut local_view: Option<u64> = None;
        loop {
            let asked = target.take().filter(|t| *t != me).unwrap_or(me);
            let attempt = if asked == me {
                match forward::execute_local(&inner.control, self.group, op.clone(), forward::remaining(deadline)).await
                {
                    Err(Error::NotLeader { hint, .. }) => {
                        local_view = hint;
                        Attempt::Retry { hint, error: Error::NotLeader { group: self.group, hint } }
                    }
                    other => Attempt::Done(other),
                }
            } else {
                self.forward_once(asked, &op, local_view, started, deadline).await
            };
            let (hint, error) = match attempt {
                Attempt::Done(r) => return r,
                Attempt::Retry { hint, error } => (hint, error),
            };
            if forward::remaining(deadline).is_zero() {
                return Err(error);
            }
            match hint.filter(|h| *h != asked) {
                Some(h) if asked == me => target = Some(h),
                next => {
                    // A remote refusal or no known leader: give the election (or the hint) a moment.
                    tokio::time::sleep(pause.min(forward::remaining(deadline))).await;
                    // Too little time left for another attempt to be answered: report why the
                    // last one failed, not a timeout of an attempt that never had a chance.
                    if forward::remaining(deadline) < MIN_ATTEMPT {
                        return Err(error);
                    }
                    target = next;
                }
            }
        }
    }

    /// One forwarding attempt to `peer`. `local_view` is the leader this node believed in when it
    /// last refused the call itself.
    async fn forward_once(
        &self,
        peer: u64,
        op: &ForwardOp,
        local_view: Option<u64>,
        started: Instant,
        deadline: Instant,
    ) -> Attempt {
        let inner = &self.store.inner;
        let group = self.group;
        let label = op.label();
        let metrics = &inner.metrics;
        let timeout_ms = u64::try_from(forward::remaining(deadline).as_millis()).unwrap_or(u64::MAX);
        let req = ForwardRequest { group, timeout_ms, op: op.clone() };
        let sent_at = Instant::now();
        let mut ticket = match inner.forwarder.start(&inner.transport, peer, &req) {
            Ok(t) => t,
            Err(NotSent::NoConnection) => {
                metrics.forward_outcome(label, "not_sent");
                let error = Error::LeaderUnreachable { group, leader: peer, after: started.elapsed() };
                return Attempt::Retry { hint: None, error };
            }
            Err(NotSent::Overloaded) => {
                metrics.forward_outcome(label, "overloaded");
                return Attempt::Done(Err(Error::Overloaded));
            }
            Err(NotSent::TooLarge(n)) => {
                return Attempt::Done(Err(Error::InvalidArgument(format!(
                    "a request of {n} bytes does not fit in one transport frame ({} bytes)",
                    inner.cfg.max_frame_bytes
                ))));
            }
            Err(NotSent::Encode(e)) => {
                return Attempt::Done(Err(Error::Corrupt(format!("encode forwarded request: {e}"))))
            }
        };
        // While waiting, watch who leads: a leader that died without closing its connection never
        // answers, and a write cannot be re-sent elsewhere once it may have been proposed.
        let check_every = (inner.cfg.tick_interval * 2).max(Duration::from_millis(20));
        let lost = |reason: &'static str| {
            if op.idempotent() {
                Attempt::Retry { hint: None, error: Error::ForwardLost { group, leader: peer, reason } }
            } else {
                Attempt::Done(Err(Error::ForwardLost { group, leader: peer, reason }))
            }
        };
        loop {
            tokio::select! {
                delivery = &mut ticket.rx => {
                    return match delivery {
                        Ok(Delivery::Answer(Ok(reply))) => {
                            metrics.forward_outcome(label, "ok");
                            metrics.forward_seconds.observe(sent_at.elapsed().as_secs_f64());
                            Attempt::Done(Ok(reply))
                        }
                        Ok(Delivery::Answer(Err(WireError::NotLeader { hint }))) => {
                            metrics.forward_outcome(label, "not_leader");
                            Attempt::Retry { hint, error: Error::NotLeader { group, hint } }
                        }
                        Ok(Delivery::Answer(Err(WireError::GroupNotFound))) => {
                            // A stale hint named a node that no longer hosts the group.
                            metrics.forward_outcome(label, "not_leader");
                            Attempt::Retry { hint: None, error: WireError::GroupNotFound.into_error(group, peer) }
                        }
                        Ok(Delivery::Answer(Err(e))) => {
                            metrics.forward_outcome(label, "error");
                            Attempt::Done(Err(e.into_error(group, peer)))
                        }
                        Ok(Delivery::Lost) | Err(_) => {
                            metrics.forward_outcome(label, "lost");
                            lost("the connection to the leader broke")
                        }
                    };
                }
                () = tokio::time::sleep_until(deadline.into()) => {
                    metrics.forward_outcome(label, "timeout");
                    return Attempt::Done(Err(Error::Timeout { group, after: started.elapsed() }));
                }
                () = tokio::time::sleep(check_every) => {
                    // Only a change of this node's own view counts: it may lag behind the hint
                    // that brought the request to `peer`.
                    let moved = forward::local_leader(&inner.control, group)
                        .await
                        .filter(|l| *l != peer && Some(*l) != local_view);
                    if let Some(now) = moved {
                        metrics.forward_outcome(label, "lost");
                        return match lost("leadership moved to another node") {
                            Attempt::Retry { error, .. } => Attempt::Retry { hint: Some(now), error },
                            done => done,
                        };
                    }
                }
            }
        }
    }

    /// Sets a key.
    pub async fn put(&self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Result<()> {
        match self.propose(Command::Put { key: key.into(), value: value.into(), lease: None }).await? {
            CommandOutput::Put => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// Sets a key attached to a lease: it is deleted when the lease ends.
    pub async fn put_with_lease(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        lease: LeaseId,
    ) -> Result<()> {
        match self.propose(Command::Put { key: key.into(), value: value.into(), lease: Some(lease) }).await? {
            CommandOutput::Put => Ok(()),
            CommandOutput::LeaseNotFound(id) => Err(Error::LeaseNotFound(id)),
            other => Err(unexpected(other)),
        }
    }

    /// Deletes a key; true when it existed.
    pub async fn delete(&self, key: impl Into<Vec<u8>>) -> Result<bool> {
        match self.propose(Command::Delete { key: key.into() }).await? {
            CommandOutput::Delete { existed } => Ok(existed),
            other => Err(unexpected(other)),
        }
    }

    /// Sets `key` to `value` if its value is `expected` (`None`: if absent).
    pub async fn cas(
        &self,
        key: impl Into<Vec<u8>>,
        expected: Option<Vec<u8>>,
        value: impl Into<Vec<u8>>,
    ) -> Result<CasOutcome> {
        match self.propose(Command::Cas { key: key.into(), expected, value: value.into() }).await? {
            CommandOutput::Cas(o) => Ok(o),
            other => Err(unexpected(other)),
        }
    }

    /// Applies an atomic multi-key transaction (one log entry, one revision for all its changes).
    /// A put naming a lease that does not exist refuses the whole transaction (`LeaseNotFound`).
    pub async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        match self.propose(Command::Txn(txn)).await? {
            CommandOutput::Txn(r) => Ok(r),
            CommandOutput::LeaseNotFound(id) => Err(Error::LeaseNotFound(id)),
            other => Err(unexpected(other)),
        }
    }

    /// Linearizable get (ReadIndex through the leader).
    pub async fn get(&self, key: impl Into<Vec<u8>>) -> Result<Option<KeyValue>> {
        Ok(self.read(Query::Get { key: key.into() }, true).await?.kvs.pop())
    }

    /// Get from this replica's local state without contacting the leader; may be behind
    /// (`stale` is set in the output).
    pub async fn get_stale(&self, key: impl Into<Vec<u8>>) -> Result<ReadOutput> {
        self.read(Query::Get { key: key.into() }, false).await
    }

    /// Linearizable prefix range (at most `limit` keys, 0 = all).
    pub async fn range(&self, prefix: impl Into<Vec<u8>>, limit: usize) -> Result<Vec<KeyValue>> {
        Ok(self.range_at(prefix, limit).await?.kvs)
    }

    /// Linearizable prefix range with the log index it reflects: a [`Kv::watch`] from
    /// `applied_index + 1` follows it with nothing missed and nothing older (a replica
    /// that is behind, e.g. replaying its log after a restart, would show older states).
    pub async fn range_at(&self, prefix: impl Into<Vec<u8>>, limit: usize) -> Result<ReadOutput> {
        self.read(Query::Range { prefix: prefix.into(), limit }, true).await
    }

    /// Prefix range from local state (may be stale).
    pub async fn range_stale(&self, prefix: impl Into<Vec<u8>>, limit: usize) -> Result<ReadOutput> {
        self.read(Query::Range { prefix: prefix.into(), limit }, false).await
    }

    /// Watches committed changes under `prefix` starting at `from_revision` (0 = from now on).
    pub async fn watch(&self, prefix: impl Into<Vec<u8>>, from_revision: u64) -> Result<Watch> {
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        let prefix = prefix.into();
        let start_revision =
            self.store.group_call(self.group, |reply| GroupRequest::Watch { prefix, from_revision, tx, reply }).await?;
        Ok(Watch { start_revision, rx })
    }

    /// Grants a lease with a time to live; keep it alive with [`Kv::lease_keepalive`].
    pub async fn lease_grant(&self, ttl: Duration) -> Result<LeaseId> {
        if ttl < Duration::from_millis(1) || ttl > MAX_LEASE_TTL {
            return Err(Error::InvalidArgument(format!("lease TTL {ttl:?} is outside 1ms..={MAX_LEASE_TTL:?}")));
        }
        let id = rand::random::<u64>() | 1;
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        match self.propose(Command::LeaseGrant { id, ttl_ms }).await? {
            CommandOutput::LeaseGranted => Ok(id),
            other => Err(unexpected(other)),
        }
    }

    /// Renews a lease for another TTL (at the leader); returns the TTL in milliseconds.
    pub async fn lease_keepalive(&self, lease: LeaseId) -> Result<u64> {
        match self.route(ForwardOp::LeaseKeepAlive(lease)).await? {
            ForwardReply::LeaseTtl(ttl) => Ok(ttl),
            other => Err(Error::Corrupt(format!("unexpected answer to a keepalive: {other:?}"))),
        }
    }

    /// Ends a lease now, deleting its keys; true when it existed.
    pub async fn lease_revoke(&self, lease: LeaseId) -> Result<bool> {
        match self.propose(Command::LeaseRevoke { id: lease }).await? {
            CommandOutput::LeaseRevoked { existed } => Ok(existed),
            other => Err(unexpected(other)),
        }
    }
}

/// One try of a routed call.
enum Attempt {
    /// Final.
    Done(Result<ForwardReply>),
    /// Not proposed (or idempotent): try again, at `hint` if given.
    Retry { hint: Option<u64>, error: Error },
}
