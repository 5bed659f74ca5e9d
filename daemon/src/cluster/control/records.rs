//! What the cluster stores, and under which keys: host and kernel records in the meta
//! group, election and namespace records in each kernel's group. Values are JSON so an
//! operator can read them with `nbos cluster status --raw`; binary payloads (pickled
//! objects) live in `ns/` values whose encoding `state_sync` owns.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// The raft group every host belongs to: hosts, kernels, placement.
pub const META_GROUP: u64 = 1;

/// The first kernel group id the meta group allocates; ids below are reserved.
pub const FIRST_KERNEL_GROUP: u64 = 16;

/// The raft group id of the next kernel: the counter kept in the meta group
/// ([`keys::NEXT_KERNEL_GROUP`], `None` before the first kernel), moved past any group a
/// record uses already. Ids are allocated, never derived from the kernel id, so no chosen
/// id can make a kernel join another kernel's group (they were FNV hashes of the id), and
/// none is ever reused for a later kernel. Records written when ids were hashes keep their
/// group: `in_use` holds them so the counter steps over them.
pub fn next_kernel_group(counter: Option<u64>, in_use: &std::collections::BTreeSet<u64>) -> u64 {
    let mut g = counter.unwrap_or(FIRST_KERNEL_GROUP).max(FIRST_KERNEL_GROUP);
    while in_use.contains(&g) {
        g = g.saturating_add(1);
    }
    g
}

/// One GPU of a host, as the inventory saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuRecord {
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Model name (`NVIDIA H200`, or the test double's name).
    pub model: String,
    /// Device memory.
    pub memory_bytes: u64,
}

/// A live host (`hosts/{node_id}`), attached to the host's store lease: the key
/// disappears when the host stops heartbeating, which is how others see it down.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRecord {
    /// Raft node id (unique in the cluster).
    pub node_id: u64,
    /// Host name for people.
    pub name: String,
    /// Base URL of the host's HTTP API, as other hosts reach it.
    pub gateway_url: String,
    /// Raft transport address.
    pub raft_addr: SocketAddr,
    /// GPUs by UUID.
    pub gpus: Vec<GpuRecord>,
    /// Host memory.
    pub memory_bytes: u64,
    /// Daemon version.
    pub version: String,
}

/// A host's current load (`load/{node_id}`), rewritten when it changes; attached to
/// the host's lease like its record. Pre-selection reads it stale: the election decides.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadRecord {
    /// Raft node id.
    pub node_id: u64,
    /// GPUs on the host.
    pub gpus_total: u32,
    /// GPUs bound to executing cells or idle-held leases.
    pub gpus_committed: u32,
    /// GPUs a cell could take now.
    pub gpus_idle: u32,
    /// Replicas hosted here.
    pub replicas: u32,
    /// Sum of the GPUs the hosted replicas ask for (numerator of the subscription ratio).
    pub subscribed_gpus: u32,
    /// Host memory this host's kernel replicas may use together, MiB (`cluster.kernel_memory_mib`);
    /// 0: not accounted, as from a host older than memory placement (placement treats it as unbounded).
    #[serde(default)]
    pub memory_capacity_mib: u64,
    /// Host memory the hosted kernels use now, measured, MiB (rounded up).
    #[serde(default)]
    pub memory_used_mib: u64,
    /// Per hosted kernel: the memory a replica of it is expected to need, MiB: what it uses
    /// here, at least its namespace's size as state sync knows it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kernel_memory_mib: BTreeMap<String, u64>,
    /// The UTC day (days since the Unix epoch) the GPU time below counts
    /// (`gpu_hours_per_day`); 0 from a host older than it.
    #[serde(default)]
    pub usage_day: u64,
    /// Each user's GPU-seconds committed to cells on this host that day, running cells' so far.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gpu_seconds_today: BTreeMap<String, u64>,
    /// The same by group (a cell counts for each group its owner was in when it started).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub group_gpu_seconds_today: BTreeMap<String, u64>,
}

/// Where one replica of a kernel lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaRecord {
    /// Replica number, 1-based and stable for the replica's life (also in raft logs).
    pub replica: u32,
    /// Host (raft node id).
    pub node_id: u64,
}

