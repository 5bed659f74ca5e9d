//! GPU control on the host: inventory, and (with the cuda-shim work) eviction and
//! restore of a process's GPU memory.

pub mod inventory;

pub use inventory::{GpuInfo, Inventory};
