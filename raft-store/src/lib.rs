//! An embedded, durable multi-group Raft store on tikv's `raft` crate.
//!
//! One [`RaftStore`] per process hosts many raft groups (one driving thread, TiKV style), keeps
//! them in one `raft-engine` log (one fsync per loop iteration for all groups), talks to other
//! nodes over one mutually-authenticated TLS connection per peer, and runs a replicated key-value
//! state machine per group ([`Kv`]: put, delete, CAS, linearizable and stale reads, prefix range,
//! watch, TTL leases, atomic multi-key transactions). Any member node can be used: writes and
//! linearizable reads on a follower are forwarded to the leader. It knows nothing about notebooks.
//!
//! ```no_run
//! # async fn demo() -> raft_store::Result<()> {
//! use raft_store::{RaftStore, StoreConfig, TransportSecurity};
//! let cfg = StoreConfig::new(1, "/var/lib/app/raft".into(), "127.0.0.1:7001".parse().unwrap(),
//!     TransportSecurity::Plaintext);
//! let store = RaftStore::open(cfg)?;
//! store.create_group(7, &[1]).await?;
//! store.kv(7).put("k", "v").await?;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

pub mod config;
mod engine;
pub mod error;
mod forward;
pub mod linearizability;
mod logging;
pub mod metrics;
pub mod service;
pub mod state_machine;
mod storage;
mod store;
pub mod transport;

pub use config::{StoreConfig, TransportSecurity};
pub use engine::request::{GroupStatus, Membership, MembershipChange, ReadOutput};
pub use error::{Error, Result};
#[doc(hidden)]
pub use forward::wire::{fuzz_forward_payload, fuzz_forward_seeds};
pub use state_machine::{
    CasOutcome, Compare, CompareTarget, KeyValue, Txn, TxnOp, TxnOpResult, TxnResponse, WatchEvent, WatchEventKind,
};
pub use store::{Kv, LeaseId, RaftStore, Watch, MAX_LEASE_TTL};
pub use transport::tls::{generate_cluster_pki, NodeTlsFiles};
