//! The follower side's handle ([`Applier`], one per local replica): what its task has
//! applied, and the waits the replica host needs before a cell runs here.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use raft_store::{Kv, RaftStore};
use tokio::sync::watch;

use super::apply_task::{AppliedState, Run};
use super::config::SyncConfig;
use super::kernel_calls::call_sync;
use super::records::NsCell;
use crate::cluster::cells::election::Proposer;
use crate::cluster::cells::objects::Objects;
use crate::cluster::cells::sync_metrics::SyncMetrics;
use crate::cluster::control::records::keys;
use crate::kernel::LocalKernel;

/// The follower side of one local replica: applies committed cells to its kernel.
pub struct Applier {
    applied: watch::Receiver<u64>,
    shared: Arc<Mutex<AppliedState>>,
    kv: Kv,
    kernel: Arc<LocalKernel>,
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
        kernel: Arc<LocalKernel>,
        store: RaftStore,
        kv: Kv,
        objects: Objects,
        cfg: SyncConfig,
        me: Proposer,
        metrics: SyncMetrics,
    ) -> Self {
        let (tx, rx) = watch::channel(0u64);
        let shared = Arc::new(Mutex::new(AppliedState::default()));
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

    fn lock(&self) -> std::sync::MutexGuard<'_, AppliedState> {
        self.shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The last revision of the group this replica's namespace reflects.
    pub fn applied(&self) -> u64 {
        *self.applied.borrow()
    }

    /// Why the replica's namespace stopped following the group, if it did (for a while, or
    /// for good: [`Applier::diverged`]).
    pub fn broken(&self) -> Option<String> {
        let s = self.lock();
        s.diverged.clone().or_else(|| s.broken.clone())
    }

    /// Why the kernel's namespace is no longer the group's for good, if it is not.
    pub fn diverged(&self) -> Option<String> {
        self.lock().diverged.clone()
    }

    /// Marks the replica's namespace as no longer the group's (a cell ran here but its
    /// changes could not be committed): it yields every cell from now on, and the
    /// supervisor replaces its kernel process by a new one that gets the group's namespace.
    pub fn mark_diverged(&self, why: String) {
        let mut s = self.lock();
        if s.diverged.is_none() {
            tracing::warn!(group = self.kv.group(), kernel = %self.kernel.id, why, "this replica's kernel diverged from the group");
            s.diverged = Some(why);
        }
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

    /// The namespace's size as of [`Applier::applied`]: every name's payload bytes.
    pub fn namespace_bytes(&self) -> u64 {
        self.lock().sizes.values().sum()
    }

    /// Waits until the namespace reflects `revision`.
    pub async fn wait_applied(&self, revision: u64, timeout: Duration) -> anyhow::Result<()> {
        let mut rx = self.applied.clone();
        let wait = async {
            loop {
                // Nothing runs before the first catch-up: a new kernel must get every name first.
                if *rx.borrow_and_update() >= revision && self.lock().started {
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
