//! Starts GPU leasing: the lease server CUDA shims connect to, and the shim's environment.

use std::sync::Arc;

use anyhow::Context;

use crate::config::Config;
use crate::gpu;
use crate::kernel::shim_env::ShimEnvironment;
use crate::lease::LeaseServer;

/// Starts the lease server on `runtime_dir/lease.sock` with GPU control through
/// the driver's checkpoint API, and prepares the shim environment of kernels.
pub(super) fn start_leasing(
    config: &Config,
    inventory: &gpu::Inventory,
    registry: &mut prometheus_client::registry::Registry,
) -> anyhow::Result<(Arc<LeaseServer>, ShimEnvironment)> {
    use crate::gpu::checkpoint::{CheckpointApi, DriverCheckpoint};
    use crate::lease::metrics::LeaseMetrics;
    use crate::lease::table::Policy;
    use crate::lease::LeaseServerConfig;

    let socket = config.node.runtime_dir.join("lease.sock");
    let shim = ShimEnvironment::prepare(&config.gpu, &config.node.runtime_dir, &socket)?;
    let lease_metrics = LeaseMetrics::default();
    lease_metrics.register(registry);
    if config.gpu.driver == crate::config::GpuDriver::Fake {
        // The fake-cuda test double reads its settings from the environment once, when
        // this process first loads it (just below). The daemon's own driver and NVML calls
        // (checkpoint, per-process memory) must see the same simulated GPUs and capacity
        // ledgers as the kernels. Fake mode only; nothing else reads these variables.
        for (key, value) in shim.fake_env() {
            std::env::set_var(key, value);
        }
    }
    let api: Option<Box<dyn CheckpointApi>> = match DriverCheckpoint::load(&shim.driver) {
        Ok(api) => Some(Box::new(api)),
        Err(e) => {
            tracing::warn!(driver = %shim.driver.display(), error = %e, "no checkpoint API: revoked GPU memory stays resident");
            None
        }
    };
    let mut control = gpu::control::GpuControl::new(api, lease_metrics.clone());
    if config.gpu.driver == crate::config::GpuDriver::Fake {
        // The test double carries its own NVML (per-process memory from its ledgers).
        match gpu::process_memory::ProcessGpuMemory::open(Some(&shim.driver)) {
            Ok(memory) => control = control.with_process_memory(memory),
            Err(e) => tracing::debug!(error = %e, "no per-process GPU memory: evicted bytes are not counted"),
        }
    }
    let cfg = LeaseServerConfig {
        socket,
        // Idle detection follows the shim's activity reports; the scheduler core
        // decides release (its idle_release), the lease table only backs it up.
        policy: Policy { idle_grace: std::time::Duration::from_secs(1), idle_release: config.gpu.idle_release },
        activity_interval: crate::kernel::shim_env::ACTIVITY_INTERVAL,
        memory_limit_bytes: 0,
        driver_path: shim.driver.clone(),
    };
    let server =
        LeaseServer::start(cfg, inventory.gpus.clone(), control, lease_metrics).context("starting the lease server")?;
    tracing::info!(socket = %server.socket().display(), gpus = inventory.gpus.len(), "lease server listening");
    Ok((Arc::new(server), shim))
}
