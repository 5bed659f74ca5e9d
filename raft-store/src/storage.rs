//! The durable part of one group: its raft log, hard state and last snapshot, kept in raft-engine.
//!
//! Each group uses two raft-engine regions: `2·g` holds the log entries and `2·g+1` the small
//! records (hard state, snapshot). Two regions let a snapshot install wipe the log (`Clean`)
//! without touching the records. Writes go into a [`LogBatch`] owned by the driving loop, which
//! writes all groups' changes with one fsync per iteration; this type only tracks what the batch
//! will make true so that raft can read its own writes.

use std::collections::VecDeque;
use std::sync::Arc;

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, StorageError};
use raft_engine::{Command, LogBatch, MessageExt};

use crate::error::{Error, Result};

/// The raft-engine instance shared by all groups of a process.
pub(crate) type LogEngine = raft_engine::Engine;

const KEY_HARD_STATE: &[u8] = b"hs";
const KEY_SNAPSHOT: &[u8] = b"snap";
/// Index and term of the founding snapshot of a bootstrapped group.
pub(crate) const BOOTSTRAP_INDEX: u64 = 5;
/// Entries kept in memory at the tail of each log: raft reads recent terms and entries often.
const CACHE_ENTRIES: usize = 256;

/// Tells raft-engine how to index raft entries.
#[derive(Clone)]
pub(crate) struct EntryExt;

impl MessageExt for EntryExt {
    type Entry = Entry;

    fn index(e: &Entry) -> u64 {
        e.index
    }
}

pub(crate) fn log_region(group: u64) -> u64 {
    group.wrapping_mul(2)
}

pub(crate) fn meta_region(group: u64) -> u64 {
    group.wrapping_mul(2).wrapping_add(1)
}

/// Group ids that have a durable snapshot record (i.e. exist) in the engine.
pub(crate) fn stored_groups(engine: &LogEngine) -> Vec<u64> {
    let mut groups: Vec<u64> = engine
        .raft_groups()
        .into_iter()
        .filter(|r| r % 2 == 1)
        .map(|r| r / 2)
        .filter(|g| engine.get(meta_region(*g), KEY_SNAPSHOT).is_some())
        .collect();
    groups.sort_unstable();
    groups
}

/// raft's view of one group's durable state.
pub(crate) struct GroupStorage {
    engine: Arc<LogEngine>,
    group: u64,
    hard_state: HardState,
    /// Metadata of the latest snapshot: the log is truncated at `snap_meta.index`.
    snap_meta: SnapshotMetadata,
    last_index: u64,
    /// The tail of the log, contiguous, ending at `last_index` when non-empty.
    cache: VecDeque<Entry>,
}

fn storage_err(e: impl std::error::Error + Send + Sync + 'static) -> raft::Error {
    raft::Error::Store(StorageError::Other(Box::new(e)))
}

impl GroupStorage {
    /// Loads a group that exists in the engine.
    pub(crate) fn load(engine: Arc<LogEngine>, group: u64) -> Result<Self> {
        let corrupt = |e: raft_engine::Error| Error::Corrupt(format!("group {group}: {e}"));
        let snap: Snapshot = engine
            .get_message(meta_region(group), KEY_SNAPSHOT)
            .map_err(corrupt)?
            .ok_or(Error::GroupNotFound(group))?;
        let hard_state: HardState =
            engine.get_message(meta_region(group), KEY_HARD_STATE).map_err(corrupt)?.unwrap_or_default();
        let snap_meta = snap.get_metadata().clone();
        let last_index = engine.last_index(log_region(group)).unwrap_or(0).max(snap_meta.index);
        Ok(GroupStorage { engine, group, hard_state, snap_meta, last_index, cache: VecDeque::new() })
    }

    /// Creates a new group in `batch`. With `Some(conf_state)` the group is bootstrapped with that
    /// membership at index [`BOOTSTRAP_INDEX`] (every founding member writes the same record); with
    /// `None` it is an empty replica that waits for a snapshot from the leader. Starting the log
    /// above zero (as TiKV does) means a replica added later can never be fed the log from its
    /// beginning without the founding membership: it always receives a snapshot first.
    pub(crate) fn create(
        engine: Arc<LogEngine>,
        group: u64,
        conf_state: Option<ConfState>,
        batch: &mut LogBatch,
    ) -> Result<Self> {
        let mut snap = Snapshot::default();
        let mut hard_state = HardState::default();
        if let Some(cs) = conf_state {
            let meta = snap.mut_metadata();
            meta.set_conf_state(cs);
            meta.index = BOOTSTRAP_INDEX;
            meta.term = BOOTSTRAP_INDEX;
            hard_state.term = BOOTSTRAP_INDEX;
            hard_state.commit = BOOTSTRAP_INDEX;
        }
        batch.add_command(log_region(group), Command::Clean);
        put(batch, meta_region(group), KEY_SNAPSHOT, &snap)?;
        put(batch, meta_region(group), KEY_HARD_STATE, &hard_state)?;
        let snap_meta = snap.take_metadata();
        Ok(GroupStorage { engine, group, hard_state, last_index: snap_meta.index, snap_meta, cache: VecDeque::new() })
    }

    /// Removes every record of the group.
    pub(crate) fn destroy(group: u64, batch: &mut LogBatch) {
        batch.add_command(log_region(group), Command::Clean);
        batch.add_command(meta_region(group), Command::Clean);
    }

