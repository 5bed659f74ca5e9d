//! `[gpu]`: GPUs, the driver, per-cell binding and the device guard.

use std::path::PathBuf;
use std::time::Duration;

use nbos_sched::policy::PolicyConfig;
use serde::{Deserialize, Serialize};

/// How the daemon reaches GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuDriver {
    /// Use the NVIDIA driver when it is present, else run with no GPUs.
    Auto,
    /// Require the NVIDIA driver; refuse to start without it.
    Nvidia,
    /// TEST DOUBLE: simulated GPUs from `tests/fake-cuda` (demos and tests).
    Fake,
    /// No GPUs (CPU-only host, e.g. a gateway-only node).
    None,
}

/// `[gpu]`: GPUs, the driver and per-cell binding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuConfig {
    /// Which driver to use.
    pub driver: GpuDriver,
    /// Full path of the real `libcuda.so.1`; empty means discover it. With
    /// `driver = "fake"`: the fake-cuda TEST DOUBLE library (`libfake_cuda.so`); empty
    /// means next to the daemon binary.
    pub cuda_driver_path: Option<PathBuf>,
    /// The built CUDA shim (`libnbos_cuda_shim.so`) that kernel processes load as
    /// `libcuda.so.1`; empty means next to the daemon binary, else
    /// `/usr/lib/notebookos/libnbos_cuda_shim.so`.
    pub shim_library: Option<PathBuf>,
    /// With `driver = "fake"`: how many simulated GPUs.
    pub fake_gpus: u32,
    /// With `driver = "fake"`: memory of each simulated GPU, MiB.
    pub fake_gpu_memory_mib: u64,
    /// How long a lease stays idle-held after a cell before the GPU is revoked.
    #[serde(with = "humantime_serde")]
    pub idle_release: Duration,
    /// Upper bound on (GPUs requested by kernels hosted here) / (GPUs on the host).
    pub subscription_ratio: f64,
    /// Cells waiting for GPUs go in fair-share order: the users furthest below their share
    /// of recent GPU time first (`nbos_sched::fairshare`). Off: first come first served.
    /// With one user (no `[auth]` users) the two are the same.
    pub fair_share: bool,
    /// Users' recent GPU time halves every this long (the memory of the fair share).
    #[serde(with = "humantime_serde")]
    pub fair_share_half_life: Duration,
    /// With `fair_share`: a user over their share of recent GPU time (above the mean of the
    /// users with kernels on the host) may not take the GPUs that would leave fewer free than
    /// an idle kernel of a user within their share asks (`nbos_sched::fairshare::headroom`),
    /// so a light user's cell starts at once under a flood. Off by default: it holds GPUs
    /// idle, and without a flood light users wait longer (docs/simulator.md).
    pub fair_share_headroom: bool,
    /// Whether kernel processes may open only the GPU device files of GPUs they hold a lease
    /// on, enforced in the kernel by eBPF (`kernel::device_cgroup`). Unset: `off` (see
    /// docs/configuration.md for why it is not yet the default on NVIDIA hosts).
    pub device_guard: Option<DeviceGuardMode>,
}

/// `gpu.device_guard`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceGuardMode {
    /// A BPF cgroup device program per kernel cgroup; the daemon refuses to start without it.
    Ebpf,
    /// No enforcement below the CUDA shim.
    Off,
}

impl Default for GpuConfig {
    fn default() -> Self {
        Self {
            driver: GpuDriver::Auto,
            cuda_driver_path: None,
            shim_library: None,
            fake_gpus: 0,
            fake_gpu_memory_mib: 81_920,
            idle_release: Duration::from_millis(PolicyConfig::default().idle_release_ms),
            subscription_ratio: PolicyConfig::default().subscription_ratio,
            fair_share: PolicyConfig::default().fair_share,
            fair_share_half_life: Duration::from_millis(PolicyConfig::default().fair_share_half_life_ms),
            fair_share_headroom: PolicyConfig::default().fair_share_headroom,
            device_guard: None,
        }
    }
}
