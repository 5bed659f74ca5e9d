//! The host's device-memory limit for this process (`Registered::memory_limit_bytes`),
//! kept as a ledger of live allocations: every allocation entry point reserves its bytes
//! before calling the driver and refuses with `CUDA_ERROR_OUT_OF_MEMORY` what would
//! exceed the limit; the matching free gives them back. With no limit (0) nothing is
//! counted at all.
//!
//! The limit is the smaller of the host's (`Registered`) and the kernel's own
//! (`NBOS_GPU_MEMORY_LIMIT_BYTES`, set by the daemon from the kernel request), stored by
//! the lease client at start ([`set_limit`]).
//!
//! Only touched inside gated calls, so a fork (whose `prepare` handler takes the gate
//! exclusively) never finds the ledger locked.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// What names a live allocation: a device pointer (`cuMemAlloc*`, freed by `cuMemFree*`)
/// or a physical allocation handle (`cuMemCreate`, freed by `cuMemRelease`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Key {
    /// A `CUdeviceptr`.
    Pointer(u64),
    /// A `CUmemGenericAllocationHandle`.
    Handle(u64),
}

struct Ledger {
    /// Bytes of live allocations plus reservations of calls in flight.
    used: usize,
    live: Option<HashMap<Key, usize>>,
}

static LEDGER: Mutex<Ledger> = Mutex::new(Ledger { used: 0, live: None });

/// The limit, bytes (0: none); an atomic so hooks under the gate read it without a lock.
static LIMIT: AtomicU64 = AtomicU64::new(0);

/// Sets the limit, bytes (0: none). Called by the lease client when it starts.
pub fn set_limit(bytes: u64) {
    LIMIT.store(bytes, Ordering::Relaxed);
}

/// The limit in bytes, `None` when none is set.
#[inline]
pub fn limit() -> Option<usize> {
    match LIMIT.load(Ordering::Relaxed) {
        0 => None,
        l => Some(usize::try_from(l).unwrap_or(usize::MAX)),
    }
}

/// Bytes in use (live allocations and reservations).
pub fn used() -> usize {
    LEDGER.lock().used
}

/// Reserves `bytes` under `limit`; false (nothing reserved) when they do not fit.
pub fn reserve(limit: usize, bytes: usize) -> bool {
    let mut l = LEDGER.lock();
    match l.used.checked_add(bytes) {
        Some(total) if total <= limit => {
            l.used = total;
            true
        }
        _ => false,
    }
}

/// Gives back a reservation whose allocation failed.
pub fn unreserve(bytes: usize) {
    let mut l = LEDGER.lock();
    l.used = l.used.saturating_sub(bytes);
}

/// Records the allocation `key` of `bytes` made under a reservation of as many bytes.
pub fn commit(key: Key, bytes: usize) {
    let mut l = LEDGER.lock();
    // A key still live means the driver reused an address we missed the free of:
    // the old entry's bytes are gone with it.
    if let Some(old) = l.live.get_or_insert_with(HashMap::new).insert(key, bytes) {
        l.used = l.used.saturating_sub(old);
    }
}

/// Forgets the allocation `key` (freed).
pub fn release(key: Key) {
    let mut l = LEDGER.lock();
    if let Some(bytes) = l.live.as_mut().and_then(|m| m.remove(&key)) {
        l.used = l.used.saturating_sub(bytes);
    }
}

/// A forked child starts with no device memory of its own.
pub fn forget_after_fork() {
    let mut l = LEDGER.lock();
    l.used = 0;
    l.live = None;
}
