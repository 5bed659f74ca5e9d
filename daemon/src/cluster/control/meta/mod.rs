//! The [`Cluster`] handle: this host's view of the meta group (hosts, loads, kernels,
//! readiness) and the cluster decisions the meta leader takes (placement, re-placement).
//!
//! Reads are served from this host's replica of the meta group (`*_stale`): the meta
//! leader's own state is current, a follower's trails by at most a heartbeat, and every
//! decision that must be exact (placing a kernel, replacing a replica) runs on the leader
//! and commits by compare-and-swap. A call that must run on the leader and finds another
//! host leading is forwarded to that host's HTTP API (`/api/v1/cluster/...`).
//!
//! One file per idea, each adding to the one handle:
//! - [`handle`]: the handle, its settings, and the reads of the meta group.
//! - [`watch`]: the `kernels/` watch the supervisor follows.
//! - [`forward`]: running a call on the meta leader, forwarded over HTTP when it is another host.
//! - [`kernels`]: kernel records: placement, deletion, re-placement (meta leader).
//! - [`memory`]: host memory in placement: what a host reports, what a replica is expected to need.
//! - [`members`]: joining and leaving the meta group (meta leader), draining a host.
//! - [`moves`]: moving a replica to another host (begin, finish, abort; meta leader).
//! - [`status`]: the cluster as `nbos cluster status` shows it.
//! - [`error`]: why a cluster call failed.
//! - [`demand`]: demand the leader could not meet (for the autoscaler).
//! - [`canary`]: canary registers an operator (or the fault campaign) reads and writes.
//!
//! The background work (heartbeat, peer discovery, re-placement of lost replicas) is
//! [`super::membership`]'s, which starts it ([`Cluster::start`]): the handle does not call
//! into it.

pub mod canary;
pub mod demand;
pub mod error;
pub mod forward;
pub mod handle;
pub mod kernels;
pub mod members;
pub mod memory;
pub mod moves;
pub mod status;
pub mod watch;

pub use canary::{CanaryAnswer, CanaryOp};
pub use error::{ClusterError, Result};
pub use forward::FORWARDED_HEADER;
pub(in crate::cluster) use forward::{Authority, HttpMethod};
pub use handle::{Cluster, ClusterSettings, LoadProbe};
pub use kernels::KernelSpec;
pub use members::{peer_key, LeaveReport, PeerRecord, PEERS};
pub use moves::{MoveAnswer, MoveRequest};
pub use status::{ClusterStatus, MemberStatus, MovingStatus};
pub use watch::KernelEvent;
