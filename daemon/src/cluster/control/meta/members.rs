//! Membership of the meta group: adding and removing hosts (on the meta leader), and a
//! host leaving the cluster (drain its replicas, then remove itself). The peer records
//! written at join let every host reach a member even while its `hosts/` record is gone.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use raft_store::{Membership, MembershipChange};
use serde::{Deserialize, Serialize};

use super::error::{ClusterError, Result};
use super::forward::{Authority, HttpMethod};
use super::handle::Cluster;
use super::moves::{MoveAnswer, MoveRequest};
use crate::cluster::control::records::{keys, KernelRecord, MoveReason, META_GROUP};
use nbos_sched::placement::{self, HostLoad};

/// How long `leave` waits for its replicas' moves to finish (a cell running on one ends
/// first; `nbos cluster leave` waits with its own `--timeout` instead).
const LEAVE_MOVES_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a drain waits for another replica's move of the same kernel to finish.
const OTHER_MOVE_WAIT: Duration = Duration::from_secs(60);

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

/// What `nbos cluster leave` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaveReport {
    /// The host that left.
    pub node_id: u64,
    /// Kernels whose replica on this host moved: (kernel, new host).
    pub moved: Vec<(String, u64)>,
    /// Meta membership after the removal.
    pub membership: Membership,
}

impl Cluster {
    /// Adds a host to the meta group (learner, then voter). Runs on the meta leader.
    pub async fn add_member(&self, peer: PeerRecord) -> Result<Membership> {
        if peer.node_id == 0 {
            return Err(ClusterError::BadRequest("node id must be non-zero".into()));
        }
        // Before `add_peer`: re-adding a member under a new address would redirect its raft traffic.
        self.refuse_existing_member(&peer).await?;
        self.store.add_peer(peer.node_id, peer.raft_addr);
        self.on_leader(HttpMethod::Post, "/api/v1/cluster/members", Some(&peer), Authority::Operator, || {
            self.add_member_here(peer.clone())
        })
        .await
    }

