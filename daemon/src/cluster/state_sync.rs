//! Namespace synchronisation of a kernel's replicas (F-cluster steps 4 and 6).
//!
//! Executor side ([`export_and_commit`]): after a cell, the local kernel exports what
//! the cell changed (`nbos_kernel.sync.export_cell(dir)` writes `manifest.json` and one
//! payload file per object); payloads up to `inline_max_bytes` go into the raft log
//! inline, larger ones (and any that would take the group's inline total past
//! [`GROUP_INLINE_BUDGET`]) into the large-object store first, then ONE transaction puts
//! and deletes `ns/{name}` and puts `ns-cell`.
//!
//! Follower side ([`Applier`], one per local replica): watches `ns` (which covers `ns/`
//! and `ns-cell`) in the kernel group, and for each committed cell materialises a
//! manifest directory and runs `nbos_kernel.sync.apply_cell(dir)` silently in the local
//! kernel, in revision order. On start, after a snapshot, or when the watch history is
//! compacted, it applies the whole namespace as one batch. Cells the local replica
//! executed itself are only recorded, not re-applied.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use raft_store::state_machine::{Txn, TxnOp};
use raft_store::{Kv, RaftStore, WatchEvent, WatchEventKind};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::election::Proposer;
use super::objects::{sha256_hex, Objects};
use super::records::{self, keys};
use super::sync_metrics::{ApplyLabels, SideLabels, SyncMetrics};
use crate::kernel::Kernel;

/// Total inline payload bytes a kernel group may hold: its snapshot travels as one
/// 16 MiB frame, so half of that is the namespace's share; the rest spills to objects.
pub const GROUP_INLINE_BUDGET: u64 = 8 << 20;
/// Prefix the applier watches: `ns/` entries and the `ns-cell` marker.
const WATCH_PREFIX: &str = "ns";
/// Cell id prefix of the marker a namespace reset puts.
const RESET_PREFIX: &str = "restart-";
/// Magic and version of an `ns/` value.
const NS_MAGIC: &[u8; 4] = b"NBS1";
/// The payload pack of a follower's manifest directory.
const APPLY_PACK: &str = "payloads.pack";
/// Failed attempts at applying one cell before the replica is shown broken (it keeps trying).
const APPLY_ATTEMPTS: u32 = 3;

/// Namespace sync settings (from `[cluster]`).
#[derive(Debug, Clone)]
pub struct SyncConfig {
    /// Payloads up to this size go through the raft log (`cluster.sync_inline_max_bytes`).
    pub inline_max_bytes: u64,
    /// Scratch space for manifest directories (under the state directory).
    pub work_dir: PathBuf,
    /// How long one export or apply may take in the kernel.
    pub kernel_timeout: Duration,
    /// Election records kept per kernel group (the most recent cells'); older ones are
    /// deleted with each cell's commit. A late proposal can only concern a recent cell:
    /// the front-end sends one kernel's cells in order over one connection per host.
    pub elect_history: usize,
}

impl SyncConfig {
    /// Defaults: 1 MiB inline, 10 minutes per export/apply, 256 election records.
    pub fn new(work_dir: PathBuf) -> Self {
        Self { inline_max_bytes: 1 << 20, work_dir, kernel_timeout: Duration::from_secs(600), elect_history: 256 }
    }
}

/// One object in a manifest (`nbos_kernel.sync`'s format).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// Global name.
    pub name: String,
    /// `pickle` or `module`.
    pub kind: String,
    /// Payload file in the manifest directory.
    pub file: String,
    /// Where the payload starts in `file` (a pack of many payloads); absent: the whole file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// Payload size in bytes.
    pub size: u64,
    /// Payload sha256 (hex).
    pub sha256: String,
}

/// A name that could not be exported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unpicklable {
    /// Global name.
    pub name: String,
    /// Why.
    pub error: String,
}

/// `manifest.json` of an export or an apply.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Format version (1).
    pub version: u32,
    /// The shell's execution count after the cell.
    pub execution_count: u64,
    /// Objects set (new, rebound or mutated).
    pub set: Vec<ManifestEntry>,
    /// Names deleted.
    pub deleted: Vec<String>,
    /// Names that could not be exported (executor side only).
    #[serde(default)]
    pub unpicklable: Vec<Unpicklable>,
}

/// Where an `ns/` value's payload is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
enum Payload {
    /// In the value.
    Inline(Vec<u8>),
    /// In the large-object store under its sha256.
    Object,
}

/// An `ns/{name}` value: a small header plus the payload or a pointer to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct NsValue {
    kind: String,
    size: u64,
    sha256: String,
    payload: Payload,
}

