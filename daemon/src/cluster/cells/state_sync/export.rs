//! The executor side of namespace sync: after a cell, export what it changed and commit it
//! to the kernel group in one transaction (large payloads to the object store first); and
//! the namespace reset after every replica restarted, the other writer of `ns/`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use raft_store::state_machine::{Compare, Txn, TxnOp};
use raft_store::Kv;

use super::applier::Applier;
use super::config::SyncConfig;
use super::kernel_calls::{call_sync, py_str};
use super::manifest::{check_file, check_name, hand_to_kernel, read_kernel_file, scratch_dir, Manifest, Unpicklable};
use super::records::{NsCell, NsValue, Payload, RESET_PREFIX};
use crate::cluster::cells::election::{Proposer, YIELD_PREFIX};
use crate::cluster::cells::objects::{sha256_hex, Objects};
use crate::cluster::control::records::{self, keys, RunningRecord};
use crate::kernel::LocalKernel;

/// Total inline payload bytes a kernel group may hold: its snapshot travels as one
/// 16 MiB frame, so half of that is the namespace's share; the rest spills to objects.
pub const GROUP_INLINE_BUDGET: u64 = 8 << 20;

/// What an export committed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exported {
    /// Revision of the transaction.
    pub revision: u64,
    /// Names put.
    pub set: usize,
    /// Names deleted.
    pub deleted: usize,
    /// Payload bytes that went through the log.
    pub inline_bytes: u64,
    /// Payload bytes that went to the object store.
    pub object_bytes: u64,
    /// Names that could not be exported (the cell's warning).
    pub unpicklable: Vec<Unpicklable>,
}

