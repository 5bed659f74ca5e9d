//! One raft group on this node: its RawNode, state machine, and everyone waiting on it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Instant;

use protobuf::Message as _;
use raft::eraftpb::{ConfChangeSingle, ConfChangeType, ConfChangeV2, ConfState, Entry, EntryType, Snapshot};
use raft::{RawNode, ReadState, StateRole};
use raft_engine::LogBatch;
use tokio::sync::{mpsc, oneshot};

use super::request::{GroupStatus, Membership, MembershipChange, Query, ReadOutput};
use super::view::{Applied, SharedApplied};
use crate::error::{Error, Result};
use crate::state_machine::command::Proposal;
use crate::state_machine::{Command, CommandOutput, KvState, WatchEvent};
use crate::storage::GroupStorage;

/// Committed changes kept in memory for watches that start in the past.
const WATCH_HISTORY: usize = 4096;

struct Watcher {
    prefix: Vec<u8>,
    /// First revision reported (a watch may start past what this replica applied so far).
    from: u64,
    tx: mpsc::Sender<WatchEvent>,
}

/// What the loop must do after a group applied entries.
#[derive(Default)]
pub(crate) struct ApplyEffects {
    /// Leadership changed hands (for metrics).
    pub leader_changed: bool,
}

pub(crate) struct Group {
    pub id: u64,
    pub node_id: u64,
    pub raw: RawNode<GroupStorage>,
    /// The applied state machine, shared with stale readers ([`SharedApplied`]).
    pub state: SharedApplied,
    applied: u64,
    next_request_id: u64,
    proposals: HashMap<u64, oneshot::Sender<Result<CommandOutput>>>,
    conf_changes: HashMap<u64, oneshot::Sender<Result<Membership>>>,
    reads: HashMap<u64, (Query, oneshot::Sender<Result<ReadOutput>>)>,
    /// Reads whose read index is known, waiting for apply to reach it.
    waiting_reads: Vec<(u64, u64)>,
    /// Reads that reached a new leader before it committed an entry of its term: raft 0.7 drops
    /// such a ReadIndex silently, so they wait here and are issued once the term's first entry
    /// commits.
    deferred_reads: Vec<u64>,
    watchers: Vec<Watcher>,
    history: VecDeque<WatchEvent>,
    /// Every revision above this is in `history`.
    history_floor: u64,
    /// Leader-local lease deadlines (etcd's design: expiry is decided by the leader's clock).
    lease_deadlines: HashMap<u64, Instant>,
    leases_revoking: HashSet<u64>,
    pub role: StateRole,
    pub leader: u64,
    pub idle_ticks: u32,
    pub hibernating: bool,
}

fn role_name(role: StateRole) -> &'static str {
    match role {
        StateRole::Leader => "leader",
        StateRole::Follower => "follower",
        StateRole::Candidate => "candidate",
        StateRole::PreCandidate => "pre_candidate",
    }
}

fn membership(cs: &ConfState) -> Membership {
    let mut m = Membership {
        voters: cs.get_voters().to_vec(),
        voters_outgoing: cs.get_voters_outgoing().to_vec(),
        learners: cs.get_learners().to_vec(),
    };
    m.voters.sort_unstable();
    m.voters_outgoing.sort_unstable();
    m.learners.sort_unstable();
    m
}

/// When a lease of `ttl_ms` renewed at `now` expires. Saturates far in the future instead of
/// overflowing (an `Instant` overflow panics, and would do so on every leader replaying the entry).
fn lease_deadline(now: Instant, ttl_ms: u64) -> Instant {
    const FAR: std::time::Duration = std::time::Duration::from_secs(100 * 365 * 24 * 3600);
    now.checked_add(std::time::Duration::from_millis(ttl_ms).min(FAR)).unwrap_or(now)
}

fn context(origin: u64, id: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(16);
    v.extend_from_slice(&origin.to_be_bytes());
    v.extend_from_slice(&id.to_be_bytes());
    v
}

