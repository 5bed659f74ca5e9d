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

/// What of `env` a client may set ([`crate::kernel::client_env`]); what it may
/// not is left out (as Kernel Gateway does) and counted.
pub(crate) fn settable_env<I: IntoIterator<Item = (String, String)>>(env: I) -> Vec<(String, String)> {
    let (kept, dropped) = crate::kernel::client_env::settable(env);
    for _ in 0..dropped {
        crate::metrics::count_refusal(KERNEL_ENV_NOT_ALLOWED);
    }
    if dropped > 0 {
        tracing::info!(dropped, "kernel request: environment variables a client may not set were left out");
    }
    kept
}

/// `notebookos_refused_total` reason of an environment variable a client may not set.
pub(crate) const KERNEL_ENV_NOT_ALLOWED: &str = "kernel_env_not_allowed";