/// Exports what the last cell changed in `kernel`'s namespace and commits it to the
/// kernel group as one transaction. `applier` is the local replica's (caught up): it
/// knows the group's inline total and last synchronised cell.
pub async fn export_and_commit(
    kernel: &LocalKernel,
    kv: &Kv,
    objects: &Objects,
    cfg: &SyncConfig,
    cell: &str,
    me: Proposer,
    applier: &Applier,
) -> anyhow::Result<Exported> {
    let dir = scratch_dir(cfg, super::config::EXPORT_PREFIX)?;
    hand_to_kernel(dir.path(), kernel)?;
    call_sync(kernel, &format!("export_cell({})", py_str(&dir.path().display().to_string())), cfg.kernel_timeout)
        .await
        .context("exporting the cell's namespace changes")?;
    let manifest_path = dir.path().join("manifest.json");
    let raw = read_kernel_file(&manifest_path).context("reading the export manifest")?;
    let manifest: Manifest = serde_json::from_slice(&raw).context("undecodable export manifest")?;
    anyhow::ensure!(manifest.version == 1, "export manifest version {} is not 1", manifest.version);

    let touched: BTreeSet<String> = manifest
        .set
        .iter()
        .map(|e| e.name.clone())
        .chain(manifest.deleted.iter().cloned())
        .chain(manifest.unpicklable.iter().map(|u| u.name.clone()))
        .collect();
    let mut budget = GROUP_INLINE_BUDGET.saturating_sub(applier.inline_bytes_excluding(&touched));
    let mut entries = manifest.set.clone();
    // Small first: the most names fit inline; the big ones spill.
    entries.sort_by_key(|e| e.size);
    let mut out = Exported { unpicklable: manifest.unpicklable.clone(), ..Default::default() };
    let mut txn = Txn::new();
    for e in &entries {
        check_name(&e.name)?;
        check_file(&e.file)?;
    }
    // All payloads read and checked in one blocking task (a cell setting thousands of small
    // values is common: they come in one pack file, read once).
    let payloads = {
        let (dir, entries) = (dir.path().to_path_buf(), entries.clone());
        tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<Vec<u8>>> {
            let mut packs: BTreeMap<String, Vec<u8>> = BTreeMap::new();
            entries
                .iter()
                .map(|e| {
                    let path = dir.join(&e.file);
                    let data = match e.offset {
                        None => read_kernel_file(&path).context("reading a payload")?,
                        Some(offset) => {
                            if !packs.contains_key(&e.file) {
                                let pack = read_kernel_file(&path).context("reading a payload pack")?;
                                packs.insert(e.file.clone(), pack);
                            }
                            let pack = &packs[&e.file];
                            let range = usize::try_from(offset)
                                .ok()
                                .and_then(|start| Some(start..start.checked_add(usize::try_from(e.size).ok()?)?))
                                .filter(|r| r.end <= pack.len())
                                .with_context(|| {
                                    format!(
                                        "payload of {} ({} bytes at {offset}) lies outside {} ({} bytes)",
                                        e.name,
                                        e.size,
                                        path.display(),
                                        pack.len()
                                    )
                                })?;
                            pack[range].to_vec()
                        }
                    };
                    anyhow::ensure!(
                        data.len() as u64 == e.size && sha256_hex(&data) == e.sha256,
                        "payload of {} does not match its manifest entry (size {} vs {}, or sha256)",
                        e.name,
                        data.len(),
                        e.size
                    );
                    Ok(data)
                })
                .collect()
        })
        .await
        .context("reading the export's payloads")??
    };
    let mut written: Vec<(String, Bytes)> = Vec::new();
    for (e, data) in entries.iter().zip(payloads) {
        let size = data.len() as u64;
        let payload = if size <= cfg.inline_max_bytes && size <= budget {
            budget -= size;
            out.inline_bytes += size;
            Payload::Inline(data)
        } else {
            // Written (and durable in the store) before the pointer is committed.
            let data = Bytes::from(data);
            objects.put_hashed(data.clone(), &e.sha256).await.with_context(|| format!("storing {}", e.name))?;
            written.push((e.sha256.clone(), data));
            out.object_bytes += size;
            Payload::Object
        };
        let value = NsValue { kind: e.kind.clone(), size, sha256: e.sha256.clone(), payload };
        txn = txn.and_then(TxnOp::put(keys::ns(&e.name).into_bytes(), value.encode()));
        out.set += 1;
    }
    // An unpicklable value was rebound here: the followers' older value is stale, so it goes.
    for name in manifest.deleted.iter().chain(manifest.unpicklable.iter().map(|u| &u.name)) {
        check_name(name)?;
        txn = txn.and_then(TxnOp::delete(keys::ns(name).into_bytes()));
        out.deleted += 1;
    }
    let this = NsCell {
        cell: cell.to_owned(),
        execution_count: manifest.execution_count,
        replica: me.replica,
        node_id: me.node_id,
        recent: Vec::new(),
    };
    let (marker, forgotten) = NsCell::next(applier.last_cell().as_ref(), cfg.elect_history, this);
    for old in &forgotten {
        txn = txn.and_then(TxnOp::delete(keys::elect(old).into_bytes()));
    }
    txn = txn.and_then(TxnOp::put(keys::NS_CELL.as_bytes().to_vec(), records::encode(&marker)));
    // The cell is decided and done: its yield notes go (its `elect/` record stays, it is what
    // keeps a late proposal from winning the cell again).
    txn = txn.and_then(TxnOp::delete_prefix(format!("{}{cell}/", YIELD_PREFIX).into_bytes()));
    // Only while this cell still holds the kernel's lock, which goes with the commit: an
    // executor whose lock a front-end took over (its host looked gone) commits nothing.
    let lock = RunningRecord { cell: cell.to_owned(), replica: me.replica, node_id: me.node_id };
    txn = txn
        .when(Compare::value_equals(keys::RUNNING.as_bytes().to_vec(), records::encode(&lock)))
        .and_then(TxnOp::delete(keys::RUNNING.as_bytes().to_vec()));
    out.revision =
        commit_once(kv, txn, &marker).await.context("committing the cell's namespace to the kernel group")?;
    ensure_still_stored(objects, &written).await;
    tracing::debug!(
        cell,
        revision = out.revision,
        set = out.set,
        deleted = out.deleted,
        inline = out.inline_bytes,
        objects = out.object_bytes,
        "namespace committed"
    );
    Ok(out)
}