impl NsValue {
    fn encode(&self) -> Vec<u8> {
        let mut out = NS_MAGIC.to_vec();
        // Plain data with no maps: postcard cannot fail on it.
        out.extend(postcard::to_stdvec(self).unwrap_or_default());
        out
    }

    fn decode(key: &[u8], value: &[u8]) -> anyhow::Result<Self> {
        let body = value
            .strip_prefix(NS_MAGIC.as_slice())
            .with_context(|| format!("{} is not a namespace value", String::from_utf8_lossy(key)))?;
        postcard::from_bytes(body)
            .with_context(|| format!("undecodable namespace value {}", String::from_utf8_lossy(key)))
    }

    fn inline_bytes(&self) -> u64 {
        match &self.payload {
            Payload::Inline(b) => b.len() as u64,
            Payload::Object => 0,
        }
    }
}

/// The `ns-cell` marker: the last synchronised cell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NsCell {
    /// The cell (its `execute_request` msg_id).
    pub cell: String,
    /// The executor's execution count after it.
    pub execution_count: u64,
    /// The replica that executed it.
    pub replica: u32,
    /// Its host.
    pub node_id: u64,
    /// Cells synchronised before this one, oldest first (at most `elect_history`): their
    /// `elect/` records are kept; the cell that falls out of this list has its record
    /// deleted in the same transaction, so a group's election records stay bounded.
    #[serde(default)]
    pub recent: Vec<String>,
}

impl NsCell {
    /// The marker after `previous` for `cell`, and the cells whose election records go.
    fn next(previous: Option<&NsCell>, history: usize, cell: NsCell) -> (NsCell, Vec<String>) {
        let mut recent = previous.map(|p| p.recent.clone()).unwrap_or_default();
        if let Some(p) = previous {
            if !p.cell.starts_with(RESET_PREFIX) {
                recent.push(p.cell.clone());
            }
        }
        let drop = recent.len().saturating_sub(history);
        let dropped: Vec<String> = recent.drain(..drop).collect();
        (NsCell { recent, ..cell }, dropped)
    }
}

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

fn py_str(s: &str) -> String {
    // A JSON string is a valid Python string literal for what we pass (paths).
    serde_json::Value::from(s).to_string()
}

fn check_name(name: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        !name.is_empty() && name.len() <= 256 && !name.contains(['/', '\0']),
        "invalid namespace name {name:?} in the manifest"
    );
    Ok(())
}

fn check_file(file: &str) -> anyhow::Result<()> {
    let p = Path::new(file);
    anyhow::ensure!(
        p.components().count() == 1 && matches!(p.components().next(), Some(std::path::Component::Normal(_))),
        "manifest payload file {file:?} is not a plain file name"
    );
    Ok(())
}

fn scratch_dir(cfg: &SyncConfig, what: &str) -> anyhow::Result<tempfile::TempDir> {
    std::fs::create_dir_all(&cfg.work_dir)
        .with_context(|| format!("creating the sync work directory {}", cfg.work_dir.display()))?;
    tempfile::Builder::new().prefix(what).tempdir_in(&cfg.work_dir).context("creating a manifest directory")
}

