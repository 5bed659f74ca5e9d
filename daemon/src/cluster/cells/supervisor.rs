//! The replica supervisor: makes this host's local replicas match the `kernels/` records
//! of the meta group (F-cluster, "Cluster in one paragraph").
//!
//! For each kernel with a replica placed here it starts an ipykernel under the kernel's
//! cluster-wide id (`Kernels::create_replica`), creates the kernel's raft group — or,
//! for a replica that replaces a lost one, joins the existing group — starts the
//! namespace applier, and once the replica caught up with the group puts
//! `ready/{kernel}/{node}`. While this host leads a kernel's group it changes the
//! group's voters to the record's hosts (adds the replacement, removes the lost host).
//! A deleted kernel, or a replica moved elsewhere, is stopped and its group replica
//! destroyed. On daemon restart the watch replays every record, so the replicas placed
//! here are re-created and catch up from the group (its log survived in the store).
//!
//! A kernel deleted while this host was down leaves its group replica here, which would
//! talk to peers that no longer host it for ever: every [`UNKNOWN_EVERY`] the supervisor
//! lists its kernel groups against the records (read through the meta leader) and destroys
//! one no record names at two looks in a row (`notebookos_sync_groups_unknown` counts them).
//!
//! A local group replica the store stopped after a broken invariant (`GroupFailed`: its
//! log was lost while the group still counted it) cannot be repaired in place; the
//! supervisor asks the meta leader to re-place that replica on another host, and the
//! resulting record stops it here (its group replica destroyed) like any moved replica.
//!
//! Which replicas join instead of found: the meta leader numbers a kernel's founding
//! replicas `1..=n` and a replacement `max + 1` (`Cluster::replace_replica_here`), so a
//! replica numbered above the record's replica count was placed after the group existed.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use raft_store::MembershipChange;
use tokio::task::JoinHandle;

use super::replica_host::ReplicaHost;
use crate::cluster::control::meta::{Cluster, KernelEvent};
use crate::cluster::control::records::{KernelRecord, ReplicaRecord, FIRST_KERNEL_GROUP};

/// How often the supervisor re-checks the groups it leads (membership) and retries.
const RECONCILE_EVERY: Duration = Duration::from_millis(500);
/// How long the group's leader waits after a record changed its hosts before it changes
/// the voters (see [`Supervisor::reconcile_membership`]).
const MEMBERSHIP_GRACE: Duration = Duration::from_secs(1);
/// Pause between re-placement requests for a replica whose group failed here.
const REPAIR_EVERY: Duration = Duration::from_secs(5);
/// How often the supervisor looks for kernel groups no record names.
const UNKNOWN_EVERY: Duration = Duration::from_secs(5);
/// How long a new replica may take to catch up before the attempt is retried.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(120);

/// A replica this host runs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Running {
    replica: u32,
    group: u64,
}

/// Whether `r` was placed after its kernel's group was founded (see the module docs).
pub fn is_replacement(record: &KernelRecord, r: &ReplicaRecord) -> bool {
    usize::try_from(r.replica).unwrap_or(usize::MAX) > record.replicas.len()
}

/// The supervisor of this host's replicas.
pub struct Supervisor {
    cluster: Arc<Cluster>,
    host: Arc<ReplicaHost>,
    running: HashMap<String, Running>,
    /// Latest record of every kernel with a replica here, and when it was first seen.
    records: HashMap<String, KernelRecord>,
    /// When a record asking for a voter change was first seen (kernel → (record, since)).
    pending_membership: HashMap<String, (KernelRecord, std::time::Instant)>,
    /// Catch-up-then-ready tasks, by kernel.
    readying: HashMap<String, JoinHandle<()>>,
    /// Replicas that failed to start: when to try again, and how many failures in a row.
    retry: HashMap<String, (Instant, u32)>,
    /// Replicas whose group failed here: when to ask for their re-placement again.
    repairing: HashMap<String, Instant>,
    /// Kernels whose replica here is quiesced for a move (this host put the mark).
    quiesced: BTreeSet<String>,
    /// Kernel groups no record named at the last look, and when that look was.
    unknown: (BTreeSet<u64>, Instant),
}

