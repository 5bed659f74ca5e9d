//! The driving loop: one thread runs every group of the process, TiKV style.
//!
//! Each iteration: take what arrived (raft messages, client requests), tick, then for every group
//! with a `Ready`: send its messages, apply committed entries, and put its entries and hard state
//! into ONE shared `LogBatch`; write that batch with one fsync (none when it holds only commit
//! indexes and compactions); then send the messages that had to
//! wait for persistence and advance. Idle groups hibernate (stop ticking) and are woken by traffic,
//! by a request, or when the node liveness tracker says their leader went quiet.

pub mod group;
pub mod request;
pub mod view;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use raft::eraftpb::{ConfState, Message, MessageType};
use raft::{RawNode, Ready, StateRole};
use raft_engine::LogBatch;
use tokio::sync::oneshot;

use self::group::Group;
use self::request::{Control, GroupRequest, Inbound};
use self::view::Views;
use crate::config::StoreConfig;
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::state_machine::KvState;
use crate::storage::{self, GroupStorage, LogEngine};
use crate::transport::Transport;

/// Most inbound items handled before the loop persists and sends (bounds latency under load).
const MAX_INBOX_PER_ITERATION: usize = 4096;

pub(crate) struct Engine {
    cfg: StoreConfig,
    log: Arc<LogEngine>,
    groups: HashMap<u64, Group>,
    dirty: HashSet<u64>,
    transport: Transport,
    /// Every group's applied state, for stale reads that do not go through this loop.
    views: Views,
    /// Groups stopped on this node after a broken invariant, and why.
    failed: HashMap<u64, String>,
    metrics: Arc<Metrics>,
    logger: slog::Logger,
    /// Writes produced after this iteration's batch (compactions); go out with the next one.
    deferred: LogBatch,
    stopping: bool,
}

fn raft_config(cfg: &StoreConfig, applied: u64) -> raft::Config {
    raft::Config {
        id: cfg.node_id,
        election_tick: cfg.election_ticks,
        heartbeat_tick: cfg.heartbeat_ticks,
        applied,
        // An append must fit in one transport frame, or it is dropped and re-sent forever.
        max_size_per_msg: (1 << 20).min(cfg.max_frame_bytes as u64 / 2),
        max_inflight_msgs: 256,
        pre_vote: true,
        // Reads use ReadIndex with a quorum round (Safe); no clock-based leader lease.
        read_only_option: raft::ReadOnlyOption::Safe,
        ..Default::default()
    }
}

impl Engine {
    /// Opens every group found in the log.
    pub(crate) fn open(
        cfg: StoreConfig,
        log: Arc<LogEngine>,
        transport: Transport,
        views: Views,
        metrics: Arc<Metrics>,
    ) -> Result<Self> {
        let logger = slog::Logger::root(crate::logging::TracingDrain, slog::o!());
        let mut engine = Engine {
            cfg,
            log,
            groups: HashMap::new(),
            dirty: HashSet::new(),
            transport,
            views,
            failed: HashMap::new(),
            metrics,
            logger,
            deferred: LogBatch::default(),
            stopping: false,
        };
        for gid in storage::stored_groups(&engine.log) {
            match engine.load_group(gid) {
                Ok(g) => {
                    engine.views.insert(gid, g.state.clone());
                    engine.groups.insert(gid, g);
                    engine.dirty.insert(gid);
                }
                // One unreadable group must not take the others down; it stays on disk for repair.
                Err(e) => tracing::error!(group = gid, error = %e, "cannot load raft group; skipping it"),
            }
        }
        engine.metrics.groups.set(i64::try_from(engine.groups.len()).unwrap_or(i64::MAX));
        tracing::info!(node = engine.cfg.node_id, groups = engine.groups.len(), "raft engine opened");
        Ok(engine)
    }

    fn load_group(&self, gid: u64) -> Result<Group> {
        let store = GroupStorage::load(self.log.clone(), gid)?;
        let snap = raft::Storage::snapshot(&store, 0, 0)?;
        let sm = KvState::from_bytes(snap.get_data())
            .map_err(|e| Error::Corrupt(format!("snapshot of group {gid}: {e}")))?;
        let applied = snap.get_metadata().index;
        let raw = RawNode::new(&raft_config(&self.cfg, applied), store, &self.logger)?;
        Ok(Group::new(gid, self.cfg.node_id, raw, sm, applied))
    }

