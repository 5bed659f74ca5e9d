//! What the lease gate protects ([`GATE`]): whether a lease is held and how the
//! process's virtual device ordinals map to the leased physical GPUs, plus the call
//! counters the activity reports carry. A leaf module: the gate ([`crate::gate`]) reads
//! it on every gated call, the lease client ([`crate::client`]) writes it on grant and
//! revoke, and neither needs the other for that.

use std::sync::atomic::AtomicU64;

use parking_lot::RwLock;

use crate::abi::{self, CUresult};

/// Most virtual devices a process can see.
pub const MAX_DEVICES: usize = 64;

/// `physical[v]` before the first grant: device queries (ungated, read-only) may run
/// before any lease and then name the driver's ordinal `v`.
pub const NOT_GRANTED: i32 = -1;
/// `physical[v]` when the current grant's GPU at `v` is not visible to this process's
/// driver (or the grant named fewer GPUs than the process sees). Calls naming `v` fail
/// rather than run on whatever GPU the driver numbers `v`: that may be another kernel's.
pub const NOT_VISIBLE: i32 = -2;

/// What the gate protects: whether a lease is held and how virtual ordinals map.
#[derive(Debug, Clone, Copy)]
pub struct LeaseView {
    /// A lease is held (always true when the shim runs unmanaged).
    pub bound: bool,
    /// The current lease number (0: none yet).
    pub lease: u64,
    /// Virtual device count.
    pub devices: usize,
    /// Physical ordinal of each virtual ordinal ([`NOT_GRANTED`], [`NOT_VISIBLE`]).
    pub physical: [i32; MAX_DEVICES],
    /// Unmanaged: no host, ordinals are physical.
    pub unmanaged: bool,
}

impl LeaseView {
    /// No lease, no devices (a fresh process or a forked child).
    pub const INITIAL: Self =
        Self { bound: false, lease: 0, devices: 0, physical: [NOT_GRANTED; MAX_DEVICES], unmanaged: false };

    /// Physical ordinal for virtual `v`. A GPU of the lease that the driver does not list
    /// is `CUDA_ERROR_INVALID_DEVICE`, the driver's own answer for an ordinal it has no
    /// device for (`CUDA_ERROR_NO_DEVICE` means it found no GPU at all, which is not the
    /// case when it lists others). An out-of-range ordinal stays invalid for the driver
    /// to answer as it does.
    #[inline]
    pub fn physical(&self, v: i32) -> Result<i32, CUresult> {
        if self.unmanaged {
            return Ok(v);
        }
        match usize::try_from(v) {
            Ok(i) if i < self.devices => match self.physical[i] {
                NOT_GRANTED => Ok(v),
                NOT_VISIBLE => Err(abi::INVALID_DEVICE),
                p => Ok(p),
            },
            _ => Ok(i32::MAX),
        }
    }

    /// Virtual ordinal for physical `p`.
    #[inline]
    pub fn virtual_of(&self, p: i32) -> i32 {
        if self.unmanaged {
            return p;
        }
        self.physical[..self.devices].iter().position(|&x| x == p).map_or(p, |v| v as i32)
    }
}

/// The gate.
pub static GATE: RwLock<LeaseView> = RwLock::new(LeaseView::INITIAL);

/// Gated calls made (approximate: a relaxed load + store, not a locked increment, to keep
/// the hot path free of atomic read-modify-writes; concurrent calls may lose counts).
pub static CALLS: AtomicU64 = AtomicU64::new(0);
/// Times a gated call had to wait for a lease.
pub static WAITS: AtomicU64 = AtomicU64::new(0);

#[cfg(test)]
mod tests {
    use super::*;

    fn view(physical: &[i32]) -> LeaseView {
        let mut v = LeaseView { devices: physical.len(), ..LeaseView::INITIAL };
        v.physical[..physical.len()].copy_from_slice(physical);
        v
    }

    #[test]
    fn an_invisible_gpu_is_an_invalid_device_never_another_ordinal() {
        let v = view(&[3, NOT_VISIBLE]);
        assert_eq!(v.physical(0), Ok(3));
        assert_eq!(v.physical(1), Err(abi::INVALID_DEVICE));
        assert_eq!(v.physical(2), Ok(i32::MAX), "out of range: the driver's own answer");
        assert_eq!(view(&[NOT_GRANTED]).physical(0), Ok(0), "before any grant: queries only");
        assert_eq!(v.virtual_of(3), 0);
    }
}
