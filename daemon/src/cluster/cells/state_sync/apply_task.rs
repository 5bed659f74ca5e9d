//! The follower side's task: watches `ns` in the kernel group and applies each committed
//! cell to the local kernel in revision order (the whole namespace at start, after a
//! snapshot, or when the watch history is compacted), and hands the group's leadership to
//! each cell's executor.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use raft_store::{Kv, RaftStore, WatchEvent, WatchEventKind};
use tokio::sync::watch;

use super::config::SyncConfig;
use super::kernel_calls::{call_sync, py_str};
use super::manifest::{hand_to_kernel, scratch_dir, Manifest, ManifestEntry};
use super::records::{NsCell, NsValue, Payload};
use crate::cluster::cells::election::Proposer;
use crate::cluster::cells::objects::{sha256_hex, Objects};
use crate::cluster::cells::sync_metrics::{ApplyLabels, SideLabels, SyncMetrics};
use crate::cluster::control::records::{self, keys};
use crate::kernel::LocalKernel;

/// Prefix the applier watches: `ns/` entries and the `ns-cell` marker.
const WATCH_PREFIX: &str = "ns";
/// The payload pack of a follower's manifest directory.
const APPLY_PACK: &str = "payloads.pack";
/// Failed attempts at applying one cell before the replica is shown broken (it keeps trying).
const APPLY_ATTEMPTS: u32 = 3;

/// What the applier shares with its users.
#[derive(Debug, Default)]
pub(super) struct AppliedState {
    /// Inline payload bytes per name, as of the applied revision.
    pub(super) inline: BTreeMap<String, u64>,
    /// Payload bytes per name (inline or in the object store), as of the applied revision:
    /// the namespace's size, a floor on a new replica's memory.
    pub(super) sizes: BTreeMap<String, u64>,
    /// Set while a cell cannot be applied: the replica's namespace is behind.
    pub(super) broken: Option<String>,
    /// Set for good once the kernel ran a cell the group did not commit: its namespace
    /// holds changes no other replica has, which no later apply undoes. Only a new kernel
    /// process (which gets the whole namespace) follows the group again.
    pub(super) diverged: Option<String>,
    /// Catch-ups done (start, snapshot, compaction).
    pub(super) catch_ups: u64,
    /// The first catch-up is done: until then the kernel process reflects nothing of the
    /// group (it is new, also when this replica executed the group's latest cell before a
    /// restart), and no cell may run here.
    pub(super) started: bool,
    /// The last synchronised cell as of the applied revision.
    pub(super) last_cell: Option<NsCell>,
    /// A cell that changed no names was applied without running the kernel: its execution
    /// count is set only when this replica is about to execute
    /// ([`super::applier::Applier::settle_count`]).
    pub(super) count_pending: Option<u64>,
}

/// The applier's task.
pub(super) struct Run {
    pub(super) kernel: Arc<LocalKernel>,
    pub(super) store: RaftStore,
    pub(super) kv: Kv,
    pub(super) objects: Objects,
    pub(super) cfg: SyncConfig,
    pub(super) me: Proposer,
    pub(super) metrics: SyncMetrics,
    pub(super) applied: watch::Sender<u64>,
    pub(super) shared: Arc<Mutex<AppliedState>>,
}

/// One revision's changes under `ns`.
#[derive(Default)]
struct Batch {
    puts: BTreeMap<String, NsValue>,
    deletes: BTreeSet<String>,
    cell: Option<NsCell>,
    /// A catch-up's whole inline map (names → inline bytes), replacing the applier's.
    inline: Option<BTreeMap<String, u64>>,
    /// A catch-up's whole size map (names → payload bytes), replacing the applier's.
    sizes: Option<BTreeMap<String, u64>>,
}

