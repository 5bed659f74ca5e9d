//! **TEST DOUBLE** of the NVIDIA CUDA driver (`libcuda.so.1`) and of NVML, for
//! machines without a GPU. Nothing here talks to hardware.
//!
//! What it simulates, so that tests of the shim, the lease server and GPU control
//! check real behaviour:
//! - `FAKE_CUDA_GPUS` GPUs (default 2) of `FAKE_CUDA_GPU_MEMORY_MIB` MiB each
//!   (default 1024), with the UUIDs `GPU-fa4e0000-0000-4000-8000-<index as 12 hex>`
//!   that the daemon's fake inventory also uses.
//! - Device memory is host memory (`mmap`); a device pointer is its address. The
//!   *capacity* of each GPU is shared between processes through a ledger file per
//!   GPU under `FAKE_CUDA_STATE_DIR` ([`ledger`]), so two processes oversubscribing a
//!   fake GPU get `CUDA_ERROR_OUT_OF_MEMORY` as on real hardware.
//! - Built-in kernels that really compute (`fill_f32`, `axpy_f32`, `sum_f32`), reached
//!   through `cuModuleLoadData` (any image) + `cuModuleGetFunction` + `cuLaunchKernel`.
//!   Work runs synchronously at submission; streams and events are real handles.
//! - The checkpoint API (`cuCheckpointProcess*`) with real semantics: lock blocks the
//!   target's CUDA calls, checkpoint moves its memory to host backup and frees the
//!   GPU's capacity, restore (optionally onto other GPUs) brings the contents back
//!   at the same device pointers. The target process serves these requests on an
//!   abstract Unix socket ([`checkpoint`]).
//! - Faults injected at runtime into lock, checkpoint and restore ([`faults`]).
//! - A small NVML subset ([`nvml`]) for the daemon's inventory.

pub mod alloc_variants;
pub mod api;
pub mod checkpoint;
pub mod config;
pub mod faults;
pub mod kernels;
pub mod ledger;
pub mod memory;
pub mod nvml;
pub mod proc_address;
pub mod result;
pub mod state;