fn parse_context(ctx: &[u8]) -> Option<(u64, u64)> {
    let origin = u64::from_be_bytes(ctx.get(..8)?.try_into().ok()?);
    let id = u64::from_be_bytes(ctx.get(8..16)?.try_into().ok()?);
    Some((origin, id))
}

impl Group {
    pub(crate) fn new(id: u64, node_id: u64, raw: RawNode<GroupStorage>, sm: KvState, applied: u64) -> Self {
        Group {
            id,
            node_id,
            raw,
            state: SharedApplied::new(sm, applied),
            applied,
            // Random start: ids of a previous incarnation replayed from the log never match ours.
            next_request_id: rand::random::<u64>() >> 1,
            proposals: HashMap::new(),
            conf_changes: HashMap::new(),
            reads: HashMap::new(),
            waiting_reads: Vec::new(),
            deferred_reads: Vec::new(),
            watchers: Vec::new(),
            history: VecDeque::new(),
            history_floor: applied,
            lease_deadlines: HashMap::new(),
            leases_revoking: HashSet::new(),
            role: StateRole::Follower,
            leader: 0,
            idle_ticks: 0,
            hibernating: false,
        }
    }

    fn next_id(&mut self) -> u64 {
        self.next_request_id = self.next_request_id.wrapping_add(1);
        self.next_request_id
    }

    fn not_leader(&self) -> Error {
        Error::NotLeader { group: self.id, hint: (self.raw.raft.leader_id != 0).then_some(self.raw.raft.leader_id) }
    }

    fn is_leader(&self) -> bool {
        self.raw.raft.state == StateRole::Leader && self.raw.raft.lead_transferee.is_none()
    }

    pub(crate) fn wake(&mut self) {
        self.idle_ticks = 0;
        self.hibernating = false;
    }

    pub(crate) fn has_waiters(&self) -> bool {
        !self.proposals.is_empty() || !self.reads.is_empty() || !self.conf_changes.is_empty()
    }

    /// Whether the group may stop ticking now. Followers go first (`threshold`), leaders wait twice
    /// as long, so a leader never goes silent while a follower still counts towards an election.
    pub(crate) fn can_hibernate(&self, threshold: u32) -> bool {
        if threshold == 0 || self.has_waiters() || !self.waiting_reads.is_empty() || !self.deferred_reads.is_empty() {
            return false;
        }
        let raft = &self.raw.raft;
        match raft.state {
            StateRole::Leader => {
                let last = raft.raft_log.last_index();
                self.idle_ticks >= threshold.saturating_mul(2)
                    && self.lease_deadlines.is_empty()
                    && raft.raft_log.committed == last
                    && raft.lead_transferee.is_none()
                    && !raft.has_pending_conf()
                    && raft.prs().iter().all(|(_, p)| p.matched == last)
            }
            StateRole::Follower => self.idle_ticks >= threshold && raft.leader_id != 0,
            _ => false,
        }
    }

    pub(crate) fn propose(&mut self, cmd: Command, reply: oneshot::Sender<Result<CommandOutput>>) {
        if !self.is_leader() {
            let _ = reply.send(Err(self.not_leader()));
            return;
        }
        let request_id = self.next_id();
        let data = match postcard::to_stdvec(&Proposal { origin: self.node_id, request_id, command: cmd }) {
            Ok(d) => d,
            Err(e) => {
                let _ = reply.send(Err(Error::Corrupt(format!("encode proposal: {e}"))));
                return;
            }
        };
        match self.raw.propose(Vec::new(), data) {
            Ok(()) => {
                self.proposals.insert(request_id, reply);
            }
            Err(raft::Error::ProposalDropped) => {
                let _ = reply.send(Err(self.not_leader()));
            }
            Err(e) => {
                let _ = reply.send(Err(e.into()));
            }
        }
    }

