//! The HTTP face of a host: the Jupyter gateway API (with the single-host platform,
//! issue 6), the operator API (`/api/v1/…`), `/metrics` and `/healthz`.
//!
//! - [`router`]: every route; [`state`]: what the handlers share ([`AppState`]).
//! - [`kernels`], [`kernelspecs`], [`channels`] (with [`cell`]): the Kernel Gateway API.
//! - [`internal_router`]: host-to-host calls on this host's replicas; [`legacy_replica_query`]:
//!   their `?replica=local` form of the previous release.
//! - [`cluster`]: the same API in cluster mode, and the cluster routes about this host's replicas.
//! - [`operator`]: status, GPUs, leases, health and metrics.
//! - [`auth`], [`calling`], [`error`], [`kernel_request`]: what several handlers share
//!   (the caller, ownership, the audit log); [`quota`]: per-user and per-group quotas.
//! - [`listener`], [`serve`], [`conn_caps`]: connections, within the listener's timeouts and caps.

pub mod auth;
pub mod calling;
pub mod cell;
pub mod channels;
pub mod cluster;
pub mod conn_caps;
pub mod error;
pub mod internal_router;
pub mod kernel_request;
pub mod kernels;
pub mod kernelspecs;
pub mod legacy_replica_query;
pub mod limits;
pub mod listener;
pub mod operator;
pub mod quota;
pub mod router;
pub mod serve;
pub mod state;

pub use router::router;
pub use state::AppState;
