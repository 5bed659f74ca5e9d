//! The lease gate: every gated call holds [`GATE`] shared for its whole duration;
//! revocation takes it exclusively, so a revoke never races a submission.
//!
//! Hot path (lease held): one uncontended shared-lock acquire/release, one flag test,
//! one table load. No allocation, no environment read, no syscall. The state behind the
//! lock is [`crate::lease_view`]; without a lease a call asks [`crate::client`] for one.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;

use parking_lot::RwLock;

use crate::abi::{self, CUresult};
use crate::client;
use crate::lease_view::{LeaseView, CALLS, GATE};

thread_local! {
    /// Depth of gated calls on this thread: a re-entrant call (the real driver calling
    /// back into an export) must not take the shared lock again behind a waiting writer.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

struct DepthGuard;

impl DepthGuard {
    #[inline]
    fn enter() -> Self {
        DEPTH.with(|d| d.set(1));
        Self
    }
}

impl Drop for DepthGuard {
    #[inline]
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(0));
    }
}

/// Runs `f` with a lease held, first waiting for one if needed. Panics become
/// `CUDA_ERROR_UNKNOWN`.
#[inline]
pub fn gated(f: impl FnOnce(&LeaseView) -> CUresult) -> CUresult {
    catch_unwind(AssertUnwindSafe(|| {
        if DEPTH.with(Cell::get) > 0 {
            // Already inside a gated call on this thread, so the lease is held.
            let view = *GATE.data_ptr_snapshot();
            return f(&view);
        }
        loop {
            let g = GATE.read();
            if g.bound {
                CALLS.store(CALLS.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
                let _depth = DepthGuard::enter();
                return f(&g);
            }
            drop(g);
            if let Err(code) = client::acquire() {
                return code;
            }
        }
    }))
    .unwrap_or(abi::UNKNOWN)
}

/// Runs `f` without requiring a lease (device queries, error strings, version).
#[inline]
pub fn ungated(f: impl FnOnce(&LeaseView) -> CUresult) -> CUresult {
    catch_unwind(AssertUnwindSafe(|| {
        client::ensure_started();
        let view = if DEPTH.with(Cell::get) > 0 { *GATE.data_ptr_snapshot() } else { *GATE.read() };
        f(&view)
    }))
    .unwrap_or(abi::UNKNOWN)
}

/// A copy of the view without locking, for re-entrant calls on a thread that already
/// holds the gate shared (so no writer can be changing it).
trait Snapshot {
    fn data_ptr_snapshot(&self) -> &LeaseView;
}

impl Snapshot for RwLock<LeaseView> {
    fn data_ptr_snapshot(&self) -> &LeaseView {
        // SAFETY: only called when this thread holds the lock shared (DEPTH > 0), so no
        // writer exists and the data is not mutated while the reference lives.
        unsafe { &*self.data_ptr() }
    }
}
