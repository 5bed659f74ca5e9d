//! Per-process GPU activity observer.
//!
//! In eBPF mode, C BPF programs (`bpf/observer.bpf.c`, built by `build.rs`, loaded with aya)
//! count calls to the CUDA driver's work-submitting entry points with uprobes, per thread
//! group, and report process exits from the `sched_process_exit` tracepoint on a ring buffer.
//! When BPF cannot be loaded, procfs mode polls `/proc` for CPU time, context switches and exits
//! and reads the shim's counters files ([`shim_counters`]). [`Observer`] hides which mode runs.
//!
//! [`DeviceGuard`] (`bpf/device_guard.bpf.c`, a cgroup device program) limits which GPU
//! device files the processes of a kernel's cgroup may open to the GPUs it holds a lease on.
//!
//! ```no_run
//! let observer = nbos_ebpf::Observer::start(nbos_ebpf::ObserverConfig::default())?;
//! let mut exits = observer.exit_events();
//! if let Some(a) = observer.snapshot(1234) {
//!     println!("{} launches, idle for {:?}", a.launches, observer.idle_for(1234));
//! }
//! # Ok::<(), nbos_ebpf::ObserverError>(())
//! ```
#![deny(missing_docs)]

mod activity;
pub mod bench;
mod bpf_abi;
pub mod clock;
mod config;
mod device_guard;
pub mod driver_library;
mod ebpf_backend;
pub mod entry_points;
mod error;
mod gpu_devices;
mod metrics;
mod observer;
mod pool_guard;
mod procfs_sampler;
pub mod shim_counters;

pub use activity::{ExitEvent, Mode, ProcessActivity, Sources};
pub use config::{ModeRequest, ObserverConfig, DEFAULT_COUNTERS_DIR};
pub use device_guard::{cgroup_id, CgroupId, DeviceGuard, DeviceGuardError, MAX_MINORS, NVIDIACTL_MINOR, NVIDIA_MAJOR};
pub use error::ObserverError;
pub use metrics::{KernelLabels, ModeLabels, ObserverMetrics};
pub use observer::Observer;
pub use pool_guard::{PoolGuard, PoolGuardError};