impl Run {
    fn lock(&self) -> std::sync::MutexGuard<'_, AppliedState> {
        self.shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Applies until aborted, retrying with backoff after any failure.
    pub(super) async fn run(self) {
        let mut backoff = Duration::from_millis(50);
        loop {
            match self.follow().await {
                Ok(()) => backoff = Duration::from_millis(50),
                Err(e) => {
                    tracing::debug!(group = self.kv.group(), error = format!("{e:#}"), "namespace applier retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    /// Catches up from the local state, then follows the watch until it ends.
    async fn follow(&self) -> anyhow::Result<()> {
        let from = self.catch_up_batch().await?;
        let mut watch = match self.kv.watch(WATCH_PREFIX.as_bytes(), from + 1).await {
            Ok(w) => w,
            Err(raft_store::Error::Compacted { .. }) => return Ok(()),
            Err(e) => return Err(e).context("watching the kernel group's namespace"),
        };
        let mut pending: Vec<WatchEvent> = Vec::new();
        while let Some(ev) = watch.next().await {
            let is_cell = ev.key == keys::NS_CELL.as_bytes() && ev.kind == WatchEventKind::Put;
            let revision = ev.revision;
            pending.push(ev);
            if is_cell {
                let batch = self.batch_of(std::mem::take(&mut pending))?;
                self.apply(batch, revision, false).await?;
            }
        }
        // Ended (snapshot installed, or we fell behind): catch up again.
        Ok(())
    }

    fn batch_of(&self, events: Vec<WatchEvent>) -> anyhow::Result<Batch> {
        let mut b = Batch::default();
        for ev in events {
            let Some(rest) = ev.key.strip_prefix(keys::NS.as_bytes()) else {
                if ev.key == keys::NS_CELL.as_bytes() {
                    if let Some(v) = &ev.value {
                        b.cell = Some(records::decode(&ev.key, v)?);
                    }
                }
                continue;
            };
            let name = String::from_utf8_lossy(rest).into_owned();
            match (ev.kind, ev.value) {
                (WatchEventKind::Put, Some(v)) => {
                    b.deletes.remove(&name);
                    b.puts.insert(name, NsValue::decode(&ev.key, &v)?);
                }
                _ => {
                    b.puts.remove(&name);
                    b.deletes.insert(name);
                }
            }
        }
        Ok(b)
    }

    /// Applies the whole local namespace as one batch; returns its revision.
    async fn catch_up_batch(&self) -> anyhow::Result<u64> {
        let out = self.kv.range_stale(WATCH_PREFIX.as_bytes(), 0).await.context("reading the namespace")?;
        // What the kernel already reflects is not applied again: only entries changed after
        // it, less the latest cell when this replica executed it (a cell with more changes
        // than a watch buffers always ends here, on its executor too).
        let before = *self.applied.borrow();
        let mut cell_rev = 0;
        let mut b = Batch::default();
        for kv in &out.kvs {
            if kv.key == keys::NS_CELL.as_bytes() {
                b.cell = Some(records::decode(&kv.key, &kv.value)?);
                cell_rev = kv.mod_revision;
            }
        }
        // Only a kernel process that has been following the group can hold a cell it executed:
        // a new one (daemon or kernel restarted) gets every name, its own last cell's too.
        let started = self.lock().started;
        let own_latest =
            started && b.cell.as_ref().is_some_and(|c| c.replica == self.me.replica && c.node_id == self.me.node_id);
        let mut present = BTreeMap::new();
        let mut sizes = BTreeMap::new();
        for kv in &out.kvs {
            let Some(rest) = kv.key.strip_prefix(keys::NS.as_bytes()) else { continue };
            let name = String::from_utf8_lossy(rest).into_owned();
            let value = NsValue::decode(&kv.key, &kv.value)?;
            present.insert(name.clone(), value.inline_bytes());
            sizes.insert(name.clone(), value.size);
            let already = kv.mod_revision <= before || (own_latest && kv.mod_revision == cell_rev);
            if !already {
                b.puts.insert(name, value);
            }
        }
        // Names this replica holds that the group no longer has.
        let known: BTreeSet<String> = self.lock().inline.keys().cloned().collect();
        b.deletes = known.into_iter().filter(|n| !present.contains_key(n)).collect();
        let revision = out.applied_index.max(before);
        let cell_is_new = cell_rev > before && !own_latest;
        self.lock().catch_ups += 1;
        if b.puts.is_empty() && b.deletes.is_empty() && !cell_is_new {
            let mut g = self.lock();
            g.inline = present;
            g.sizes = sizes;
            if b.cell.is_some() {
                g.last_cell = b.cell;
            }
            g.started = true;
            drop(g);
            self.applied.send_replace(revision);
            return Ok(revision);
        }
        b.inline = Some(present);
        b.sizes = Some(sizes);
        self.apply(b, revision, true).await?;
        Ok(revision)
    }

    /// When this node leads the group and `executor` (the host of a cell's executor) is
    /// another node, hands leadership to it, off the cell's path: the next cell most often
    /// runs on the same replica (pre-selection prefers it), and then its election swap and
    /// namespace commit are proposed locally instead of forwarded to a remote leader.
    fn follow_executor(&self, executor: u64) {
        if executor == self.me.node_id {
            return;
        }
        let (store, group, me) = (self.store.clone(), self.kv.group(), self.me.node_id);
        tokio::spawn(async move {
            let Ok(status) = store.status(group).await else { return };
            if status.role != "leader" || status.leader != Some(me) {
                return;
            }
            match store.transfer_leader(group, executor).await {
                Ok(()) => tracing::debug!(group, to = executor, "kernel group leadership follows the executor"),
                Err(e) => tracing::debug!(group, to = executor, error = %e, "leadership transfer not started"),
            }
        });
    }

    async fn apply(&self, batch: Batch, revision: u64, full: bool) -> anyhow::Result<()> {
        let own =
            !full && batch.cell.as_ref().is_some_and(|c| c.replica == self.me.replica && c.node_id == self.me.node_id);
        if let Some(c) = batch.cell.as_ref().filter(|_| !full) {
            self.follow_executor(c.node_id);
        }
        // A cell that changed no names carries only its execution count: not worth running
        // the kernel for (it would compete for CPU with the next cell's election); the count
        // is set when this replica is about to execute.
        let count_only = !own && !full && batch.puts.is_empty() && batch.deletes.is_empty();
        if count_only {
            self.lock().count_pending = batch.cell.as_ref().map(|c| c.execution_count);
            self.metrics.cells_applied.get_or_create(&ApplyLabels { mode: "count_only" }).inc();
        } else if !own {
            let mut attempt = 0u32;
            loop {
                attempt += 1;
                let started = std::time::Instant::now();
                match self.apply_in_kernel(&batch).await {
                    Ok(()) => {
                        self.metrics.apply_seconds.observe(started.elapsed().as_secs_f64());
                        self.metrics.cells_applied.get_or_create(&ApplyLabels { mode: "kernel" }).inc();
                        break;
                    }
                    Err(e) => {
                        self.metrics.failures.get_or_create(&SideLabels { side: "apply" }).inc();
                        let why = format!("cell at revision {revision} could not be applied: {e:#}");
                        tracing::warn!(group = self.kv.group(), kernel = %self.kernel.id, attempt, "{why}; retrying");
                        if attempt >= APPLY_ATTEMPTS {
                            // Refuse LEAD and fail waiters fast while it lasts; keep trying (a
                            // store or kernel that comes back heals the replica).
                            self.lock().broken = Some(why);
                            self.applied.send_modify(|_| {});
                        }
                        let pause = Duration::from_millis(200).saturating_mul(attempt).min(Duration::from_secs(10));
                        tokio::time::sleep(pause).await;
                    }
                }
            }
            if self.lock().broken.take().is_some() {
                tracing::info!(group = self.kv.group(), kernel = %self.kernel.id, revision, "namespace applier recovered");
            }
        }
        {
            let mut g = self.lock();
            for name in &batch.deletes {
                g.inline.remove(name);
                g.sizes.remove(name);
            }
            for (name, v) in &batch.puts {
                g.inline.insert(name.clone(), v.inline_bytes());
                g.sizes.insert(name.clone(), v.size);
            }
            if let Some(all) = batch.sizes {
                g.sizes = all;
            }
            if let Some(all) = batch.inline {
                g.inline = all;
                g.started = true;
            }
            if batch.cell.is_some() {
                g.last_cell.clone_from(&batch.cell);
            }
            if !count_only {
                // The kernel ran this cell's apply (which sets the count), or executed it.
                g.count_pending = None;
            }
        }
        self.applied.send_replace(revision);
        tracing::debug!(group = self.kv.group(), revision, own, full, names = batch.puts.len(), "namespace applied");
        Ok(())
    }

    async fn apply_in_kernel(&self, batch: &Batch) -> anyhow::Result<()> {
        let dir = scratch_dir(&self.cfg, super::config::APPLY_PREFIX)?;
        let mut set = Vec::with_capacity(batch.puts.len());
        let mut payloads: Vec<(String, Bytes, Option<String>)> = Vec::with_capacity(batch.puts.len());
        // Every payload goes into one pack file (creating a file per small value would cost
        // more than applying it).
        let mut offset = 0u64;
        for (name, v) in &batch.puts {
            let data = match &v.payload {
                // Checked against its sha256 below, with the writes.
                Payload::Inline(b) => {
                    payloads.push((name.clone(), Bytes::from(b.clone()), Some(v.sha256.clone())));
                    b.len() as u64
                }
                // `Objects::get` checks the content against its name.
                Payload::Object => {
                    let data =
                        self.objects.get(&v.sha256).await.with_context(|| format!("fetching the payload of {name}"))?;
                    let n = data.len() as u64;
                    payloads.push((name.clone(), data, None));
                    n
                }
            };
            set.push(ManifestEntry {
                name: name.clone(),
                kind: v.kind.clone(),
                file: APPLY_PACK.to_owned(),
                offset: Some(offset),
                size: data,
                sha256: v.sha256.clone(),
            });
            offset += data;
        }
        let target = dir.path().join(APPLY_PACK);
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            use std::io::Write;
            let file = std::fs::File::create(&target).context("creating the payload pack")?;
            let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
            for (name, data, sha) in payloads {
                if let Some(sha) = sha {
                    anyhow::ensure!(sha256_hex(&data) == sha, "inline payload of {name} does not match its sha256");
                }
                out.write_all(&data).context("writing the payload pack")?;
            }
            out.flush().context("writing the payload pack")?;
            Ok(())
        })
        .await
        .context("writing the payloads")??;
        let manifest = Manifest {
            version: 1,
            execution_count: batch.cell.as_ref().map_or(0, |c| c.execution_count),
            set,
            deleted: batch.deletes.iter().cloned().collect(),
            unpicklable: Vec::new(),
        };
        let path = dir.path().join("manifest.json");
        tokio::fs::write(&path, serde_json::to_vec(&manifest).context("encoding the manifest")?)
            .await
            .context("writing the manifest")?;
        hand_to_kernel(dir.path(), &self.kernel)?;
        let call = format!("apply_cell({})", py_str(&dir.path().display().to_string()));
        let result = call_sync(&self.kernel, &call, self.cfg.kernel_timeout).await?;
        if let Some(failed) = result.get("failed").and_then(|f| f.as_array()).filter(|f| !f.is_empty()) {
            // Those names are unbound on this replica (never stale); the next cell that sets them heals it.
            tracing::warn!(kernel = %self.kernel.id, ?failed, "some namespace values could not be applied");
        }
        Ok(())
    }
}
