//! The NotebookOS CUDA driver shim: a shared object with the soname `libcuda.so.1`
//! that a kernel process loads instead of the NVIDIA driver (the daemon puts it first
//! on `LD_LIBRARY_PATH` and in `LD_PRELOAD`). It loads the real driver by full path
//! ([`driver`]) and exports every driver entry point of CUDA 12.x and 13.x:
//!
//! - generated pass-throughs (`build.rs` from `driver-api.list`) that hold the lease
//!   gate ([`gate`]) around the real call and map `CUdevice` ordinals between the
//!   process's virtual device set and the leased physical GPUs ([`lease_view`]);
//! - hand-written hooks ([`hooks`]) for init, device enumeration, context creation,
//!   and `cuGetProcAddress`/`_v2` ([`proc_address`]); and for device memory
//!   ([`memory_hooks`]): allocations held to the host's limit ([`memory_limit`]).
//!
//! Counted calls (launches, copies, memsets, synchronisations) also bump this process's
//! counters file for the observer ([`counters`]).
//!
//! The lease itself comes from the host over the lease protocol ([`client`]). With no
//! `NBOS_LEASE_SOCKET` in the environment the shim is a transparent pass-through.

pub mod abi;
pub mod client;
pub mod counters;
pub mod driver;
pub mod gate;
pub mod hooks;
mod host_driver;
pub mod host_pid;
pub mod lease_view;
pub mod memory_hooks;
pub mod memory_limit;
pub mod proc_address;

/// The generated pass-throughs and symbol tables.
#[expect(clippy::missing_safety_doc, reason = "the CUDA driver API contract applies to every export")]
pub mod generated {
    include!(concat!(env!("OUT_DIR"), "/driver_api.rs"));
}
