//! What other threads read of a group without going through the engine loop: its applied
//! state machine. Stale reads are served from here, so they never queue behind a log fsync or
//! a busy iteration; the loop takes the write lock only to apply an entry or a snapshot.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::request::{Query, ReadOutput};
use crate::error::{Error, Result};
use crate::state_machine::KvState;

/// A group's state machine and the log index it reflects.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    pub sm: KvState,
    pub index: u64,
}

impl Applied {
    /// Answers `query` from this state.
    pub(crate) fn serve(&self, query: &Query, stale: bool) -> ReadOutput {
        let kvs = match query {
            Query::Get { key } => self.sm.get(key).into_iter().collect(),
            Query::Range { prefix, limit } => self.sm.range(prefix, *limit),
        };
        ReadOutput { kvs, applied_index: self.index, stale }
    }
}

/// One group's applied state, shared by the engine (writer) and readers.
#[derive(Debug, Clone, Default)]
pub(crate) struct SharedApplied(Arc<RwLock<Applied>>);

impl SharedApplied {
    pub(crate) fn new(sm: KvState, index: u64) -> Self {
        Self(Arc::new(RwLock::new(Applied { sm, index })))
    }

    // A panic while applying already stops the engine (fail-stop); a poisoned lock holds the
    // state as far as it was applied, which is what a stale read may see anyway.
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Applied> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, Applied> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Every group's applied state on this node, by group id.
#[derive(Debug, Clone, Default)]
pub(crate) struct Views(Arc<RwLock<HashMap<u64, SharedApplied>>>);

impl Views {
    pub(crate) fn insert(&self, group: u64, view: SharedApplied) {
        self.0.write().unwrap_or_else(PoisonError::into_inner).insert(group, view);
    }

    pub(crate) fn remove(&self, group: u64) {
        self.0.write().unwrap_or_else(PoisonError::into_inner).remove(&group);
    }

    /// A stale read of `group` from this node's applied state.
    pub(crate) fn read(&self, group: u64, query: &Query) -> Result<ReadOutput> {
        let view = self.0.read().unwrap_or_else(PoisonError::into_inner).get(&group).cloned();
        let view = view.ok_or(Error::GroupNotFound(group))?;
        let out = view.read().serve(query, true);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_machine::Command;

    #[test]
    fn readers_see_what_the_writer_applied_and_unknown_groups_are_named() {
        let views = Views::default();
        let view = SharedApplied::new(KvState::default(), 0);
        views.insert(7, view.clone());
        let get = Query::Get { key: b"k".to_vec() };
        assert!(views.read(7, &get).expect("read").kvs.is_empty());
        {
            let mut w = view.write();
            let mut events = Vec::new();
            w.sm.apply(1, Command::Put { key: b"k".to_vec(), value: b"v".to_vec(), lease: None }, &mut events);
            w.index = 1;
        }
        let out = views.read(7, &get).expect("read");
        assert_eq!((out.kvs[0].value.as_slice(), out.applied_index, out.stale), (&b"v"[..], 1, true));
        views.remove(7);
        assert!(matches!(views.read(7, &get), Err(Error::GroupNotFound(7))));
    }
}
