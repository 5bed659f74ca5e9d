//! A [`Replica`]: this host's member of a kernel group, and the guard that counts what runs on it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use crate::cluster::cells::state_sync::Applier;

/// Cells remembered per replica to ignore a duplicated `lead` for a cell already run here.
const REMEMBERED_CELLS: usize = 1024;

/// This host's replica of a cluster kernel: its place in the kernel group, its namespace applier, what runs on it.
pub struct Replica {
    /// Kernel id.
    pub kernel_id: String,
    /// Replica number.
    pub replica: u32,
    /// The kernel's raft group.
    pub group: u64,
    /// Applies the group's namespace to the local kernel.
    pub applier: Applier,
    /// Cells this replica won (most recent last).
    pub(super) won: Mutex<VecDeque<String>>,
    /// Lead requests being decided and won cells running ([`Busy`] guards).
    pub(super) busy: AtomicU32,
    /// A move takes this replica away: it yields every cell from now on.
    pub(super) moving_out: AtomicBool,
}

/// Counts a lead request or won cell as running on its replica while alive. Taken before a
/// lead request reads [`Replica::moving_out`], so that a replica seen idle after its
/// move was flagged starts no cell (both sides use sequentially consistent atomics).
pub(super) struct Busy(Arc<Replica>);

impl Busy {
    pub(super) fn enter(local: &Arc<Replica>) -> Self {
        local.busy.fetch_add(1, Ordering::SeqCst);
        Busy(local.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica").field("kernel", &self.kernel_id).field("replica", &self.replica).finish()
    }
}

impl Replica {
    /// A replica record for the host's map.
    pub fn new(kernel_id: String, replica: u32, group: u64, applier: Applier) -> Self {
        Self {
            kernel_id,
            replica,
            group,
            applier,
            won: Mutex::new(VecDeque::new()),
            busy: AtomicU32::new(0),
            moving_out: AtomicBool::new(false),
        }
    }

    /// Remembers `cell` as won here; false when it already was (a duplicate request).
    pub(super) fn first_win(&self, cell: &str) -> bool {
        let mut won = self.won.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if won.iter().any(|c| c == cell) {
            return false;
        }
        if won.len() >= REMEMBERED_CELLS {
            won.pop_front();
        }
        won.push_back(cell.to_owned());
        true
    }
}