/// Checks that the objects this cell wrote are still in the store now that the group refers
/// to them, and writes back any that is not. The collector deletes only objects that no
/// replica refers to and that were last written more than its grace period ago, and it
/// reads the time again just before each delete; this cell's write renews the time. What
/// is left is this cell writing an old object again just after that last read: its delete
/// then follows the write within one request's time, and this check, after the commit,
/// finds the object gone and writes it back.
async fn ensure_still_stored(objects: &Objects, written: &[(String, Bytes)]) {
    for (sha256, data) in written {
        match objects.head(sha256).await {
            Ok(Some(_)) => {}
            Ok(None) => {
                tracing::warn!(sha256, "an object this cell refers to was collected meanwhile; writing it again");
                if let Err(e) = objects.put_hashed(data.clone(), sha256).await {
                    tracing::error!(sha256, error = %e, "could not write back an object this cell refers to");
                }
            }
            // The store is unreachable right now: the object was written a moment ago and
            // the collector would not delete an object that recent.
            Err(e) => tracing::debug!(sha256, error = %e, "could not check a committed object"),
        }
    }
}

/// Commits `txn` (which puts `marker` as `ns-cell`), retrying when the outcome is unknown
/// (leader change, timeout) unless the marker shows it was applied: a cell's namespace is
/// committed once. Returns the transaction's revision.
async fn commit_once(kv: &Kv, txn: Txn, marker: &NsCell) -> anyhow::Result<u64> {
    const ATTEMPTS: u32 = 5;
    let mut attempt = 0;
    loop {
        attempt += 1;
        match kv.txn(txn.clone()).await {
            Ok(resp) if resp.succeeded => return Ok(resp.revision),
            Ok(_) => {
                // An earlier attempt whose outcome was unknown may have applied (and released
                // the lock): then the marker is there.
                if let Ok(Some(kv)) = kv.get(keys::NS_CELL.as_bytes()).await {
                    if records::decode::<NsCell>(&kv.key, &kv.value).ok().as_ref() == Some(marker) {
                        return Ok(kv.mod_revision);
                    }
                }
                anyhow::bail!(
                    "this cell no longer holds the kernel's running lock (a front-end took it over: this host \
                     looked gone), so its changes were not committed"
                )
            }
            Err(e) if e.outcome_unknown() && attempt < ATTEMPTS => {
                tracing::debug!(cell = %marker.cell, attempt, error = %e, "namespace commit outcome unknown; checking");
                tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
                match kv.get(keys::NS_CELL.as_bytes()).await {
                    Ok(Some(kv)) if records::decode::<NsCell>(&kv.key, &kv.value).ok().as_ref() == Some(marker) => {
                        return Ok(kv.mod_revision)
                    }
                    // Not applied (or not known yet): propose again.
                    Ok(_) | Err(_) => {}
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Empties the group's namespace after the kernel's replicas were restarted (a restart
/// means an empty namespace): one transaction deletes every `ns/` entry and puts an
/// `ns-cell` with execution count 0, so followers unbind everything, the next cell is
/// number 1, and a replica that catches up later does not bring back the old state.
/// Returns the revision.
pub async fn reset_namespace(kv: &Kv, node_id: u64, previous: Option<&NsCell>) -> anyhow::Result<u64> {
    let marker = NsCell {
        cell: format!("{RESET_PREFIX}{}", uuid::Uuid::new_v4()),
        execution_count: 0,
        replica: 0,
        node_id,
        recent: Vec::new(),
    };
    // The election history carries over (no record is dropped here).
    let (marker, _) = NsCell::next(previous, usize::MAX, marker);
    let txn = Txn::new()
        .and_then(TxnOp::delete_prefix(keys::NS.as_bytes().to_vec()))
        .and_then(TxnOp::put(keys::NS_CELL.as_bytes().to_vec(), records::encode(&marker)));
    let resp = kv.txn(txn).await.context("resetting the kernel group's namespace")?;
    tracing::info!(group = kv.group(), revision = resp.revision, "kernel group namespace reset (restart)");
    Ok(resp.revision)
}
