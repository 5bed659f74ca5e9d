//! The front-end of a replicated kernel on one host (F-cluster "path of a cell"):
//! one [`FrontendKernel`] per kernel per host, shared by this host's client sockets.
//!
//! It keeps one link per replica host (in-process to this host's own replica, else an
//! internal WebSocket, `/internal/v1/replicas/{id}/channels` with this host's node credential, reconnected with
//! backoff), serialises the kernel's cells, and runs each cell's election rounds:
//! pre-selection ([`nbos_sched::preselect`]), `execute_request` to every live replica
//! with `metadata.nbos_election`, then the outcomes: `executed` → the reply goes to the
//! client; `yielded` → the next round (after telling the client once that the cell waits
//! for GPUs, and waiting for a `load/` change); `stale` → the next round from the current
//! record; `taken` → the winner's outputs, or `ExecutorHostDied` when its host is gone.
//!
//! Clients see one kernel: IOPub is forwarded only from the replica host a request
//! went to (the cell's executor), so the other replicas and the daemons' own silent
//! requests never reach them. A replica host counts as live when its `hosts/` record
//! exists and its link is connected.
//!
//! One file per idea:
//! - [`frontends`]: this host's front-ends, opened on a client's first use.
//! - [`kernel`]: one kernel's front-end: client messages in, replica messages out.
//! - [`cell_driver`]: the cell worker: one cell at a time, the I/O of its election rounds.
//! - [`cell_loop`]: what a cell does between its rounds (a pure state machine): wait for
//!   GPUs, ask for a move, wait for a replica, fail, or run the next round.
//! - [`election_round`]: what a round makes of what it hears (a pure state machine).
//! - [`replica_link`]: the link to one replica host (in-process for this host's own replica).
//! - [`shared`]: what every front-end of this host shares (cached `hosts/` and `load/` reads).
//! - [`state`], [`events`]: what a front-end knows of its cells, and what its worker hears.
//! - [`election_message`]: `metadata.nbos_election`, the election's part of a message.
//! - [`metrics`]: the front-end's metrics.

pub mod cell_driver;
pub mod cell_loop;
pub mod election_message;
pub mod election_round;
pub mod events;
pub mod frontends;
pub mod kernel;
pub mod metrics;
pub mod replica_link;
pub mod shared;
pub mod state;

pub use frontends::Frontends;
pub use kernel::FrontendKernel;
pub use metrics::{FrontendMetrics, MetricsRegistry};
pub use state::ExecutionInfo;