    /// Proposes without anyone waiting (lease expiry).
    fn propose_internal(&mut self, cmd: Command) {
        let (tx, _rx) = oneshot::channel();
        self.propose(cmd, tx);
    }

    pub(crate) fn read(&mut self, query: Query, linearizable: bool, reply: oneshot::Sender<Result<ReadOutput>>) {
        if !linearizable {
            let _ = reply.send(Ok(self.serve(&query, true)));
            return;
        }
        if !self.is_leader() {
            let _ = reply.send(Err(self.not_leader()));
            return;
        }
        let id = self.next_id();
        self.reads.insert(id, (query, reply));
        if self.raw.raft.commit_to_current_term() {
            self.raw.read_index(context(self.node_id, id));
        } else {
            self.deferred_reads.push(id);
        }
    }

    /// Leader: issues the reads deferred until an entry of this term committed.
    pub(crate) fn issue_deferred_reads(&mut self) {
        if self.deferred_reads.is_empty() || !self.is_leader() || !self.raw.raft.commit_to_current_term() {
            return;
        }
        for id in std::mem::take(&mut self.deferred_reads) {
            // Skip reads whose caller gave up meanwhile.
            if self.reads.contains_key(&id) {
                self.raw.read_index(context(self.node_id, id));
            }
        }
    }

    fn serve(&self, query: &Query, stale: bool) -> ReadOutput {
        self.state.read().serve(query, stale)
    }

    pub(crate) fn on_read_states(&mut self, states: Vec<ReadState>) {
        for rs in states {
            let Some((_, id)) = parse_context(&rs.request_ctx) else { continue };
            self.waiting_reads.push((rs.index, id));
        }
        self.serve_waiting_reads();
    }

    fn serve_waiting_reads(&mut self) {
        let applied = self.applied;
        let mut i = 0;
        while i < self.waiting_reads.len() {
            let (index, id) = self.waiting_reads[i];
            if index <= applied {
                self.waiting_reads.swap_remove(i);
                if let Some((query, reply)) = self.reads.remove(&id) {
                    let _ = reply.send(Ok(self.serve(&query, false)));
                }
            } else {
                i += 1;
            }
        }
    }

    pub(crate) fn change_membership(
        &mut self,
        changes: Vec<MembershipChange>,
        reply: oneshot::Sender<Result<Membership>>,
    ) {
        if !self.is_leader() {
            let _ = reply.send(Err(self.not_leader()));
            return;
        }
        // raft silently turns a second pending change into an empty entry; refuse it instead.
        if self.raw.raft.has_pending_conf() || !self.raw.raft.prs().conf().to_conf_state().voters_outgoing.is_empty() {
            let _ = reply.send(Err(Error::ConfChange("another membership change is still in progress".into())));
            return;
        }
        if changes.is_empty() {
            let _ = reply.send(Err(Error::ConfChange("no change requested".into())));
            return;
        }
        let mut cc = ConfChangeV2::default();
        for c in &changes {
            let mut single = ConfChangeSingle::default();
            let (ty, node) = match *c {
                MembershipChange::AddLearner(n) => (ConfChangeType::AddLearnerNode, n),
                MembershipChange::AddVoter(n) => (ConfChangeType::AddNode, n),
                MembershipChange::Remove(n) => (ConfChangeType::RemoveNode, n),
            };
            if node == 0 {
                let _ = reply.send(Err(Error::ConfChange("node id 0 is invalid".into())));
                return;
            }
            single.set_change_type(ty);
            single.node_id = node;
            cc.mut_changes().push(single);
        }
        let id = self.next_id();
        match self.raw.propose_conf_change(context(self.node_id, id), cc) {
            Ok(()) => {
                self.conf_changes.insert(id, reply);
            }
            Err(raft::Error::ProposalDropped) => {
                let _ = reply.send(Err(self.not_leader()));
            }
            Err(e) => {
                let _ = reply.send(Err(Error::ConfChange(e.to_string())));
            }
        }
    }

