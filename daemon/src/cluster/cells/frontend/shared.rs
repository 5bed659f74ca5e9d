//! What every front-end kernel of a host shares: the meta group, this host's raft store,
//! the metrics, the in-process link to this host's replicas, and the
//! `hosts/` and `load/` records pre-selection reads, cached until a watch sees them change.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use raft_store::{Kv, RaftStore};
use tokio::sync::watch;

use super::metrics::FrontendMetrics;
use crate::cluster::cells::local_link::LocalReplicas;
use crate::cluster::cells::state_sync::NsCell;
use crate::cluster::control::meta::Cluster;
use crate::cluster::control::records::{decode, keys, HostRecord, KernelRecord, LoadRecord};

/// Longest a cached `hosts/` + `load/` read serves pre-selection without a change seen.
const META_CACHE_MAX_AGE: Duration = Duration::from_secs(1);

/// What every front-end kernel of this host shares.
pub(super) struct Shared {
    pub(super) meta: Kv,
    /// This host's raft store, to read a kernel group's last executor when this host is a member.
    pub(super) store: Option<RaftStore>,
    pub(super) metrics: FrontendMetrics,
    /// Bumped on every `hosts/` or `load/` change.
    pub(super) changes: watch::Receiver<u64>,
    /// `hosts/` and `load/` as last read, with the `changes` count they were read at.
    pub(super) cache: Mutex<Option<MetaCache>>,
    /// This host's node id and its replicas, linked in-process (set once the gateway runs).
    pub(super) local: std::sync::OnceLock<(u64, Arc<dyn LocalReplicas>)>,
    /// The cluster handle, to ask the meta leader to move a replica (set once the gateway runs).
    pub(super) cluster: std::sync::OnceLock<Arc<Cluster>>,
}

/// The meta records a cell's pre-selection reads, kept between changes: reading them from
/// the store queues behind the raft engine's log writes, on every cell's path.
#[derive(Clone)]
pub(super) struct MetaCache {
    changes: u64,
    read_at: Instant,
    hosts: HashMap<u64, HostRecord>,
    loads: HashMap<u64, LoadRecord>,
}

impl Shared {
    /// Live hosts and their loads (local meta state: a host whose lease expired is gone),
    /// from the cache while no `hosts/` or `load/` change was seen (and at most
    /// [`META_CACHE_MAX_AGE`] old, in case the watch is down).
    pub(super) async fn hosts_and_loads(&self) -> (HashMap<u64, HostRecord>, HashMap<u64, LoadRecord>) {
        let changes = *self.changes.borrow();
        {
            let cache = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(c) = cache.as_ref().filter(|c| c.changes == changes && c.read_at.elapsed() < META_CACHE_MAX_AGE)
            {
                return (c.hosts.clone(), c.loads.clone());
            }
        }
        let hosts: HashMap<u64, HostRecord> =
            self.range::<HostRecord>(keys::HOSTS).await.into_iter().map(|h| (h.node_id, h)).collect();
        let loads: HashMap<u64, LoadRecord> =
            self.range::<LoadRecord>(keys::LOAD).await.into_iter().map(|l| (l.node_id, l)).collect();
        let fresh = MetaCache { changes, read_at: Instant::now(), hosts: hosts.clone(), loads: loads.clone() };
        *self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(fresh);
        (hosts, loads)
    }

    /// Live hosts by node id.
    pub(super) async fn hosts(&self) -> HashMap<u64, HostRecord> {
        self.hosts_and_loads().await.0
    }

    async fn range<T: serde::de::DeserializeOwned>(&self, prefix: &str) -> Vec<T> {
        match self.meta.range_stale(prefix.as_bytes(), 0).await {
            Ok(out) => out
                .kvs
                .iter()
                .filter_map(|kv| match decode::<T>(&kv.key, &kv.value) {
                    Ok(v) => Some(v),
                    Err(e) => {
                        tracing::warn!(error = format!("{e:#}"), "skipping a record");
                        None
                    }
                })
                .collect(),
            Err(e) => {
                tracing::warn!(prefix, error = %e, "cannot read the meta store");
                Vec::new()
            }
        }
    }

    /// The replica (and host) that executed the kernel's last synchronised cell, from the
    /// kernel group's `ns-cell` (local state; `None` when this host is not a member).
    pub(super) async fn group_last_executor(&self, group: u64) -> Option<(u32, u64)> {
        let out = self.store.as_ref()?.kv(group).get_stale(keys::NS_CELL.as_bytes()).await.ok()?;
        let kv = out.kvs.first()?;
        let cell: NsCell = decode(&kv.key, &kv.value).ok()?;
        Some((cell.replica, cell.node_id))
    }

    pub(super) async fn kernel(&self, id: &str) -> Option<KernelRecord> {
        let key = keys::kernel(id);
        let out = self.meta.get_stale(key.as_bytes()).await.ok()?;
        let kv = out.kvs.first()?;
        decode(&kv.key, &kv.value).ok()
    }
}

/// Bumps `tx` on every committed change under `hosts/` or `load/` (re-watching when a
/// watch ends), so waiting cells retry when GPUs or hosts come and go.
pub(super) async fn watch_hosts_and_loads(meta: Kv, tx: watch::Sender<u64>) {
    let mut from = [0u64, 0u64];
    loop {
        let hosts = meta.watch(keys::HOSTS.as_bytes(), from[0]).await;
        let loads = meta.watch(keys::LOAD.as_bytes(), from[1]).await;
        let (mut hosts, mut loads) = match (hosts, loads) {
            (Ok(h), Ok(l)) => (h, l),
            (h, l) => {
                let e = h.err().or(l.err()).map(|e| e.to_string()).unwrap_or_default();
                tracing::debug!(error = %e, "cannot watch hosts/load yet; retrying");
                from = [0, 0];
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        loop {
            let (i, ev) = tokio::select! {
                ev = hosts.next() => (0, ev),
                ev = loads.next() => (1, ev),
            };
            let Some(ev) = ev else { break };
            from[i] = ev.revision + 1;
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
        // A watch ended (fell behind, snapshot): state may have changed unseen.
        tx.send_modify(|n| *n = n.wrapping_add(1));
        from = [0, 0];
    }
}