impl Supervisor {
    /// Starts supervising: returns the task (abort it to stop supervising; replicas stay).
    pub fn start(cluster: Arc<Cluster>, host: Arc<ReplicaHost>) -> JoinHandle<()> {
        let mut sup = Supervisor {
            cluster,
            host,
            running: HashMap::new(),
            records: HashMap::new(),
            readying: HashMap::new(),
            pending_membership: HashMap::new(),
            retry: HashMap::new(),
            repairing: HashMap::new(),
            quiesced: BTreeSet::new(),
            unknown: (BTreeSet::new(), Instant::now()),
        };
        tokio::spawn(async move { sup.run().await })
    }

    async fn run(&mut self) {
        let mut events = loop {
            match self.cluster.watch_kernels().await {
                Ok(rx) => break rx,
                Err(e) => {
                    tracing::debug!(error = %e, "supervisor: kernels/ not readable yet; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        };
        let mut tick = tokio::time::interval(RECONCILE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                ev = events.recv() => match ev {
                    Some(KernelEvent::Put(record)) => self.on_put(record).await,
                    Some(KernelEvent::Delete(id)) => self.on_delete(&id).await,
                    None => {
                        tracing::warn!("supervisor: the kernel watch ended");
                        return;
                    }
                },
                _ = tick.tick() => {
                    self.reconcile_all().await;
                    if self.unknown.1.elapsed() >= UNKNOWN_EVERY {
                        self.destroy_unknown_groups().await;
                    }
                }
            }
        }
    }

    async fn on_put(&mut self, record: KernelRecord) {
        // A record is written by any host's cluster API; its id becomes a directory and
        // cgroup name here, so one that is not a UUID is never started (nor retried).
        if !crate::kernel::is_kernel_id(&record.id) {
            tracing::warn!(kernel = ?record.id, "kernel record with an id that is not a UUID; not starting it");
            return;
        }
        let me = self.cluster.node_id();
        let mine = record.replica_on(me);
        let id = record.id.clone();
        match (mine, self.running.get(&id).cloned()) {
            (Some(r), None) => {
                self.records.insert(id.clone(), record.clone());
                if let Err(e) = self.start_replica(&record, &r).await {
                    tracing::error!(kernel = %id, replica = r.replica, error = format!("{e:#}"), "could not start the local replica; retrying");
                }
            }
            (Some(r), Some(run)) if run.replica != r.replica => {
                // Re-placed here under a new number (after this host was given up for lost).
                self.stop_replica(&id).await;
                self.records.insert(id.clone(), record.clone());
                if let Err(e) = self.start_replica(&record, &r).await {
                    tracing::error!(kernel = %id, error = format!("{e:#}"), "could not restart the local replica");
                }
            }
            (Some(_), Some(_)) => {
                self.records.insert(id.clone(), record.clone());
                self.quiesce(&record).await;
                self.reconcile_membership(&record).await;
            }
            (None, Some(_)) => {
                tracing::info!(kernel = %id, "the replica was placed elsewhere; stopping it here");
                self.records.remove(&id);
                self.stop_replica(&id).await;
            }
            (None, None) => {}
        }
    }

    async fn on_delete(&mut self, id: &str) {
        self.forget_quiesced(id).await;
        self.records.remove(id);
        self.retry.remove(id);
        self.pending_membership.remove(id);
        self.repairing.remove(id);
        if self.running.contains_key(id) {
            tracing::info!(kernel = %id, "kernel deleted; stopping the local replica");
            self.stop_replica(id).await;
        }
    }

    /// Retries replicas that failed to start, restarts replicas whose kernel died or diverged, and
    /// keeps the led groups' voters right.
    async fn reconcile_all(&mut self) {
        let records: Vec<KernelRecord> = self.records.values().cloned().collect();
        let me = self.cluster.node_id();
        for record in records {
            self.quiesce(&record).await;
            if self.running.contains_key(&record.id) {
                let dead = match self.host.kernels().get(&record.id).await {
                    Some(k) => k.hub.activity().execution_state == "dead",
                    None => true,
                };
                let diverged = self.host.replica(&record.id).and_then(|r| r.applier.diverged());
                if dead || diverged.is_some() {
                    // The group replica stays: the new kernel catches up from it (every name).
                    match &diverged {
                        Some(why) => {
                            tracing::warn!(kernel = %record.id, why, "the local replica's kernel ran a cell the group did not commit; starting a new one")
                        }
                        None => {
                            tracing::warn!(kernel = %record.id, "the local replica's kernel is gone; starting a new one")
                        }
                    }
                    if let Some(t) = self.readying.remove(&record.id) {
                        t.abort();
                    }
                    self.running.remove(&record.id);
                    self.host.detach(&record.id);
                    self.host.kernels().remove(&record.id).await;
                }
            }
            if !self.running.contains_key(&record.id) {
                if self.retry.get(&record.id).is_some_and(|(at, _)| Instant::now() < *at) {
                    continue;
                }
                if let Some(r) = record.replica_on(me) {
                    if let Err(e) = self.start_replica(&record, &r).await {
                        tracing::warn!(kernel = %record.id, error = format!("{e:#}"), "local replica still not started");
                    }
                }
                continue;
            }
            if let Some(group) = self.running.get(&record.id).map(|r| r.group) {
                if let Err(raft_store::Error::GroupFailed { reason, .. }) = self.cluster.store().status(group).await {
                    if record.moving.as_ref().is_some_and(|m| m.to == me) {
                        // The move's target: the group's leader may still count this host as
                        // the member it was before (a replica moved off here, now moving back)
                        // until it removes it and adds it afresh (`membership_changes`). An
                        // empty replica again, a moment later, instead of giving the move up.
                        tracing::warn!(kernel = %record.id, group, reason, "the moving replica's group failed here; joining again");
                        self.stop_replica(&record.id).await;
                        let failures = self.retry.get(&record.id).map_or(0, |(_, n)| *n) + 1;
                        self.retry.insert(record.id.clone(), (Instant::now() + Duration::from_secs(1), failures));
                        continue;
                    }
                    self.hand_off_failed(&record, &reason).await;
                    continue;
                }
            }
            self.reconcile_membership(&record).await;
        }
    }

    /// Destroys the kernel groups held here that no kernel record names, at two looks in a
    /// row (a group is created from its record, so one missing from a linearizable read of
    /// the records is a deleted kernel's; the second look rules out a race with a record
    /// changing its group). Replicas this supervisor runs are left to their records.
    async fn destroy_unknown_groups(&mut self) {
        self.unknown.1 = Instant::now();
        let store = self.cluster.store().clone();
        let Ok(local) = store.groups().await else { return };
        let known = match self.cluster.kernel_groups().await {
            Ok(k) => k,
            Err(e) => {
                tracing::debug!(error = %e, "supervisor: kernel records not readable through the meta leader; later");
                return;
            }
        };
        let running: BTreeSet<u64> = self.running.values().map(|r| r.group).collect();
        let unknown: BTreeSet<u64> = local
            .into_iter()
            .filter(|g| *g >= FIRST_KERNEL_GROUP && !known.contains(g) && !running.contains(g))
            .collect();
        self.host.sync_metrics().groups_unknown.set(i64::try_from(unknown.len()).unwrap_or(i64::MAX));
        for &group in unknown.intersection(&self.unknown.0) {
            match store.destroy_group(group).await {
                Ok(()) | Err(raft_store::Error::GroupNotFound(_)) => {
                    tracing::info!(group, "destroyed a kernel group no kernel record names (the kernel was deleted while this host was away)");
                }
                Err(e) => tracing::warn!(group, error = %e, "could not destroy a kernel group no record names"),
            }
        }
        self.unknown.0 = unknown;
    }

    /// The local replica's group failed here: asks the meta leader to place the replica
    /// elsewhere (every [`REPAIR_EVERY`] until it happens; the new record stops it here).
    async fn hand_off_failed(&mut self, record: &KernelRecord, reason: &str) {
        if self.repairing.get(&record.id).is_some_and(|at| Instant::now() < *at) {
            return;
        }
        self.repairing.insert(record.id.clone(), Instant::now() + REPAIR_EVERY);
        let me = self.cluster.node_id();
        match self.cluster.replace_replica(&record.id, me).await {
            Ok(Some(new)) if new.replicas.iter().all(|r| r.node_id != me) => {
                let to: Vec<u64> = new.replicas.iter().map(|r| r.node_id).collect();
                tracing::warn!(kernel = %record.id, group = record.group, reason, hosts = ?to, "the kernel group failed on this host; its replica was re-placed");
            }
            Ok(_) => {
                tracing::warn!(kernel = %record.id, group = record.group, reason, "the kernel group failed on this host and no other host can take its replica now; retrying");
            }
            Err(e) => {
                tracing::warn!(kernel = %record.id, group = record.group, reason, error = %e, "the kernel group failed on this host; asking for re-placement failed; retrying");
            }
        }
    }

    /// Starts the local replica; after a failure the next attempt waits (1 s doubling to 1 min).
    async fn start_replica(&mut self, record: &KernelRecord, r: &ReplicaRecord) -> anyhow::Result<()> {
        let started = self.try_start_replica(record, r).await;
        if started.is_ok() {
            self.retry.remove(&record.id);
        } else {
            let failures = self.retry.get(&record.id).map_or(0, |(_, n)| *n) + 1;
            let wait = Duration::from_secs(1 << failures.min(6)).min(Duration::from_secs(60));
            self.retry.insert(record.id.clone(), (Instant::now() + wait, failures));
        }
        started
    }

    async fn try_start_replica(&mut self, record: &KernelRecord, r: &ReplicaRecord) -> anyhow::Result<()> {
        let store = self.cluster.store();
        let kernels = self.host.kernels().clone();
        // The group first: a replacement must host its (empty) group replica before the
        // group's leader adds it, or the leader's first messages to it are lost.
        let join = is_replacement(record, r);
        let created = if join {
            store.join_group(record.group).await
        } else {
            let voters: Vec<u64> = record.replicas.iter().map(|x| x.node_id).collect();
            store.create_group(record.group, &voters).await
        };
        match created {
            Ok(()) => {
                tracing::info!(kernel = %record.id, group = record.group, replica = r.replica, join, "kernel group replica created");
            }
            // Restart: the group's log survived in the store.
            Err(raft_store::Error::GroupExists(_)) => {}
            Err(e) => return Err(anyhow::Error::new(e).context(format!("creating raft group {}", record.group))),
        }
        let kernel = match kernels.get(&record.id).await {
            Some(k) => k,
            None => {
                // Records written before the cluster API checked the environment may hold more.
                let (env, dropped) = crate::kernel::client_env::settable(record.env.clone());
                if dropped > 0 {
                    tracing::warn!(kernel = %record.id, dropped, "kernel record: environment variables a client may not set were left out");
                }
                let owner = record
                    .owner
                    .as_ref()
                    .map(|name| crate::users::User { name: name.clone(), groups: record.owner_groups.clone() });
                kernels
                    // The record's owner on every host: new, re-placed and migrated
                    // replicas and restarts all run as the same account (kernel.run_as).
                    .create_replica(&record.id, r.replica, Some(&record.name), Some(record.gpus), &env, owner.as_ref())
                    .await
                    .map_err(|e| anyhow::anyhow!("starting replica {} of kernel {}: {e}", r.replica, record.id))?
            }
        };
        let local = self.host.attach(kernel, r.replica, record.group);
        self.running.insert(record.id.clone(), Running { replica: r.replica, group: record.group });
        let cluster = self.cluster.clone();
        let id = record.id.clone();
        let ready = tokio::spawn(async move {
            loop {
                match local.applier.catch_up(CATCH_UP_TIMEOUT).await {
                    Ok(revision) => {
                        tracing::info!(kernel = %id, replica = local.replica, revision, "replica caught up");
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(kernel = %id, error = format!("{e:#}"), "replica not caught up yet");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
            loop {
                match cluster.put_ready(&id).await {
                    Ok(()) => return,
                    // No host lease yet: the heartbeat puts the mark when it gets one.
                    Err(crate::cluster::control::meta::ClusterError::NotReady(_)) => return,
                    Err(e) => {
                        tracing::debug!(kernel = %id, error = %e, "ready mark not put; retrying");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        });
        if let Some(old) = self.readying.insert(record.id.clone(), ready) {
            old.abort();
        }
        Ok(())
    }

    async fn stop_replica(&mut self, id: &str) {
        self.forget_quiesced(id).await;
        self.repairing.remove(id);
        if let Some(t) = self.readying.remove(id) {
            t.abort();
        }
        let Some(run) = self.running.remove(id) else { return };
        if let Err(e) = self.cluster.clear_ready(id).await {
            tracing::debug!(kernel = %id, error = %e, "ready mark not withdrawn (it goes with the host lease)");
        }
        self.host.detach(id);
        self.host.kernels().remove(id).await;
        match self.cluster.store().destroy_group(run.group).await {
            Ok(()) | Err(raft_store::Error::GroupNotFound(_)) => {}
            Err(e) => {
                tracing::warn!(kernel = %id, group = run.group, error = %e, "could not destroy the kernel group replica")
            }
        }
    }

    /// While this host leads the kernel's group: voters := the record's replicas' hosts,
    /// learners := a move's target (it catches up before it counts for the quorum; the
    /// move's end makes it a voter and removes the old host). A change waits
    /// [`MEMBERSHIP_GRACE`] after the record is first seen, so that a new host has created
    /// its empty group replica when the leader starts sending to it.
    async fn reconcile_membership(&mut self, record: &KernelRecord) {
        let store = self.cluster.store().clone();
        let Ok(status) = store.status(record.group).await else { return };
        if status.role != "leader" || !status.membership.voters_outgoing.is_empty() {
            return;
        }
        let voters: BTreeSet<u64> = status.membership.voters.iter().copied().collect();
        let learners: BTreeSet<u64> = status.membership.learners.iter().copied().collect();
        let changes = membership_changes(record, &voters, &learners);
        if changes.is_empty() {
            self.pending_membership.remove(&record.id);
            return;
        }
        let since = match self.pending_membership.get(&record.id) {
            Some((seen, since)) if seen == record => *since,
            _ => {
                self.pending_membership.insert(record.id.clone(), (record.clone(), Instant::now()));
                return;
            }
        };
        if since.elapsed() < MEMBERSHIP_GRACE {
            return;
        }
        match store.change_membership(record.group, &changes).await {
            Ok(m) => {
                self.pending_membership.remove(&record.id);
                tracing::info!(kernel = %record.id, group = record.group, voters = ?m.voters, learners = ?m.learners, "kernel group membership changed");
            }
            Err(e) => {
                tracing::warn!(kernel = %record.id, group = record.group, error = %e, "kernel group membership change failed; retrying")
            }
        }
    }

    /// While a move takes this host's replica away: the replica yields every new cell, and
    /// once it runs none the host puts its quiesced mark, which lets the meta leader finish
    /// the move (the replica is stopped then, with no cell on it). Otherwise: no mark.
    async fn quiesce(&mut self, record: &KernelRecord) {
        let me = self.cluster.node_id();
        let leaving = record.moving.as_ref().is_some_and(|m| m.from == me);
        self.host.set_moving_out(&record.id, leaving);
        if !leaving {
            self.forget_quiesced(&record.id).await;
            return;
        }
        if self.quiesced.contains(&record.id) || !self.host.is_idle(&record.id) {
            return;
        }
        match self.cluster.put_quiesced(&record.id).await {
            Ok(()) => {
                tracing::info!(kernel = %record.id, "local replica quiesced for its move");
                self.quiesced.insert(record.id.clone());
            }
            Err(e) => tracing::debug!(kernel = %record.id, error = %e, "quiesced mark not put; retrying"),
        }
    }

    /// Withdraws this host's quiesced mark for `id`, if it put one.
    async fn forget_quiesced(&mut self, id: &str) {
        if self.quiesced.remove(id) {
            if let Err(e) = self.cluster.clear_quiesced(id).await {
                tracing::debug!(kernel = %id, error = %e, "quiesced mark not withdrawn (it goes with the host lease)");
            }
        }
    }
}

/// The membership changes that make a kernel group's voters the record's replicas' hosts
/// and its learners the host a replica moves to (empty when it already is so).
fn membership_changes(
    record: &KernelRecord,
    voters: &BTreeSet<u64>,
    learners: &BTreeSet<u64>,
) -> Vec<MembershipChange> {
    let want_voters: BTreeSet<u64> = record.replicas.iter().map(|r| r.node_id).collect();
    let want_learner = record.moving.as_ref().map(|m| m.to).filter(|t| !want_voters.contains(t));
    let mut changes: Vec<MembershipChange> =
        want_voters.difference(voters).map(|n| MembershipChange::AddVoter(*n)).collect();
    if let Some(t) = want_learner.filter(|t| !voters.contains(t) && !learners.contains(t)) {
        changes.push(MembershipChange::AddLearner(t));
    }
    // A member no replica is on goes, also when a move now targets its host: a voter left
    // over from an earlier move off that host keeps its old progress at the leader, which
    // would send the new, empty replica there a commit index past its log (raft panics). It
    // is added back as a learner, afresh, once removed.
    let kept = |n: &u64| want_voters.contains(n) || (want_learner == Some(*n) && learners.contains(n));
    let stale = |n: &&u64| !kept(n);
    changes.extend(voters.union(learners).filter(stale).map(|n| MembershipChange::Remove(*n)));
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(nums: &[(u32, u64)]) -> KernelRecord {
        KernelRecord {
            id: "k".into(),
            name: "python3".into(),
            gpus: 0,
            group: 99,
            replicas: nums.iter().map(|&(replica, node_id)| ReplicaRecord { replica, node_id }).collect(),
            created_ms: 0,
            env: Default::default(),
            moving: None,
            owner: None,
            owner_groups: Vec::new(),
        }
    }

    #[test]
    fn a_move_adds_its_target_as_a_learner_then_promotes_it_and_removes_the_source() {
        use crate::cluster::control::records::{MoveReason, MoveRecord};
        let set = |v: &[u64]| v.iter().copied().collect::<BTreeSet<u64>>();
        let mut moving = rec(&[(1, 1), (2, 2), (3, 3)]);
        let m = MoveRecord { replica: 2, from: 2, to: 4, new_replica: 4, reason: MoveReason::AllYield, started_ms: 0 };
        moving.moving = Some(m.clone());
        // The target is a replica of this host's (it joins instead of founding the group).
        let incoming = moving.replica_on(4).expect("the target holds the new replica");
        assert_eq!(incoming.replica, 4);
        assert!(is_replacement(&moving, &incoming));
        assert_eq!(moving.hosts(), vec![1, 2, 3, 4]);
        // Step 1: learner.
        let changes = membership_changes(&moving, &set(&[1, 2, 3]), &set(&[]));
        assert_eq!(changes, vec![MembershipChange::AddLearner(4)]);
        assert!(membership_changes(&moving, &set(&[1, 2, 3]), &set(&[4])).is_empty());
        // Step 2 (the move finished): promote and remove, in one joint change.
        let done = rec(&[(1, 1), (4, 4), (3, 3)]);
        let changes = membership_changes(&done, &set(&[1, 2, 3]), &set(&[4]));
        assert_eq!(changes, vec![MembershipChange::AddVoter(4), MembershipChange::Remove(2)]);
        // An aborted move: the learner goes.
        let aborted = rec(&[(1, 1), (2, 2), (3, 3)]);
        assert_eq!(membership_changes(&aborted, &set(&[1, 2, 3]), &set(&[4])), vec![MembershipChange::Remove(4)]);
    }

    /// A replica moved off host 2 and, before the group dropped host 2, moves back to it:
    /// host 2's old membership goes first, and it is added afresh as a learner after.
    #[test]
    fn a_move_back_to_a_host_still_in_the_group_removes_it_before_adding_it_again() {
        use crate::cluster::control::records::{MoveReason, MoveRecord};
        let set = |v: &[u64]| v.iter().copied().collect::<BTreeSet<u64>>();
        let mut back = rec(&[(1, 1), (4, 4), (3, 3)]);
        back.moving = Some(MoveRecord {
            replica: 4,
            from: 4,
            to: 2,
            new_replica: 5,
            reason: MoveReason::AllYield,
            started_ms: 0,
        });
        let changes = membership_changes(&back, &set(&[1, 2, 3]), &set(&[4]));
        assert_eq!(changes, vec![MembershipChange::AddVoter(4), MembershipChange::Remove(2)]);
        assert_eq!(membership_changes(&back, &set(&[1, 3, 4]), &set(&[])), vec![MembershipChange::AddLearner(2)]);
        assert!(membership_changes(&back, &set(&[1, 3, 4]), &set(&[2])).is_empty());
    }

    #[test]
    fn replacements_are_the_replicas_numbered_past_the_founders() {
        let founded = rec(&[(1, 1), (2, 2), (3, 3)]);
        assert!(founded.replicas.iter().all(|r| !is_replacement(&founded, r)));
        let replaced = rec(&[(1, 1), (4, 5), (3, 3)]);
        assert!(is_replacement(&replaced, &replaced.replicas[1]));
        assert!(!is_replacement(&replaced, &replaced.replicas[0]));
    }
}
