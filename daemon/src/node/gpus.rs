//! Starts this host's GPU side: leasing, the activity observer and the device guard, over
//! the inventory taken at start.

use std::sync::Arc;

use anyhow::Context;

use super::device_guard::start_device_guard;
use super::leasing::start_leasing;
use super::observer::start_observer;
use crate::config::Config;
use crate::gpu;
use crate::kernel::device_cgroup::DeviceCgroups;
use crate::kernel::shim_env::ShimEnvironment;
use crate::lease::LeaseServer;

/// The GPU side of a node. Without GPUs, only the (empty) inventory.
pub(super) struct Gpus {
    /// The GPUs found at start.
    pub(super) inventory: gpu::Inventory,
    /// The lease server and the kernels' shim environment, when there are GPUs.
    pub(super) leasing: Option<(Arc<LeaseServer>, ShimEnvironment)>,
    /// The GPU activity observer, when there are GPUs.
    pub(super) observer: Option<Arc<nbos_ebpf::Observer>>,
    /// The GPU device guard, when `gpu.device_guard = "ebpf"` and there are GPUs.
    pub(super) device_cgroups: Option<Arc<DeviceCgroups>>,
}

/// Starts leasing, then the observer, then the device guard, registering their metrics.
pub(super) fn start_gpus(
    config: &Config,
    inventory: gpu::Inventory,
    registry: &mut prometheus_client::registry::Registry,
) -> anyhow::Result<Gpus> {
    if inventory.gpus.iter().any(|g| g.simulated) {
        // Loudly, at every start: a test double must never pass for a GPU host.
        tracing::warn!(
            gpus = inventory.gpus.len(),
            "gpu.driver = \"fake\": these GPUs are SIMULATED by the fake-cuda test double \
             (notebookosd-fake-gpu); no cell runs on a GPU"
        );
    }
    let leasing = if inventory.gpus.is_empty() {
        None
    } else {
        Some(start_leasing(config, &inventory, registry).context("starting GPU leasing")?)
    };
    let observer = start_observer(config, leasing.as_ref(), registry)?;
    let device_cgroups = start_device_guard(config, &inventory, leasing.as_ref(), registry)?;
    Ok(Gpus { inventory, leasing, observer, device_cgroups })
}