    fn create_group(&mut self, gid: u64, voters: Vec<u64>, join: bool) -> Result<()> {
        if self.groups.contains_key(&gid) || self.failed.contains_key(&gid) {
            return Err(Error::GroupExists(gid));
        }
        if gid == 0 || gid > u64::MAX / 2 - 1 {
            return Err(Error::Config(format!("group id {gid} out of range")));
        }
        let conf_state = if join {
            None
        } else {
            if voters.is_empty() || voters.contains(&0) {
                return Err(Error::Config("a new group needs a non-empty list of non-zero voters".into()));
            }
            let mut cs = ConfState::default();
            cs.set_voters(voters);
            Some(cs)
        };
        let mut batch = LogBatch::default();
        let store = GroupStorage::create(self.log.clone(), gid, conf_state, &mut batch)?;
        self.write(&mut batch, true)?;
        let applied = store.snapshot_metadata().index;
        let raw = RawNode::new(&raft_config(&self.cfg, applied), store, &self.logger)?;
        let g = Group::new(gid, self.cfg.node_id, raw, KvState::default(), applied);
        self.views.insert(gid, g.state.clone());
        self.groups.insert(gid, g);
        self.dirty.insert(gid);
        self.metrics.groups.inc();
        Ok(())
    }

    fn destroy_group(&mut self, gid: u64) -> Result<()> {
        let was_failed = self.failed.remove(&gid).is_some();
        let was_live = self.groups.remove(&gid).is_some();
        if !was_live && !was_failed {
            return Err(Error::GroupNotFound(gid));
        }
        self.views.remove(gid);
        self.dirty.remove(&gid);
        let mut batch = LogBatch::default();
        GroupStorage::destroy(gid, &mut batch);
        self.write(&mut batch, true)?;
        if was_live {
            self.metrics.groups.dec();
        }
        Ok(())
    }