    pub(crate) fn snapshot_metadata(&self) -> &SnapshotMetadata {
        &self.snap_meta
    }

    /// Appends entries (truncating any conflicting tail) to the batch.
    pub(crate) fn append(&mut self, entries: &[Entry], batch: &mut LogBatch) -> Result<()> {
        let Some(first) = entries.first() else { return Ok(()) };
        batch
            .add_entries::<EntryExt>(log_region(self.group), entries)
            .map_err(|e| Error::Corrupt(format!("encode entries of group {}: {e}", self.group)))?;
        // Drop the cached tail that these entries replace.
        while self.cache.back().is_some_and(|e| e.index >= first.index) {
            self.cache.pop_back();
        }
        if self.cache.back().is_some_and(|e| e.index + 1 != first.index) {
            self.cache.clear();
        }
        self.cache.extend(entries.iter().cloned());
        while self.cache.len() > CACHE_ENTRIES {
            self.cache.pop_front();
        }
        self.last_index = entries.last().map_or(self.last_index, |e| e.index);
        Ok(())
    }

    /// Records a new hard state. Returns whether it must be fsynced before messages that
    /// depend on it go out: a new term or vote must (raft's safety rests on them surviving a
    /// crash); a commit index alone need not, since losing it only makes the group learn it
    /// again from the leader (the entries it covers are already durable).
    pub(crate) fn set_hard_state(&mut self, hs: HardState, batch: &mut LogBatch) -> Result<bool> {
        let durable = hs.term != self.hard_state.term || hs.vote != self.hard_state.vote;
        put(batch, meta_region(self.group), KEY_HARD_STATE, &hs)?;
        self.hard_state = hs;
        Ok(durable)
    }

    pub(crate) fn set_commit(&mut self, commit: u64, batch: &mut LogBatch) -> Result<()> {
        let mut hs = self.hard_state.clone();
        hs.commit = hs.commit.max(commit);
        self.set_hard_state(hs, batch).map(|_| ())
    }

    /// Installs a snapshot received from the leader: the whole log is replaced.
    pub(crate) fn install_snapshot(&mut self, snap: &Snapshot, batch: &mut LogBatch) -> Result<()> {
        let meta = snap.get_metadata();
        batch.add_command(log_region(self.group), Command::Clean);
        put(batch, meta_region(self.group), KEY_SNAPSHOT, snap)?;
        let mut hs = self.hard_state.clone();
        hs.commit = hs.commit.max(meta.index);
        hs.term = hs.term.max(meta.term);
        self.set_hard_state(hs, batch)?;
        self.snap_meta = meta.clone();
        self.last_index = meta.index;
        self.cache.clear();
        Ok(())
    }

    /// Records a snapshot of our own state machine and drops the log up to it.
    pub(crate) fn compact_to_snapshot(&mut self, snap: &Snapshot, batch: &mut LogBatch) -> Result<()> {
        let meta = snap.get_metadata();
        put(batch, meta_region(self.group), KEY_SNAPSHOT, snap)?;
        batch.add_command(log_region(self.group), Command::Compact { index: meta.index + 1 });
        self.snap_meta = meta.clone();
        while self.cache.front().is_some_and(|e| e.index <= meta.index) {
            self.cache.pop_front();
        }
        Ok(())
    }

    fn cached(&self, idx: u64) -> Option<&Entry> {
        let front = self.cache.front()?.index;
        if idx < front {
            return None;
        }
        self.cache.get(usize::try_from(idx - front).ok()?)
    }
}

fn put<M: protobuf::Message>(batch: &mut LogBatch, region: u64, key: &[u8], msg: &M) -> Result<()> {
    batch.put_message(region, key.to_vec(), msg).map_err(|e| Error::Corrupt(format!("encode record: {e}")))
}

impl raft::Storage for GroupStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(self.hard_state.clone(), self.snap_meta.get_conf_state().clone()))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let max_size = max_size.into();
        if low <= self.snap_meta.index {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last_index + 1 {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        if low >= high {
            return Ok(Vec::new());
        }
        if self.cached(low).is_some() {
            let mut out: Vec<Entry> = (low..high).filter_map(|i| self.cached(i).cloned()).collect();
            raft::util::limit_size(&mut out, max_size);
            return Ok(out);
        }
        let mut out = Vec::with_capacity(usize::try_from(high - low).unwrap_or(0).min(1024));
        self.engine
            .fetch_entries_to::<EntryExt>(log_region(self.group), low, high, max_size.map(|m| m as usize), &mut out)
            .map_err(storage_err)?;
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx == self.snap_meta.index {
            return Ok(self.snap_meta.term);
        }
        if idx < self.snap_meta.index {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if idx > self.last_index {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        if let Some(e) = self.cached(idx) {
            return Ok(e.term);
        }
        match self.engine.get_entry::<EntryExt>(log_region(self.group), idx).map_err(storage_err)? {
            Some(e) => Ok(e.term),
            None => Err(raft::Error::Store(StorageError::Unavailable)),
        }
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.snap_meta.index + 1)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last_index)
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        let snap: Snapshot = self
            .engine
            .get_message(meta_region(self.group), KEY_SNAPSHOT)
            .map_err(storage_err)?
            .ok_or(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable))?;
        if snap.get_metadata().index < request_index {
            return Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable));
        }
        Ok(snap)
    }
}
