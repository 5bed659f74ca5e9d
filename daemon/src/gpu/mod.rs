//! GPU control on the host: inventory ([`inventory`]: NVML or the fake-cuda TEST
//! DOUBLE), and eviction/restore of a process's GPU memory through the driver's
//! checkpoint API ([`checkpoint`], [`control`]), and its counters ([`metrics`]).

pub mod checkpoint;
pub mod control;
pub mod inventory;
pub mod metrics;
pub mod process_memory;

pub use inventory::{GpuInfo, Inventory};