    /// Writes a batch; `sync` (and the `sync_log` setting) decide whether it is fsynced.
    fn write(&self, batch: &mut LogBatch, sync: bool) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let start = Instant::now();
        let sync = sync && self.cfg.sync_log;
        self.log
            .write(batch, sync)
            .map_err(|source| Error::Log { path: self.cfg.data_dir.display().to_string(), source })?;
        if sync {
            self.metrics.log_writes.inc();
        }
        self.metrics.log_write_seconds.observe(start.elapsed().as_secs_f64());
        Ok(())
    }

    /// Runs until shutdown. A failed log write stops the loop (fail-stop: nothing unpersisted is
    /// ever acknowledged) and returns why; a shutdown returns `None`.
    pub(crate) fn run(mut self, control: Receiver<Control>, inbound: Receiver<Inbound>) -> Option<String> {
        let tick = self.cfg.tick_interval;
        let mut next_tick = Instant::now() + tick;
        let mut last_prune = Instant::now();
        let mut last_purge = Instant::now();
        while !self.stopping {
            let now = Instant::now();
            let timeout = if self.dirty.is_empty() { next_tick.saturating_duration_since(now) } else { Duration::ZERO };
            crossbeam_channel::select! {
                recv(control) -> m => match m {
                    Ok(m) => self.on_control(m),
                    Err(_) => self.stopping = true,
                },
                recv(inbound) -> m => match m {
                    Ok(m) => self.on_inbound(m),
                    Err(_) => self.stopping = true,
                },
                default(timeout) => {},
            }
            let mut handled = 0;
            while handled < MAX_INBOX_PER_ITERATION {
                let mut any = false;
                if let Ok(m) = control.try_recv() {
                    self.on_control(m);
                    any = true;
                }
                if let Ok(m) = inbound.try_recv() {
                    self.on_inbound(m);
                    any = true;
                }
                if !any {
                    break;
                }
                handled += 1;
            }
            let now = Instant::now();
            if now >= next_tick {
                self.tick_all(now);
                next_tick = if now > next_tick + tick { now + tick } else { next_tick + tick };
            }
            if now.duration_since(last_prune) > Duration::from_secs(1) {
                last_prune = now;
                for g in self.groups.values_mut() {
                    g.prune_abandoned();
                }
            }
            if now.duration_since(last_purge) > Duration::from_secs(10) {
                last_purge = now;
                if let Err(e) = self.log.purge_expired_files() {
                    tracing::warn!(error = %e, "raft log purge failed");
                }
            }
            if let Err(e) = self.process_ready() {
                tracing::error!(error = %e, "raft log write failed; stopping the raft engine");
                return Some(format!("raft log write failed in {}: {e}", self.cfg.data_dir.display()));
            }
        }
        tracing::info!(node = self.cfg.node_id, "raft engine stopped");
        None
    }

    fn on_control(&mut self, m: Control) {
        match m {
            Control::Group { group, req } => self.on_group_request(group, req),
            Control::Create { group, voters, join, reply } => {
                let _ = reply.send(self.create_group(group, voters, join));
            }
            Control::Destroy { group, reply } => {
                let _ = reply.send(self.destroy_group(group));
            }
            Control::ListGroups { reply } => {
                let mut ids: Vec<u64> = self.groups.keys().copied().collect();
                ids.sort_unstable();
                let _ = reply.send(ids);
            }
            Control::Shutdown => self.stopping = true,
        }
    }

    fn on_group_request(&mut self, gid: u64, req: GroupRequest) {
        if let Some(reason) = self.failed.get(&gid) {
            fail_request(req, Error::GroupFailed { group: gid, reason: reason.clone() });
            return;
        }
        let Some(g) = self.groups.get_mut(&gid) else {
            fail_request(req, Error::GroupNotFound(gid));
            return;
        };
        if !matches!(req, GroupRequest::Status { .. }) {
            g.wake();
        }
        let metrics = &self.metrics;
        let handled = guard(|| match req {
            GroupRequest::Propose { cmd, reply } => {
                g.propose(cmd, reply);
                metrics.proposals.inc();
            }
            GroupRequest::Read { query, linearizable, reply } => g.read(query, linearizable, reply),
            GroupRequest::ChangeMembership { changes, reply } => g.change_membership(changes, reply),
            GroupRequest::TransferLeader { to, reply } => g.transfer_leader(to, reply),
            GroupRequest::LeaseKeepAlive { id, reply } => g.lease_keepalive(id, reply),
            GroupRequest::Watch { prefix, from_revision, tx, reply } => g.watch(prefix, from_revision, tx, reply),
            GroupRequest::Status { reply } => {
                let _ = reply.send(Ok(g.status()));
            }
        });
        match handled {
            Ok(()) => {
                self.dirty.insert(gid);
            }
            Err(reason) => self.fail_group(gid, reason),
        }
    }

    fn on_inbound(&mut self, m: Inbound) {
        match m {
            Inbound::Raft { group, msg } => {
                if self.failed.contains_key(&group) {
                    self.metrics.reject("failed_group");
                    return;
                }
                let Some(g) = self.groups.get_mut(&group) else {
                    self.metrics.reject("unknown_group");
                    tracing::warn!(group, from = msg.from, "raft message for a group this node does not host; dropped");
                    return;
                };
                let is_heartbeat =
                    matches!(msg.get_msg_type(), MessageType::MsgHeartbeat | MessageType::MsgHeartbeatResponse);
                if !is_heartbeat {
                    g.wake();
                }
                match guard(|| g.raw.step(msg)) {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::debug!(group, error = %e, "raft step refused a message"),
                    Err(reason) => {
                        self.fail_group(group, reason);
                        return;
                    }
                }
                self.dirty.insert(group);
            }
            Inbound::PeerConnected { peer } => {
                // A peer (re)connected: maybe it restarted. Wake groups it belongs to so their
                // leaders tell it who leads before its election timer fires.
                for g in self.groups.values_mut() {
                    if g.hibernating && g.raw.raft.prs().conf().voters().contains(peer) {
                        g.wake();
                    }
                }
            }
        }
    }

    fn tick_all(&mut self, now: Instant) {
        let threshold = self.cfg.hibernate_after_ticks;
        // Keepalives flow every tick on an idle connection; half an election timeout of silence
        // means the leader's node is gone. Waking then still leaves the group its own randomised
        // election timeout, so a hibernating group elects within ~2.5 election timeouts.
        let quiet_after = (self.cfg.election_timeout() / 2).max(self.cfg.tick_interval * 3);
        let mut hibernating = 0i64;
        let mut broken = Vec::new();
        for (gid, g) in self.groups.iter_mut() {
            if g.hibernating {
                // A hibernating follower wakes when its leader's node goes quiet.
                let leader = g.raw.raft.leader_id;
                let leader_alive = leader == self.cfg.node_id
                    || self.transport.last_seen(leader).is_some_and(|t| now.duration_since(t) < quiet_after);
                if leader_alive {
                    hibernating += 1;
                    continue;
                }
                tracing::debug!(group = gid, leader, "leader's node went quiet; waking group");
                g.wake();
            }
            if let Err(reason) = guard(|| g.raw.tick()) {
                broken.push((*gid, reason));
                continue;
            }
            g.idle_ticks = g.idle_ticks.saturating_add(1);
            g.expire_leases(now);
            if g.can_hibernate(threshold) {
                g.hibernating = true;
            }
            self.dirty.insert(*gid);
        }
        self.metrics.groups_hibernating.set(hibernating);
        for (gid, reason) in broken {
            self.fail_group(gid, reason);
        }
    }

    /// Takes a group's `Ready`: sends what may go before persistence, applies, and adds its
    /// entries and hard state to `batch`. Returns the ready and whether the batch must be synced.
    fn prepare(&self, gid: u64, g: &mut Group, batch: &mut LogBatch) -> std::result::Result<(Ready, bool), Prepared> {
        let mut must_sync = false;
        let mut rd = g.raw.ready();
        if let Some(ss) = rd.ss() {
            let (role, leader) = (ss.raft_state, ss.leader_id);
            if g.on_soft_state(role, leader).leader_changed {
                self.metrics.leader_changes.inc();
            }
            if role == StateRole::Leader {
                g.wake();
            }
        }
        send(&self.transport, &self.metrics, gid, rd.take_messages(), g);
        if !rd.snapshot().is_empty() {
            let snap = rd.snapshot().clone();
            g.restore(&snap).map_err(|e| Prepared::Broken(format!("cannot install snapshot: {e}")))?;
            g.raw.mut_store().install_snapshot(&snap, batch).map_err(Prepared::Log)?;
            must_sync = true;
            self.metrics.snapshots_installed.inc();
        }
        g.apply(rd.take_committed_entries()).map_err(|e| Prepared::Broken(format!("cannot apply entries: {e}")))?;
        must_sync |= !rd.entries().is_empty();
        g.raw.mut_store().append(rd.entries(), batch).map_err(Prepared::Log)?;
        if let Some(hs) = rd.hs() {
            must_sync |= g.raw.mut_store().set_hard_state(hs.clone(), batch).map_err(Prepared::Log)?;
        }
        if !rd.read_states().is_empty() {
            g.on_read_states(rd.take_read_states());
        }
        Ok((rd, must_sync))
    }

    /// Stops `gid` on this node after a broken invariant; the node's other groups go on.
    /// Requests to it fail with [`Error::GroupFailed`] until it is destroyed.
    fn fail_group(&mut self, gid: u64, reason: String) {
        self.dirty.remove(&gid);
        self.views.remove(gid);
        if self.groups.remove(&gid).is_some() {
            self.metrics.groups.dec();
        }
        self.metrics.groups_failed.inc();
        tracing::error!(
            group = gid, %reason,
            "raft group stopped on this node; the node's other groups go on (destroy the group here and join again to repair)"
        );
        self.failed.insert(gid, reason);
    }

    fn process_ready(&mut self) -> Result<()> {
        let mut batch = LogBatch::default();
        if !self.deferred.is_empty() {
            batch.merge(&mut self.deferred).map_err(|e| Error::Corrupt(format!("merge log batch: {e}")))?;
        }
        let mut readies: Vec<(u64, Group, Ready)> = Vec::new();
        // Whether this batch holds anything that must be durable before the messages waiting on
        // it are sent (entries, a snapshot, a new term or vote). A batch of commit indexes and
        // compactions alone is written without fsync: it becomes durable with the next synced
        // batch (the log is one sequential file), and losing it in a crash is safe.
        let mut must_sync = false;
        let dirty: Vec<u64> = self.dirty.drain().collect();
        for gid in dirty {
            let Some(mut g) = self.groups.remove(&gid) else { continue };
            if !g.raw.has_ready() {
                self.groups.insert(gid, g);
                continue;
            }
            match guard(|| self.prepare(gid, &mut g, &mut batch)) {
                Ok(Ok((rd, sync))) => {
                    must_sync |= sync;
                    readies.push((gid, g, rd));
                }
                // The log batch could not be built: fail-stop, as for a failed write.
                Ok(Err(Prepared::Log(e))) => return Err(e),
                Ok(Err(Prepared::Broken(reason))) | Err(reason) => self.fail_group(gid, reason),
            }
        }
        self.write(&mut batch, must_sync)?;
        for (gid, mut g, mut rd) in readies {
            let (transport, metrics, interval) = (&self.transport, &self.metrics, self.cfg.snapshot_interval);
            let deferred = &mut self.deferred;
            let finished = guard(|| -> std::result::Result<bool, String> {
                send(transport, metrics, gid, rd.take_persisted_messages(), &mut g);
                let mut light = g.raw.advance(rd);
                // A commit index in `light` is persisted with the next hard state; losing it in
                // a crash is safe (recomputed).
                send(transport, metrics, gid, light.take_messages(), &mut g);
                g.apply(light.take_committed_entries()).map_err(|e| format!("cannot apply entries: {e}"))?;
                g.raw.advance_apply();
                g.issue_deferred_reads();
                g.maybe_compact(interval, deferred).map_err(|e| format!("cannot compact: {e}"))
            });
            match finished {
                Ok(Ok(compacted)) => {
                    if compacted {
                        self.metrics.compactions.inc();
                        self.dirty.insert(gid);
                    }
                    if g.raw.has_ready() {
                        self.dirty.insert(gid);
                    }
                    self.groups.insert(gid, g);
                }
                Ok(Err(reason)) | Err(reason) => self.fail_group(gid, reason),
            }
        }
        if !self.deferred.is_empty() && self.dirty.is_empty() {
            // A compaction alone needs no fsync of its own: losing it in a crash only means the
            // group restarts from its previous snapshot and a longer log. It becomes durable with
            // the next synced batch, so the loop still fsyncs at most once per iteration.
            let mut deferred = std::mem::take(&mut self.deferred);
            self.write(&mut deferred, false)?;
        }
        Ok(())
    }
}