/// A kernel (`kernels/{id}`): what it is and where its replicas live. Written by the
/// meta group's leader when it places the kernel, and when it re-places a lost replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelRecord {
    /// Kernel id (UUID).
    pub id: String,
    /// Kernelspec name.
    pub name: String,
    /// GPUs each cell needs.
    pub gpus: u32,
    /// The kernel's raft group, allocated by the meta leader ([`next_kernel_group`]).
    pub group: u64,
    /// The replicas (normally 3, on distinct hosts).
    pub replicas: Vec<ReplicaRecord>,
    /// Creation time, ms since the Unix epoch.
    pub created_ms: u64,
    /// Environment the client asked for (already filtered by the gateway).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// A replica on its way to another host ([`MoveRecord`]); at most one per kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moving: Option<MoveRecord>,
    /// The user who created the kernel (`None`: a kernel created before users, or on a
    /// cluster without `[auth]`): every host enforces it, and runs the replica as that
    /// user's account with `kernel.run_as = "owner"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The owner's groups when the kernel was created: the kernels a group quota
    /// (`[limits.groups.NAME]`) counts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owner_groups: Vec<String>,
}

impl KernelRecord {
    /// The replica this kernel has on `node_id`: a placed one, or the one moving there.
    pub fn replica_on(&self, node_id: u64) -> Option<ReplicaRecord> {
        self.replicas.iter().find(|r| r.node_id == node_id).cloned().or_else(|| {
            self.moving.as_ref().filter(|m| m.to == node_id).map(|m| ReplicaRecord { replica: m.new_replica, node_id })
        })
    }

    /// Every host that holds or is about to hold a replica (placed ones, then a move's target).
    pub fn hosts(&self) -> Vec<u64> {
        let mut hosts: Vec<u64> = self.replicas.iter().map(|r| r.node_id).collect();
        hosts.extend(self.moving.as_ref().map(|m| m.to));
        hosts
    }
}

/// Why a replica moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MoveReason {
    /// Every replica's host yielded a cell: the cell runs where GPUs are free.
    AllYield,
    /// Its host is being drained (leaving the cluster, or released by the autoscaler).
    Drain,
}

impl MoveReason {
    /// The metrics label and the wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            MoveReason::AllYield => "all_yield",
            MoveReason::Drain => "drain",
        }
    }
}

/// A replica moving between hosts (a kernel record's `moving`), in two steps that the meta
/// leader commits: first this record, so that the target host starts a new replica that
/// joins the kernel's group as a learner and catches up; then, once the target is ready and
/// the source replica is quiesced (runs no cell, yields every new one), the record whose
/// `replicas` has the new replica in place of the old one. The group's leader follows the
/// record (learner, then promotion and removal) and the source host stops its replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveRecord {
    /// The replica that leaves.
    pub replica: u32,
    /// Its host.
    pub from: u64,
    /// The host it moves to.
    pub to: u64,
    /// The number of the new replica there (past every number the kernel used).
    pub new_replica: u32,
    /// Why.
    pub reason: MoveReason,
    /// When the move began, ms since the Unix epoch (for its timeout and its duration).
    pub started_ms: u64,
}

/// A cell's election (`elect/{cell}` in the kernel group). Only the replica the
/// front-end designated for a round proposes for it, by CAS from the previous round's
/// record, so a record with a winner is final: exactly one replica executes a cell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ElectionRecord {
    /// Round, from 0.
    pub round: u32,
    /// The replica that won (LEAD), or `None` when the round's designee yielded.
    pub winner: Option<u32>,
    /// The winner's or yielder's host.
    pub node_id: u64,
    /// Why it yielded (for the client's "waiting" message and the logs).
    #[serde(default)]
    pub reason: String,
}

/// The kernel's cell in progress (`running` in the kernel group): put by the LEAD swap that
/// wins a cell, in the same transaction, and removed by that cell's namespace commit (or by
/// its executor when the cell ends otherwise). A LEAD swap needs it absent, so one cell of a
/// kernel runs at a time whichever front-end sent it, as in one Jupyter kernel; the commit
/// needs it unchanged, so an executor whose lock was taken over commits nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningRecord {
    /// The cell (the client's msg_id).
    pub cell: String,
    /// The executing replica.
    pub replica: u32,
    /// Its host.
    pub node_id: u64,
}

