//! The large objects this host's kernel groups refer to: what the object collector must
//! keep, as far as this host knows (its replicas' applied state, read locally).

use std::collections::BTreeSet;

use anyhow::Context;
use raft_store::RaftStore;
use serde::{Deserialize, Serialize};

use super::records::{NsValue, Payload};
use crate::cluster::control::records::{keys, META_GROUP};

/// What one host answers to `GET /api/v1/cluster/objects/refs`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRefs {
    /// The host.
    pub node_id: u64,
    /// Kernel groups read (every group this host is a member or learner of).
    pub groups: u64,
    /// The sha256 of every object an `ns/` value of those groups points to.
    pub objects: BTreeSet<String>,
}

/// Reads every kernel group of `store` (local state, which may lag the leader's: a lagging
/// replica's pointers are ones it still needs).
pub async fn referenced_objects(store: &RaftStore) -> anyhow::Result<HostRefs> {
    let mut out = HostRefs { node_id: store.node_id(), ..HostRefs::default() };
    for group in store.groups().await.context("listing this host's raft groups")? {
        if group == META_GROUP {
            continue;
        }
        let read = match store.kv(group).range_stale(keys::NS, 0).await {
            Ok(r) => r,
            // Destroyed between the listing and the read: it refers to nothing any more.
            Err(raft_store::Error::GroupNotFound(_)) => continue,
            Err(e) => return Err(e).with_context(|| format!("reading kernel group {group}")),
        };
        out.groups += 1;
        for kv in &read.kvs {
            let value = NsValue::decode(&kv.key, &kv.value).with_context(|| format!("kernel group {group}"))?;
            if value.payload == Payload::Object {
                out.objects.insert(value.sha256);
            }
        }
    }
    Ok(out)
}