    pub(crate) fn transfer_leader(&mut self, to: u64, reply: oneshot::Sender<Result<()>>) {
        if self.raw.raft.state != StateRole::Leader {
            let _ = reply.send(Err(self.not_leader()));
            return;
        }
        if !self.raw.raft.prs().conf().voters().contains(to) {
            let _ = reply.send(Err(Error::ConfChange(format!("node {to} is not a voter of group {}", self.id))));
            return;
        }
        self.raw.transfer_leader(to);
        let _ = reply.send(Ok(()));
    }

    pub(crate) fn lease_keepalive(&mut self, id: u64, reply: oneshot::Sender<Result<u64>>) {
        if !self.is_leader() {
            let _ = reply.send(Err(self.not_leader()));
            return;
        }
        let ttl = self.state.read().sm.leases().find(|(l, _)| *l == id).map(|(_, ttl)| ttl);
        match ttl {
            Some(ttl) if !self.leases_revoking.contains(&id) => {
                self.lease_deadlines.insert(id, lease_deadline(Instant::now(), ttl));
                let _ = reply.send(Ok(ttl));
            }
            _ => {
                let _ = reply.send(Err(Error::LeaseNotFound(id)));
            }
        }
    }

    /// Leader: revoke leases whose deadline passed.
    pub(crate) fn expire_leases(&mut self, now: Instant) {
        if self.raw.raft.state != StateRole::Leader {
            return;
        }
        let expired: Vec<u64> = self
            .lease_deadlines
            .iter()
            .filter(|(id, d)| **d <= now && !self.leases_revoking.contains(id))
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            tracing::debug!(group = self.id, lease = id, "lease expired; revoking");
            self.leases_revoking.insert(id);
            self.propose_internal(Command::LeaseRevoke { id });
        }
    }

    pub(crate) fn watch(
        &mut self,
        prefix: Vec<u8>,
        from_revision: u64,
        tx: mpsc::Sender<WatchEvent>,
        reply: oneshot::Sender<Result<u64>>,
    ) {
        let start = if from_revision == 0 { self.applied + 1 } else { from_revision };
        if start <= self.history_floor {
            let _ = reply.send(Err(Error::Compacted { requested: start, oldest: self.history_floor + 1 }));
            return;
        }
        for ev in self.history.iter().filter(|e| e.revision >= start && e.key.starts_with(&prefix)) {
            if tx.try_send(ev.clone()).is_err() {
                let _ = reply.send(Err(Error::Compacted { requested: start, oldest: ev.revision }));
                return;
            }
        }
        self.watchers.push(Watcher { prefix, from: start, tx });
        let _ = reply.send(Ok(start));
    }

    fn publish(&mut self, events: Vec<WatchEvent>) {
        for ev in events {
            // A watcher that cannot keep up is closed rather than buffered without bound; it
            // resumes with a new watch from its last revision + 1.
            self.watchers.retain(|w| {
                ev.revision < w.from || !ev.key.starts_with(&w.prefix) || w.tx.try_send(ev.clone()).is_ok()
            });
            self.history.push_back(ev);
            if self.history.len() > WATCH_HISTORY {
                if let Some(old) = self.history.pop_front() {
                    self.history_floor = old.revision;
                }
            }
        }
    }

    pub(crate) fn status(&self) -> GroupStatus {
        let raft = &self.raw.raft;
        GroupStatus {
            group: self.id,
            node: self.node_id,
            role: role_name(raft.state).to_owned(),
            leader: (raft.leader_id != 0).then_some(raft.leader_id),
            term: raft.term,
            commit: raft.raft_log.committed,
            applied: self.applied,
            last_index: raft.raft_log.last_index(),
            snapshot_index: self.raw.store().snapshot_metadata().index,
            membership: membership(&raft.prs().conf().to_conf_state()),
            hibernating: self.hibernating,
        }
    }

    /// Reacts to a role change reported in a Ready.
    pub(crate) fn on_soft_state(&mut self, role: StateRole, leader: u64) -> ApplyEffects {
        let was_leader = self.role == StateRole::Leader;
        let effects = ApplyEffects { leader_changed: leader != self.leader };
        self.role = role;
        self.leader = leader;
        if was_leader && role != StateRole::Leader {
            let group = self.id;
            for (_, reply) in self.proposals.drain() {
                let _ = reply.send(Err(Error::LeadershipLost { group }));
            }
            for (_, reply) in self.conf_changes.drain() {
                let _ = reply.send(Err(Error::LeadershipLost { group }));
            }
            let hint = (leader != 0).then_some(leader);
            for (_, (_, reply)) in self.reads.drain() {
                let _ = reply.send(Err(Error::NotLeader { group, hint }));
            }
            self.waiting_reads.clear();
            self.deferred_reads.clear();
            self.lease_deadlines.clear();
            self.leases_revoking.clear();
        }
        if !was_leader && role == StateRole::Leader {
            // A new leader gives every lease a full TTL from now (it cannot know the old clock).
            let now = Instant::now();
            self.lease_deadlines =
                self.state.read().sm.leases().map(|(id, ttl)| (id, lease_deadline(now, ttl))).collect();
        }
        effects
    }

    /// Drops waiters whose caller gave up (timed out).
    pub(crate) fn prune_abandoned(&mut self) {
        self.proposals.retain(|_, r| !r.is_closed());
        self.conf_changes.retain(|_, r| !r.is_closed());
        self.reads.retain(|_, (_, r)| !r.is_closed());
        // A leader that never commits in its term (cut off from its quorum) must not collect ids.
        let reads = &self.reads;
        self.deferred_reads.retain(|id| reads.contains_key(id));
        self.waiting_reads.retain(|(_, id)| reads.contains_key(id));
    }

    /// Replaces the state machine with a snapshot received from the leader.
    pub(crate) fn restore(&mut self, snap: &Snapshot) -> Result<()> {
        let sm = KvState::from_bytes(snap.get_data())
            .map_err(|e| Error::Corrupt(format!("snapshot of group {}: {e}", self.id)))?;
        self.applied = snap.get_metadata().index;
        *self.state.write() = Applied { sm, index: self.applied };
        self.history.clear();
        self.history_floor = self.applied;
        // Watchers cannot be told what changed across a snapshot: close them; they re-watch.
        self.watchers.clear();
        Ok(())
    }

    /// Applies committed entries.
    pub(crate) fn apply(&mut self, entries: Vec<Entry>) -> Result<()> {
        for e in entries {
            if e.index <= self.applied {
                continue;
            }
            match e.get_entry_type() {
                EntryType::EntryNormal => self.apply_normal(&e)?,
                EntryType::EntryConfChangeV2 | EntryType::EntryConfChange => self.apply_conf_change(&e)?,
            }
            self.applied = e.index;
            self.state.write().index = e.index;
        }
        self.serve_waiting_reads();
        Ok(())
    }

    fn apply_normal(&mut self, e: &Entry) -> Result<()> {
        if e.data.is_empty() {
            return Ok(()); // a new leader's empty entry
        }
        let proposal: Proposal = postcard::from_bytes(&e.data)
            .map_err(|err| Error::Corrupt(format!("group {} entry {}: {err}", self.id, e.index)))?;
        let lease_change = match &proposal.command {
            Command::LeaseGrant { id, ttl_ms } => Some((*id, Some(*ttl_ms))),
            Command::LeaseRevoke { id } => Some((*id, None)),
            _ => None,
        };
        let mut events = Vec::new();
        let out = {
            let mut state = self.state.write();
            state.index = e.index;
            state.sm.apply(e.index, proposal.command, &mut events)
        };
        if let Some((id, ttl)) = lease_change {
            match ttl {
                Some(ttl) if self.raw.raft.state == StateRole::Leader => {
                    self.lease_deadlines.insert(id, lease_deadline(Instant::now(), ttl));
                }
                Some(_) => {}
                None => {
                    self.lease_deadlines.remove(&id);
                    self.leases_revoking.remove(&id);
                }
            }
        }
        self.publish(events);
        if proposal.origin == self.node_id {
            if let Some(reply) = self.proposals.remove(&proposal.request_id) {
                let _ = reply.send(Ok(out));
            }
        }
        Ok(())
    }

    fn apply_conf_change(&mut self, e: &Entry) -> Result<()> {
        let cc = if e.get_entry_type() == EntryType::EntryConfChangeV2 {
            ConfChangeV2::parse_from_bytes(&e.data)
        } else {
            raft::eraftpb::ConfChange::parse_from_bytes(&e.data).map(|c| {
                let mut single = ConfChangeSingle::default();
                single.set_change_type(c.get_change_type());
                single.node_id = c.node_id;
                let mut v2 = ConfChangeV2::default();
                v2.mut_changes().push(single);
                v2
            })
        }
        .map_err(|err| Error::Corrupt(format!("group {} conf change {}: {err}", self.id, e.index)))?;
        let result = self.raw.apply_conf_change(&cc).map(|cs| membership(&cs));
        if let Err(err) = &result {
            tracing::warn!(group = self.id, index = e.index, error = %err, "conf change not applied");
        }
        if let Some((origin, id)) = parse_context(&e.context) {
            if origin == self.node_id {
                if let Some(reply) = self.conf_changes.remove(&id) {
                    let _ = reply.send(result.map_err(|err| Error::ConfChange(err.to_string())));
                }
            }
        }
        Ok(())
    }

    /// Takes a state-machine snapshot and compacts the log when enough entries were applied.
    pub(crate) fn maybe_compact(&mut self, interval: u64, batch: &mut LogBatch) -> Result<bool> {
        let snap_index = self.raw.store().snapshot_metadata().index;
        // A member refuses a snapshot whose membership lacks it (raft's `restore`), and a node
        // added to a group always needs one (the log starts after the initial snapshot): so
        // after a membership change, snapshot at once, or an idle group never catches it up.
        let conf = self.raw.raft.prs().conf().to_conf_state();
        let members_changed = !same_members(self.raw.store().snapshot_metadata().get_conf_state(), &conf);
        if interval == 0 || self.applied <= snap_index || (self.applied < snap_index + interval && !members_changed) {
            return Ok(false);
        }
        let term = self.raw.raft.raft_log.term(self.applied)?;
        let mut snap = Snapshot::default();
        snap.set_data(
            self.state.read().sm.to_bytes().map_err(|e| Error::Corrupt(format!("encode snapshot: {e}")))?.into(),
        );
        let meta = snap.mut_metadata();
        meta.index = self.applied;
        meta.term = term;
        meta.set_conf_state(self.raw.raft.prs().conf().to_conf_state());
        let commit = self.raw.raft.raft_log.committed;
        let store = self.raw.mut_store();
        // The snapshot's index must never exceed the durable commit index (raft asserts
        // applied <= commit on restart), and the light-ready commit is not persisted by itself.
        store.set_commit(commit, batch)?;
        store.compact_to_snapshot(&snap, batch)?;
        Ok(true)
    }
}

/// Whether two membership configurations have the same members in the same roles.
fn same_members(a: &raft::eraftpb::ConfState, b: &raft::eraftpb::ConfState) -> bool {
    let sorted = |v: &[u64]| {
        let mut v = v.to_vec();
        v.sort_unstable();
        v
    };
    sorted(a.get_voters()) == sorted(b.get_voters())
        && sorted(a.get_learners()) == sorted(b.get_learners())
        && sorted(a.get_voters_outgoing()) == sorted(b.get_voters_outgoing())
        && sorted(a.get_learners_next()) == sorted(b.get_learners_next())
}