/// Keys. Fixed-width numbers keep prefix scans ordered.
pub mod keys {
    /// Prefix of [`super::HostRecord`]s.
    pub const HOSTS: &str = "hosts/";
    /// Prefix of [`super::LoadRecord`]s.
    pub const LOAD: &str = "load/";
    /// Prefix of [`super::KernelRecord`]s.
    pub const KERNELS: &str = "kernels/";
    /// Prefix of replica readiness marks (`ready/{kernel}/{node}`, on the host's lease).
    pub const READY: &str = "ready/";
    /// Prefix of quiesced marks (`quiesced/{kernel}/{node}`, on the host's lease): the
    /// host's replica of the kernel runs no cell and yields new ones, so it may move.
    pub const QUIESCED: &str = "quiesced/";
    /// Prefix of draining marks (`draining/{node}`): placement puts nothing new there.
    pub const DRAINING: &str = "draining/";
    /// The next kernel group id to allocate (a JSON number; see [`super::next_kernel_group`]).
    pub const NEXT_KERNEL_GROUP: &str = "counters/next-kernel-group";
    /// Prefix of election records in a kernel group.
    pub const ELECT: &str = "elect/";
    /// Prefix of namespace entries in a kernel group (`ns/{name}`).
    pub const NS: &str = "ns/";
    /// The last synchronised cell in a kernel group.
    pub const NS_CELL: &str = "ns-cell";
    /// The kernel group's cell in progress ([`super::RunningRecord`]).
    pub const RUNNING: &str = "running";

    /// `hosts/{node:020}`.
    pub fn host(node_id: u64) -> String {
        format!("{HOSTS}{node_id:020}")
    }
    /// `load/{node:020}`.
    pub fn load(node_id: u64) -> String {
        format!("{LOAD}{node_id:020}")
    }
    /// `kernels/{id}`.
    pub fn kernel(id: &str) -> String {
        format!("{KERNELS}{id}")
    }
    /// `ready/{kernel}/{node:020}`.
    pub fn ready(kernel_id: &str, node_id: u64) -> String {
        format!("{READY}{kernel_id}/{node_id:020}")
    }
    /// `quiesced/{kernel}/{node:020}`.
    pub fn quiesced(kernel_id: &str, node_id: u64) -> String {
        format!("{QUIESCED}{kernel_id}/{node_id:020}")
    }
    /// `draining/{node:020}`.
    pub fn draining(node_id: u64) -> String {
        format!("{DRAINING}{node_id:020}")
    }
    /// `elect/{cell}`.
    pub fn elect(cell: &str) -> String {
        format!("{ELECT}{cell}")
    }
    /// `ns/{name}`.
    pub fn ns(name: &str) -> String {
        format!("{NS}{name}")
    }
}

/// Encodes a record as a store value.
pub fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    // Serialising these plain structs cannot fail (no maps with non-string keys).
    serde_json::to_vec(v).unwrap_or_default()
}

/// Decodes a store value, naming the key on failure.
pub fn decode<T: serde::de::DeserializeOwned>(key: &[u8], value: &[u8]) -> anyhow::Result<T> {
    serde_json::from_slice(value)
        .map_err(|e| anyhow::anyhow!("undecodable record at {}: {e}", String::from_utf8_lossy(key)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_groups_are_allocated_past_the_reserved_ids_and_the_ones_in_use() {
        let none = std::collections::BTreeSet::new();
        assert_eq!(next_kernel_group(None, &none), FIRST_KERNEL_GROUP);
        assert_eq!(next_kernel_group(Some(3), &none), FIRST_KERNEL_GROUP, "reserved ids are never handed out");
        assert_eq!(next_kernel_group(Some(40), &none), 40);
        // An old record's hashed group, or one allocated by a counter that was reset, is skipped.
        let used: std::collections::BTreeSet<u64> = [40, 41, 43, META_GROUP].into_iter().collect();
        assert_eq!(next_kernel_group(Some(40), &used), 42);
        assert_ne!(next_kernel_group(None, &used), META_GROUP);
    }

    /// A record written when group ids were FNV hashes of the kernel id loads unchanged:
    /// its kernel keeps its group, and the counter steps over it.
    #[test]
    fn records_with_hashed_groups_still_load_and_keep_their_group() {
        let old = br#"{"id":"6f1c1c0e-8d5e-4b7e-9a51-0c3f1f7f2b11","name":"python3","gpus":1,
            "group":5764349834012331437,"replicas":[{"replica":1,"node_id":1}],"created_ms":1}"#;
        let r: KernelRecord = decode(b"kernels/x", old).expect("old record loads");
        assert_eq!(r.group, 5_764_349_834_012_331_437);
        assert!(r.env.is_empty());
        let in_use = std::collections::BTreeSet::from([r.group]);
        assert_eq!(next_kernel_group(Some(r.group), &in_use), r.group + 1);
    }

    #[test]
    fn records_round_trip_and_bad_bytes_name_the_key() {
        let r = ElectionRecord { round: 2, winner: Some(3), node_id: 7, reason: String::new() };
        let back: ElectionRecord = decode(b"elect/x", &encode(&r)).unwrap();
        assert_eq!(back, r);
        let err = decode::<ElectionRecord>(b"elect/x", b"{not json").unwrap_err();
        assert!(format!("{err}").contains("elect/x"));
    }
}