fn fail_request(req: GroupRequest, e: Error) {
    fn fail<T>(reply: oneshot::Sender<Result<T>>, e: Error) {
        let _ = reply.send(Err(e));
    }
    match req {
        GroupRequest::Propose { reply, .. } => fail(reply, e),
        GroupRequest::Read { reply, .. } => fail(reply, e),
        GroupRequest::ChangeMembership { reply, .. } => fail(reply, e),
        GroupRequest::TransferLeader { reply, .. } => fail(reply, e),
        GroupRequest::LeaseKeepAlive { reply, .. } => fail(reply, e),
        GroupRequest::Watch { reply, .. } => fail(reply, e),
        GroupRequest::Status { reply } => fail(reply, e),
    }
}

/// Why a group's `Ready` could not be prepared.
enum Prepared {
    /// Building the log batch failed: the loop stops (fail-stop).
    Log(Error),
    /// The group's own state is unusable: only the group stops.
    Broken(String),
}

/// Runs `f`, which works on one group; a panic inside (the raft library asserting an invariant
/// the group's state broke, e.g. a member whose log was lost) comes back as its message, so that
/// only that group stops and not the process.
fn guard<R>(f: impl FnOnce() -> R) -> std::result::Result<R, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        let text = p
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_owned());
        format!("the raft library panicked: {text}")
    })
}

/// Sends a group's messages; reports unreachable peers and snapshot outcomes to raft.
fn send(transport: &Transport, metrics: &Metrics, gid: u64, msgs: Vec<Message>, g: &mut Group) {
    for msg in msgs {
        let to = msg.to;
        let is_snapshot = msg.get_msg_type() == MessageType::MsgSnapshot;
        let sent = transport.send(gid, msg);
        if is_snapshot {
            let status = if sent { raft::SnapshotStatus::Finish } else { raft::SnapshotStatus::Failure };
            if sent {
                metrics.snapshots_sent.inc();
            }
            g.raw.report_snapshot(to, status);
        } else if !sent {
            g.raw.report_unreachable(to);
        }
    }
}
