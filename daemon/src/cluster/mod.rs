//! The cluster (issue 7): hosts in a meta raft group, kernels as three replicas on
//! three hosts with a raft group each, executor election and namespace sync.
//!
//! - [`records`]: what is stored where (shared by everything below).

pub mod records;
pub mod election;
pub mod objects;
pub mod replica_host;
pub mod state_sync;