/// Exports what the last cell changed in `kernel`'s namespace and commits it to the
/// kernel group as one transaction. `applier` is the local replica's (caught up): it
/// knows the group's inline total and last synchronised cell.
pub async fn export_and_commit(
    kernel: &Kernel,
    kv: &Kv,
    objects: &Objects,
    cfg: &SyncConfig,
    cell: &str,
    me: Proposer,
    applier: &Applier,
) -> anyhow::Result<Exported> {
    let dir = scratch_dir(cfg, "export-")?;
    call_sync(kernel, &format!("export_cell({})", py_str(&dir.path().display().to_string())), cfg.kernel_timeout)
        .await
        .context("exporting the cell's namespace changes")?;
    let manifest_path = dir.path().join("manifest.json");
    let raw = tokio::fs::read(&manifest_path)
        .await
        .with_context(|| format!("reading the export manifest {}", manifest_path.display()))?;
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
                        None => std::fs::read(&path).with_context(|| format!("reading payload {}", path.display()))?,
                        Some(offset) => {
                            if !packs.contains_key(&e.file) {
                                let pack = std::fs::read(&path)
                                    .with_context(|| format!("reading payload pack {}", path.display()))?;
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
    for (e, data) in entries.iter().zip(payloads) {
        let size = data.len() as u64;
        let payload = if size <= cfg.inline_max_bytes && size <= budget {
            budget -= size;
            out.inline_bytes += size;
            Payload::Inline(data)
        } else {
            // Written (and durable in the store) before the pointer is committed.
            objects.put_hashed(Bytes::from(data), &e.sha256).await.with_context(|| format!("storing {}", e.name))?;
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
    txn = txn.and_then(TxnOp::delete_prefix(format!("{}{cell}/", super::election::YIELD_PREFIX).into_bytes()));
    out.revision =
        commit_once(kv, txn, &marker).await.context("committing the cell's namespace to the kernel group")?;
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

/// Commits `txn` (which puts `marker` as `ns-cell`), retrying when the outcome is unknown
/// (leader change, timeout) unless the marker shows it was applied: a cell's namespace is
/// committed once. Returns the transaction's revision.
async fn commit_once(kv: &Kv, txn: Txn, marker: &NsCell) -> Result<u64, raft_store::Error> {
    const ATTEMPTS: u32 = 5;
    let mut attempt = 0;
    loop {
        attempt += 1;
        match kv.txn(txn.clone()).await {
            Ok(resp) => return Ok(resp.revision),
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
            Err(e) => return Err(e),
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

/// What the applier shares with its users.
#[derive(Debug, Default)]
struct Shared {
    /// Inline payload bytes per name, as of the applied revision.
    inline: BTreeMap<String, u64>,
    /// Set while a cell cannot be applied: the replica's namespace is behind.
    broken: Option<String>,
    /// Catch-ups done (start, snapshot, compaction).
    catch_ups: u64,
    /// The last synchronised cell as of the applied revision.
    last_cell: Option<NsCell>,
    /// A cell that changed no names was applied without running the kernel: its execution
    /// count is set only when this replica is about to execute ([`Applier::settle_count`]).
    count_pending: Option<u64>,
}

/// The follower side of one local replica: applies committed cells to its kernel.
pub struct Applier {
    applied: watch::Receiver<u64>,
    shared: Arc<Mutex<Shared>>,
    kv: Kv,
    kernel: Arc<Kernel>,
    kernel_timeout: Duration,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Applier {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl std::fmt::Debug for Applier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Applier").field("group", &self.kv.group()).field("applied", &*self.applied.borrow()).finish()
    }
}

impl Applier {
    /// Starts applying the group's namespace to `kernel` (replica `me`). `store` is the raft
    /// store `kv` belongs to: while this node leads the group it hands leadership to the host
    /// of each cell's executor (see [`Run::follow_executor`]).
    pub fn start(
        kernel: Arc<Kernel>,
        store: RaftStore,
        kv: Kv,
        objects: Objects,
        cfg: SyncConfig,
        me: Proposer,
        metrics: SyncMetrics,
    ) -> Self {
        let (tx, rx) = watch::channel(0u64);
        let shared = Arc::new(Mutex::new(Shared::default()));
        let kernel_timeout = cfg.kernel_timeout;
        let run = Run {
            kernel: kernel.clone(),
            store,
            kv: kv.clone(),
            objects,
            cfg,
            me,
            metrics,
            applied: tx,
            shared: shared.clone(),
        };
        let task = tokio::spawn(run.run());
        Self { applied: rx, shared, kv, kernel, kernel_timeout, task }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The last revision of the group this replica's namespace reflects.
    pub fn applied(&self) -> u64 {
        *self.applied.borrow()
    }

    /// Why the replica's namespace stopped following the group, if it did.
    pub fn broken(&self) -> Option<String> {
        self.lock().broken.clone()
    }

    /// How many whole-namespace catch-ups ran.
    pub fn catch_ups(&self) -> u64 {
        self.lock().catch_ups
    }

    /// The group's last synchronised cell as of [`Applier::applied`].
    pub fn last_cell(&self) -> Option<NsCell> {
        self.lock().last_cell.clone()
    }

    /// The group's inline payload total, leaving out `names`.
    pub fn inline_bytes_excluding(&self, names: &BTreeSet<String>) -> u64 {
        self.lock().inline.iter().filter(|(n, _)| !names.contains(*n)).map(|(_, b)| *b).sum()
    }

    /// Waits until the namespace reflects `revision`.
    pub async fn wait_applied(&self, revision: u64, timeout: Duration) -> anyhow::Result<()> {
        let mut rx = self.applied.clone();
        let wait = async {
            loop {
                if *rx.borrow_and_update() >= revision {
                    return Ok(());
                }
                if let Some(why) = self.broken() {
                    anyhow::bail!("this replica's namespace is broken: {why}");
                }
                if rx.changed().await.is_err() {
                    anyhow::bail!("the namespace applier stopped");
                }
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .map_err(|_| anyhow::anyhow!("namespace not applied up to revision {revision} within {timeout:?}"))?
    }

    /// Waits until the namespace reflects the group's latest synchronised cell
    /// (linearizable read of `ns-cell`); returns its revision.
    pub async fn catch_up(&self, timeout: Duration) -> anyhow::Result<u64> {
        let deadline = tokio::time::Instant::now() + timeout;
        let latest = loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match tokio::time::timeout(left, self.kv.get(keys::NS_CELL.as_bytes())).await {
                Ok(Ok(latest)) => break latest,
                // A leader change or election in progress: ask again until the deadline.
                Ok(Err(e)) if tokio::time::Instant::now() + Duration::from_millis(100) < deadline => {
                    tracing::debug!(group = self.kv.group(), error = %e, "reading ns-cell failed; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(Err(e)) => return Err(anyhow::Error::new(e).context("reading the group's last synchronised cell")),
                Err(_) => anyhow::bail!("reading ns-cell timed out after {timeout:?}"),
            }
        };
        let revision = latest.map_or(0, |kv| kv.mod_revision);
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        self.wait_applied(revision, left).await?;
        self.settle_count().await?;
        Ok(revision)
    }

    /// Sets the kernel's execution counter if cells that changed no names were applied
    /// without it (so the next cell here is numbered after the group's last one).
    pub async fn settle_count(&self) -> anyhow::Result<()> {
        let Some(count) = self.lock().count_pending.take() else { return Ok(()) };
        let set = call_sync(&self.kernel, &format!("set_execution_count({count})"), self.kernel_timeout).await;
        set.map(|_| ()).context("setting the kernel's execution count")
    }

    /// Waits until the namespace reflects every cell committed before a write this host saw
    /// committed (`key` holding a value `committed` accepts, e.g. the election record a
    /// replica just won with). No round trip to the leader: once this node's own state
    /// shows the write, it applied every entry before it, so its `ns-cell` is at least the
    /// group's latest as of that write, and waiting for the applier to reach it is enough.
    /// Returns the revision waited for.
    pub async fn catch_up_after(
        &self,
        key: &[u8],
        committed: impl Fn(&[u8]) -> bool,
        timeout: Duration,
    ) -> anyhow::Result<u64> {
        let deadline = tokio::time::Instant::now() + timeout;
        // A write answered by a remote leader reaches this node one append later: poll briefly.
        let mut pause = Duration::from_micros(50);
        loop {
            let out = self.kv.get_stale(key.to_vec()).await.context("reading this node's state")?;
            if out.kvs.first().is_some_and(|kv| committed(&kv.value)) {
                break;
            }
            anyhow::ensure!(
                tokio::time::Instant::now() + pause < deadline,
                "this node did not apply the write to {} within {timeout:?}",
                String::from_utf8_lossy(key)
            );
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(5));
        }
        let latest = self.kv.get_stale(keys::NS_CELL.as_bytes()).await.context("reading ns-cell")?;
        let revision = latest.kvs.first().map_or(0, |kv| kv.mod_revision);
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        self.wait_applied(revision, left).await?;
        self.settle_count().await?;
        Ok(revision)
    }
}

/// The applier's task.
struct Run {
    kernel: Arc<Kernel>,
    store: RaftStore,
    kv: Kv,
    objects: Objects,
    cfg: SyncConfig,
    me: Proposer,
    metrics: SyncMetrics,
    applied: watch::Sender<u64>,
    shared: Arc<Mutex<Shared>>,
}

/// One revision's changes under `ns`.
#[derive(Default)]
struct Batch {
    puts: BTreeMap<String, NsValue>,
    deletes: BTreeSet<String>,
    cell: Option<NsCell>,
    /// A catch-up's whole inline map (names → inline bytes), replacing the applier's.
    inline: Option<BTreeMap<String, u64>>,
}

impl Run {
    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn run(self) {
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
        let own_latest = b.cell.as_ref().is_some_and(|c| c.replica == self.me.replica && c.node_id == self.me.node_id);
        let mut present = BTreeMap::new();
        for kv in &out.kvs {
            let Some(rest) = kv.key.strip_prefix(keys::NS.as_bytes()) else { continue };
            let name = String::from_utf8_lossy(rest).into_owned();
            let value = NsValue::decode(&kv.key, &kv.value)?;
            present.insert(name.clone(), value.inline_bytes());
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
            if b.cell.is_some() {
                g.last_cell = b.cell;
            }
            drop(g);
            self.applied.send_replace(revision);
            return Ok(revision);
        }
        b.inline = Some(present);
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
            }
            for (name, v) in &batch.puts {
                g.inline.insert(name.clone(), v.inline_bytes());
            }
            if let Some(all) = batch.inline {
                g.inline = all;
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
        let dir = scratch_dir(&self.cfg, "apply-")?;
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
        let call = format!("apply_cell({})", py_str(&dir.path().display().to_string()));
        let result = call_sync(&self.kernel, &call, self.cfg.kernel_timeout).await?;
        if let Some(failed) = result.get("failed").and_then(|f| f.as_array()).filter(|f| !f.is_empty()) {
            // Those names are unbound on this replica (never stale); the next cell that sets them heals it.
            tracing::warn!(kernel = %self.kernel.id, ?failed, "some namespace values could not be applied");
        }
        Ok(())
    }
}

/// The namespace digest of `kernel` (`nbos_kernel.sync.namespace_digest()`): equal on
/// two replicas with equal state.
pub async fn namespace_digest(kernel: &Kernel, timeout: Duration) -> anyhow::Result<String> {
    let v = call_sync(kernel, "namespace_digest()", timeout).await?;
    let text = v.as_str().context("namespace_digest returned no text")?;
    Ok(text.trim_matches('\'').to_owned())
}

/// Calls `nbos_kernel.sync.{call}` silently in `kernel` and returns its value: the JSON
/// of a `SyncResult`, else the text repr. A Python exception is an error naming it.
async fn call_sync(kernel: &Kernel, call: &str, timeout: Duration) -> anyhow::Result<serde_json::Value> {
    let expr = format!("__import__('nbos_kernel.sync', fromlist=['sync']).{call}");
    let content = kernel.run_internal("", &serde_json::json!({ "r": expr }), timeout).await?;
    let r = &content["user_expressions"]["r"];
    anyhow::ensure!(
        r["status"] == "ok",
        "nbos_kernel.sync.{} failed in the kernel: {}: {}",
        call.split('(').next().unwrap_or(call),
        r["ename"].as_str().unwrap_or("?"),
        r["evalue"].as_str().unwrap_or("?")
    );
    let data = &r["data"];
    Ok(data.get("application/json").cloned().unwrap_or_else(|| data["text/plain"].clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ns_values_round_trip_and_foreign_bytes_are_refused() {
        let v = NsValue {
            kind: "pickle".into(),
            size: 3,
            sha256: sha256_hex(b"abc"),
            payload: Payload::Inline(b"abc".to_vec()),
        };
        assert_eq!(NsValue::decode(b"ns/x", &v.encode()).expect("decode"), v);
        let err = NsValue::decode(b"ns/x", b"{\"json\":1}").expect_err("foreign");
        assert!(format!("{err:#}").contains("ns/x"));
        let mut truncated = v.encode();
        truncated.truncate(8);
        assert!(NsValue::decode(b"ns/x", &truncated).is_err());
    }

    #[test]
    fn election_history_is_bounded_and_resets_keep_it() {
        let cell = |id: &str| NsCell { cell: id.into(), execution_count: 1, replica: 1, node_id: 1, recent: vec![] };
        let (m1, gone) = NsCell::next(None, 2, cell("a"));
        assert!(m1.recent.is_empty() && gone.is_empty());
        let (m2, _) = NsCell::next(Some(&m1), 2, cell("b"));
        let (m3, gone) = NsCell::next(Some(&m2), 2, cell("c"));
        assert_eq!((m3.recent.clone(), gone), (vec!["a".to_owned(), "b".to_owned()], vec![]));
        let (m4, gone) = NsCell::next(Some(&m3), 2, cell("d"));
        assert_eq!((m4.recent.clone(), gone), (vec!["b".to_owned(), "c".to_owned()], vec!["a".to_owned()]));
        let (reset, gone) = NsCell::next(Some(&m4), usize::MAX, cell("restart-x"));
        assert_eq!((reset.recent.len(), gone.len()), (3, 0));
        let (after, _) = NsCell::next(Some(&reset), 2, cell("e"));
        assert_eq!(after.recent, vec!["c".to_owned(), "d".to_owned()], "a reset marker is no cell");
    }

    #[test]
    fn manifest_names_and_files_are_checked() {
        assert!(check_file("3.pkl").is_ok());
        for bad in ["../x", "/etc/passwd", "a/b", "", "."] {
            assert!(check_file(bad).is_err(), "{bad:?} accepted");
        }
        assert!(check_name("x").is_ok());
        assert!(check_name("a/b").is_err());
        assert!(check_name("").is_err());
    }
}