    /// [`Cluster::add_member`] on this host, which must be the meta leader.
    pub async fn add_member_here(&self, peer: PeerRecord) -> Result<Membership> {
        self.require_leader().await?;
        self.refuse_existing_member(&peer).await?;
        self.store.add_peer(peer.node_id, peer.raft_addr);
        self.meta.put(peer_key(peer.node_id), serde_json::to_vec(&peer).unwrap_or_default()).await?;
        let status = self.store.status(META_GROUP).await?;
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

    /// A node id that is already a voter is refused (another host claiming it would take
    /// over its raft traffic); so is a learner, unless it is a join of the same address
    /// that stopped half-way.
    async fn refuse_existing_member(&self, peer: &PeerRecord) -> Result<()> {
        let membership = self.store.status(META_GROUP).await?.membership;
        let learner = membership.learners.contains(&peer.node_id);
        if !learner && !membership.voters.contains(&peer.node_id) {
            return Ok(());
        }
        if learner {
            let recorded = self
                .meta
                .get(peer_key(peer.node_id))
                .await?
                .and_then(|kv| serde_json::from_slice::<PeerRecord>(&kv.value).ok());
            if recorded.as_ref() == Some(peer) {
                return Ok(());
            }
        }
        crate::metrics::count_auth_refusal("member_exists");
        Err(ClusterError::Conflict(format!(
            "host {} is already a member of the cluster; a node id joins once (remove it first: \
             `nbos cluster leave` on that host, or DELETE /api/v1/cluster/members/{})",
            peer.node_id, peer.node_id
        )))
    }

    /// Removes a host from the meta group. Runs on the meta leader.
    pub async fn remove_member(&self, node_id: u64) -> Result<Membership> {
        let path = format!("/api/v1/cluster/members/{node_id}");
        self.on_leader(HttpMethod::Delete, &path, None::<&()>, Authority::Operator, || self.remove_member_here(node_id))
            .await
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
        // Before the change: a leader that removes itself cannot write afterwards.
        if let Err(e) = self.meta.delete(keys::draining(node_id)).await {
            tracing::warn!(node = node_id, error = %e, "could not delete the draining mark of a leaving host");
        }
        let m = self.store.change_membership(META_GROUP, &[MembershipChange::Remove(node_id)]).await?;
        // Its host and load records too: they live on its host lease, which a removed host
        // can no longer revoke (it follows the group no more), and until it expired the
        // host read as live to placement and to the autoscaler.
        for key in [peer_key(node_id), keys::host(node_id), keys::load(node_id)] {
            if let Err(e) = self.meta.delete(key.clone()).await {
                tracing::warn!(node = node_id, key, error = %e, "could not delete a record of a removed host");
            }
        }
        tracing::info!(node = node_id, voters = ?m.voters, "host removed from the meta group");
        Ok(m)
    }

    /// When this host leads the meta group, hands the leadership to another voter and waits
    /// (three election timeouts at most) until it has: a leader that removes itself cannot
    /// commit anything afterwards (the removed host's peer record would stay), and the
    /// group would sit leaderless for an election timeout. As etcd does before a leader
    /// leaves. A failed hand-off is logged; removing goes on from here.
    async fn hand_off_meta_leadership(&self) {
        let me = self.settings.node_id;
        if self.meta_leader().await != Some(me) {
            return;
        }
        let Ok(status) = self.store.status(META_GROUP).await else { return };
        // A live voter (one with a host lease) when there is one.
        let live: Vec<u64> = self.host_loads().await.unwrap_or_default().iter().map(|h| h.node_id).collect();
        let others = || status.membership.voters.iter().copied().filter(|&v| v != me);
        let Some(to) = others().find(|v| live.contains(v)).or_else(|| others().next()) else { return };
        if let Err(e) = self.store.transfer_leader(META_GROUP, to).await {
            tracing::warn!(to, error = %e, "could not hand off the meta leadership before leaving");
            return;
        }
        let deadline = Instant::now() + self.store.config().election_timeout() * 3;
        while Instant::now() < deadline {
            match self.meta_leader().await {
                Some(l) if l != me => {
                    tracing::info!(leader = l, "meta leadership handed off before leaving");
                    return;
                }
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        tracing::warn!(to, "the meta leadership was not handed off in time; leaving as the leader");
    }

    /// This host leaves the cluster: [`Cluster::drain`], waits until every move is finished
    /// (each replica's cell, if one runs, ends first), then [`Cluster::remove_self`].
    pub async fn leave(&self) -> Result<LeaveReport> {
        let moved = self.drain().await?;
        let me = self.settings.node_id;
        let deadline = Instant::now() + LEAVE_MOVES_TIMEOUT;
        while self.kernels().await?.iter().any(|k| k.hosts().contains(&me)) {
            if Instant::now() > deadline {
                return Err(ClusterError::Conflict(format!(
                    "host {me}: its replicas have not all moved within {LEAVE_MOVES_TIMEOUT:?}; still a member (moves begun: {moved:?})"
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let mut report = self.remove_self().await?;
        report.moved = moved;
        Ok(report)
    }

    /// Runs one phase of `leave` (`drain` or `remove`) on the host at `gateway_url`, with this
    /// host's node certificate and the operator token (the autoscaler releasing a host).
    pub async fn host_leave_phase(&self, gateway_url: &str, phase: &str) -> Result<serde_json::Value> {
        let body = serde_json::json!({ "phase": phase });
        self.forward(HttpMethod::Post, gateway_url, "/api/v1/cluster/leave", Some(&body), Authority::Operator).await
    }

    /// Marks this host draining (placement puts nothing new here) and begins moving every
    /// replica on it to another host ([`Cluster::move_replica`]; a move finishes once its
    /// new replica caught up and the old one runs no cell). Refused, with nothing changed,
    /// when a replica has nowhere to go (checked before anything moves; should the leader
    /// still find no host for one, the moves already begun go on and the mark is withdrawn).
    /// The host stays a member. Returns (kernel, new host) per replica moving.
    pub async fn drain(&self) -> Result<Vec<(String, u64)>> {
        let me = self.settings.node_id;
        let mine: Vec<KernelRecord> =
            self.kernels().await?.into_iter().filter(|k| k.replicas.iter().any(|r| r.node_id == me)).collect();
        // Check first that every replica has somewhere to go (this host's view; the leader
        // decides each move for real), so that a refusal leaves everything where it was.
        let mut hosts: Vec<HostLoad> = self.host_loads().await?.into_iter().filter(|h| h.node_id != me).collect();
        let loads = self.loads().await?;
        for k in &mine {
            let memory_mib = super::memory::expected_replica_mib(&loads, &k.id);
            let ratio = self.settings.subscription_ratio;
            let Some(to) = placement::replace_with_memory(&hosts, k.gpus, memory_mib, ratio, &k.hosts()) else {
                return Err(ClusterError::Conflict(format!(
                    "host {me} cannot leave: no other live host can take its replica of kernel {} \
                     (every live host already holds it or has no room for its GPUs or memory); nothing was changed",
                    k.id
                )));
            };
            if let Some(h) = hosts.iter_mut().find(|h| h.node_id == to) {
                h.subscribed_gpus = h.subscribed_gpus.saturating_add(k.gpus);
                h.replicas = h.replicas.saturating_add(1);
                h.memory_used_mib = h.memory_used_mib.saturating_add(memory_mib);
            }
        }
        self.set_draining(true).await?;
        let moved = self.begin_moves(&mine).await;
        if moved.is_err() {
            if let Err(e) = self.set_draining(false).await {
                tracing::warn!(error = %e, "could not withdraw this host's draining mark");
            }
        }
        moved
    }

    async fn begin_moves(&self, mine: &[KernelRecord]) -> Result<Vec<(String, u64)>> {
        let me = self.settings.node_id;
        let mut moved = Vec::new();
        for k in mine {
            let request = MoveRequest { reason: MoveReason::Drain, from: Some(me) };
            // One move per kernel at a time: another replica of this kernel may be moving.
            let deadline = Instant::now() + OTHER_MOVE_WAIT;
            let answer = loop {
                let busy = self.kernel(&k.id).await?.and_then(|r| r.moving).is_some_and(|m| m.from != me);
                if !busy || Instant::now() > deadline {
                    break self.move_replica(&k.id, request.clone()).await?;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            match answer {
                MoveAnswer::Moving { record } => {
                    moved.push((k.id.clone(), record.moving.map_or(0, |m| m.to)));
                }
                MoveAnswer::NotThere { .. } => {}
                MoveAnswer::NoHost => {
                    return Err(ClusterError::Conflict(format!(
                        "host {me} cannot leave: no live host can take its replica of kernel {}; still a member \
                         (replicas already moving: {moved:?})",
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
        if let Some(k) = self.kernels().await?.iter().find(|k| k.hosts().contains(&me)) {
            return Err(ClusterError::Conflict(format!(
                "host {me} still holds a replica of kernel {}: drain it first (nbos cluster leave does)",
                k.id
            )));
        }
        self.hand_off_meta_leadership().await;
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
}
