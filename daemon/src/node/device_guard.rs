//! Starts the GPU device guard (`gpu.device_guard`).

use std::sync::Arc;

use anyhow::Context;

use crate::config::Config;
use crate::gpu;
use crate::kernel::shim_env::ShimEnvironment;
use crate::lease::LeaseServer;

/// Loads the GPU device guard when `gpu.device_guard = "ebpf"` and tells it every change of
/// the GPUs a kernel holds; refuses to start when it is asked for and cannot load. Without
/// GPUs (no lease server) there is nothing to guard.
pub(super) fn start_device_guard(
    config: &Config,
    inventory: &gpu::Inventory,
    leasing: Option<&(Arc<LeaseServer>, ShimEnvironment)>,
    registry: &mut prometheus_client::registry::Registry,
) -> anyhow::Result<Option<Arc<crate::kernel::device_cgroup::DeviceCgroups>>> {
    use crate::config::DeviceGuardMode;
    use crate::kernel::device_cgroup::{self, DeviceCgroups, DeviceGuardMetrics};
    if config.gpu.device_guard.unwrap_or(DeviceGuardMode::Off) == DeviceGuardMode::Off {
        return Ok(None);
    }
    let Some((server, _)) = leasing else {
        tracing::info!("gpu.device_guard = \"ebpf\" but this host has no GPUs: nothing to guard");
        return Ok(None);
    };
    let mount = device_cgroup::cgroup2_mount(std::path::Path::new("/sys/fs/cgroup")).context(
        "gpu.device_guard = \"ebpf\" needs a cgroup v2 mount (/sys/fs/cgroup or /sys/fs/cgroup/unified); none found",
    )?;
    let minors = device_cgroup::gpu_minors(&inventory.gpus, std::path::Path::new("/proc/driver/nvidia/gpus"));
    let metrics = DeviceGuardMetrics::default();
    metrics.register(registry);
    let dc = DeviceCgroups::load(&mount, minors.clone(), metrics).map_err(|e| {
        anyhow::anyhow!(
            "gpu.device_guard = \"ebpf\" but the GPU device guard cannot load: {e} (it needs root, or CAP_BPF and \
             CAP_SYS_ADMIN, and a kernel with BPF cgroup device programs; gpu.device_guard = \"off\" runs without it)"
        )
    })?;
    let dc = Arc::new(dc);
    let weak = Arc::downgrade(&dc);
    server.set_device_hook(Arc::new(move |kernel, gpus| {
        if let Some(dc) = weak.upgrade() {
            dc.set_gpus(kernel, gpus);
        }
    }));
    tracing::info!(cgroups = %mount.join("notebookos").display(), gpu_minors = ?minors, "GPU device guard loaded");
    Ok(Some(dc))
}
