//! The `kernels/` watch: every kernel record, then each change in commit order, resynced
//! from a full read whenever the underlying watch ends. The supervisor follows it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use raft_store::WatchEventKind;
use tokio::sync::mpsc;

use super::error::Result;
use super::handle::Cluster;
use crate::cluster::control::records::{self, keys, KernelRecord};

/// A change under `kernels/`, as [`Cluster::watch_kernels`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelEvent {
    /// The kernel exists with this record (created, re-placed, or present when the watch started).
    Put(KernelRecord),
    /// The kernel was deleted.
    Delete(String),
}

impl Cluster {
    /// Every kernel record now, then each change under `kernels/` in commit order. When the
    /// underlying watch ends (fell behind, snapshot installed) it resynchronises from a full
    /// read: `Put` for every record, `Delete` for every kernel that vanished meanwhile.
    ///
    /// The reads are linearizable (through the meta leader), never this host's replica: a
    /// replica that is behind (replaying its log after a restart, or cut off) would show
    /// records that are no longer true and then every version since, one by one, and the
    /// supervisor acts on each (it started and destroyed kernel-group replicas of moves
    /// long finished: the fault campaign's `cluster_restart` after `migrate`/`leave`).
    pub async fn watch_kernels(self: &Arc<Self>) -> Result<mpsc::Receiver<KernelEvent>> {
        let (tx, rx) = mpsc::channel(256);
        // The first read happens here so that a caller sees errors (no meta leader) at once.
        let first = self.meta.range_at(keys::KERNELS, 0).await?;
        let this = self.clone();
        let task = tokio::spawn(async move {
            let mut known: BTreeSet<String> = BTreeSet::new();
            let mut snapshot = Some(first);
            loop {
                let out = match snapshot.take() {
                    Some(s) => s,
                    None => match this.meta.range_at(keys::KERNELS, 0).await {
                        Ok(s) => s,
                        Err(e) => {
                            tracing::warn!(error = %e, "kernel watch: cannot read kernels/; retrying");
                            tokio::time::sleep(Duration::from_millis(500)).await;
                            continue;
                        }
                    },
                };
                let mut now: BTreeSet<String> = BTreeSet::new();
                for kv in &out.kvs {
                    match records::decode::<KernelRecord>(&kv.key, &kv.value) {
                        Ok(r) => {
                            now.insert(r.id.clone());
                            if tx.send(KernelEvent::Put(r)).await.is_err() {
                                return;
                            }
                        }
                        Err(e) => tracing::warn!(error = %e, "kernel watch: skipping a record"),
                    }
                }
                for gone in known.difference(&now) {
                    if tx.send(KernelEvent::Delete(gone.clone())).await.is_err() {
                        return;
                    }
                }
                known = now;
                let mut watch = match this.meta.watch(keys::KERNELS, out.applied_index + 1).await {
                    Ok(w) => w,
                    Err(e) => {
                        tracing::debug!(error = %e, "kernel watch: re-reading kernels/");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                while let Some(ev) = watch.next().await {
                    let id = String::from_utf8_lossy(&ev.key[keys::KERNELS.len().min(ev.key.len())..]).into_owned();
                    let event = match (ev.kind, ev.value) {
                        (WatchEventKind::Put, Some(v)) => match records::decode::<KernelRecord>(&ev.key, &v) {
                            Ok(r) => {
                                known.insert(r.id.clone());
                                KernelEvent::Put(r)
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "kernel watch: skipping a record");
                                continue;
                            }
                        },
                        _ => {
                            known.remove(&id);
                            KernelEvent::Delete(id)
                        }
                    };
                    if tx.send(event).await.is_err() {
                        return;
                    }
                }
            }
        });
        if let Ok(mut t) = self.tasks.lock() {
            t.retain(|t| !t.is_finished());
            t.push(task);
        }
        Ok(rx)
    }
}
