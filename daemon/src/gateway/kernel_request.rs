//! The body of `POST /api/kernels` and which environment a client may give a kernel:
//! shared by the single-host and the cluster-mode handlers.

use std::collections::HashMap;

use serde::Deserialize;

/// Body of `POST /api/kernels`.
#[derive(Debug, Default, Deserialize)]
pub struct CreateKernel {
    /// Kernelspec name; the default spec when absent.
    pub name: Option<String>,
    /// Environment for the kernel (Kernel Gateway passes `KERNEL_*` variables).
    #[serde(default)]
    pub env: HashMap<String, String>,
    /// NotebookOS extension: GPUs per cell, overriding the spec.
    pub gpus: Option<u32>,
    /// NotebookOS extension: device memory each kernel process may allocate, MiB (the
    /// same as `env.KERNEL_GPU_MEMORY_MIB`, which it overrides).
    pub gpu_memory_mib: Option<i64>,
}

/// Environment variables a client may set in a kernel (as Kernel Gateway allows
/// `KERNEL_*`); anything else, `LD_PRELOAD` for instance, is not the client's to set.
pub(crate) fn allowed_env(k: &str) -> bool {
    k.starts_with("KERNEL_") || k == "JPY_SESSION_NAME"
}
