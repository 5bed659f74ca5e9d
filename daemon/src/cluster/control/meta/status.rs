//! The cluster as one host sees it (`GET /api/v1/cluster/status`, `nbos cluster status`):
//! the meta group's leader and term, and every member with its host and load records.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;

use raft_store::Membership;
use serde::{Deserialize, Serialize};

use super::error::Result;
use super::handle::Cluster;
use crate::cluster::control::records::{HostRecord, LoadRecord, MoveRecord, META_GROUP};

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
    /// It is being drained: its replicas move away and placement puts nothing new there.
    #[serde(default)]
    pub draining: bool,
}

/// A replica on its way to another host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MovingStatus {
    /// The kernel.
    pub kernel: String,
    /// The move as its record says.
    #[serde(flatten)]
    pub moving: MoveRecord,
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
    /// Replicas moving between hosts.
    #[serde(default)]
    pub moving: Vec<MovingStatus>,
}

impl Cluster {
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
        let records = self.kernels().await.unwrap_or_default();
        let kernels = records.len();
        let moving: Vec<MovingStatus> =
            records.into_iter().filter_map(|k| Some(MovingStatus { moving: k.moving?, kernel: k.id })).collect();
        let draining = self.draining_hosts().await.unwrap_or_default();
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
                draining: draining.contains(&id),
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
            moving,
        })
    }
}
