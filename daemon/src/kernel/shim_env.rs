//! The environment that runs kernel processes under the CUDA shim.
//!
//! The shim (`cuda-shim/`, soname `libcuda.so.1`) is copied into a private
//! directory under `runtime_dir`; kernel processes get that directory first on
//! `LD_LIBRARY_PATH` and the file in `LD_PRELOAD`, so any CUDA user in the kernel
//! (ctypes, PyTorch, a subprocess) loads the shim instead of the driver. The shim
//! asks the host's lease server (`NBOS_LEASE_SOCKET`) for GPUs and forwards to the real
//! driver by the full path the server names when it accepts the process (not in the
//! environment: a kernel is not told where the driver is). With `gpu.driver = "fake"`
//! the driver is the fake-cuda TEST DOUBLE, and every kernel gets the same
//! `FAKE_CUDA_*` settings so they all share the same simulated GPUs.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::config::{GpuConfig, GpuDriver};
use crate::gpu::checkpoint;

/// File name of the built shim.
pub const SHIM_FILE: &str = "libnbos_cuda_shim.so";
/// File name of the fake-cuda TEST DOUBLE.
pub const FAKE_DRIVER_FILE: &str = "libfake_cuda.so";
/// Where packages install the shim.
pub const INSTALLED_SHIM: &str = "/usr/lib/notebookos/libnbos_cuda_shim.so";
/// Where the `notebookosd-fake-gpu` package installs the test double.
pub const INSTALLED_FAKE_DRIVER: &str = "/usr/lib/notebookos/libfake_cuda.so";
/// How often a shim holding a lease reports its activity to the lease server (the host
/// tells it in `Registered`): idle detection needs a few reports per `idle_grace` (1 s).
pub const ACTIVITY_INTERVAL: std::time::Duration = std::time::Duration::from_millis(500);

/// What kernel processes of this host run with.
#[derive(Debug, Clone)]
pub struct ShimEnvironment {
    /// The private directory holding `libcuda.so.1` (the shim).
    pub dir: PathBuf,
    /// The driver the shim forwards to (full path).
    pub driver: PathBuf,
    /// Where the shims write their per-process counters files (read by the observer).
    pub counters_dir: PathBuf,
    /// Environment for every kernel process.
    pub env: Vec<(String, String)>,
}

/// `name` next to the running executable (or in its `deps/` folder, as cargo lays
/// out cdylibs built for tests).
fn next_to_exe(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir.join(name), dir.join("deps").join(name), dir.parent()?.join(name)].into_iter().find(|p| p.is_file())
}

/// The shim library to use: configured, else next to the daemon, else installed.
pub fn find_shim(cfg: &GpuConfig) -> anyhow::Result<PathBuf> {
    if let Some(p) = &cfg.shim_library {
        anyhow::ensure!(p.is_file(), "gpu.shim_library = {}: no such file", p.display());
        return Ok(p.clone());
    }
    if let Some(p) = next_to_exe(SHIM_FILE) {
        return Ok(p);
    }
    let installed = PathBuf::from(INSTALLED_SHIM);
    anyhow::ensure!(
        installed.is_file(),
        "the CUDA shim {SHIM_FILE} is neither next to the daemon binary nor at {INSTALLED_SHIM}; \
         build it (cargo build -p nbos-cuda-shim) or set gpu.shim_library"
    );
    Ok(installed)
}

/// The driver the shim forwards to (and the daemon checkpoints through).
pub fn find_driver(cfg: &GpuConfig) -> anyhow::Result<PathBuf> {
    if cfg.driver == GpuDriver::Fake {
        if let Some(p) = &cfg.cuda_driver_path {
            anyhow::ensure!(p.is_file(), "gpu.cuda_driver_path = {}: no such file", p.display());
            return Ok(p.clone());
        }
        let installed = PathBuf::from(INSTALLED_FAKE_DRIVER);
        return next_to_exe(FAKE_DRIVER_FILE).or_else(|| installed.is_file().then_some(installed)).with_context(|| {
            format!(
                "gpu.driver = \"fake\" needs the fake-cuda test double: install the notebookosd-fake-gpu \
                 package ({INSTALLED_FAKE_DRIVER}), or build {FAKE_DRIVER_FILE} next to the daemon binary \
                 (cargo build -p fake-cuda), or set gpu.cuda_driver_path"
            )
        });
    }
    checkpoint::find_driver(cfg.cuda_driver_path.as_deref()).context("finding the CUDA driver (gpu.cuda_driver_path)")
}

impl ShimEnvironment {
    /// Copies the shim to `<runtime_dir>/cuda/libcuda.so.1` and builds the environment.
    pub fn prepare(cfg: &GpuConfig, runtime_dir: &Path, lease_socket: &Path) -> anyhow::Result<Self> {
        let shim = find_shim(cfg)?;
        let driver = find_driver(cfg)?;
        let dir = runtime_dir.join("cuda");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let lib = dir.join("libcuda.so.1");
        // Copy through a temporary name: a kernel still mapping the old file keeps its inode.
        let tmp = dir.join("libcuda.so.1.tmp");
        std::fs::copy(&shim, &tmp).with_context(|| format!("copying {} to {}", shim.display(), tmp.display()))?;
        std::fs::rename(&tmp, &lib).with_context(|| format!("installing {}", lib.display()))?;
        let counters_dir = runtime_dir.join("counters");
        std::fs::create_dir_all(&counters_dir).with_context(|| format!("creating {}", counters_dir.display()))?;
        let path = |p: &Path| p.display().to_string();
        let mut env = vec![
            ("LD_LIBRARY_PATH".to_owned(), ld_library_path(&dir)),
            ("LD_PRELOAD".to_owned(), path(&lib)),
            ("NBOS_LEASE_SOCKET".to_owned(), path(lease_socket)),
            ("NBOS_SHIM_COUNTERS_DIR".to_owned(), path(&counters_dir)),
        ];
        if cfg.driver == GpuDriver::Fake {
            let state = runtime_dir.join("fake-cuda");
            std::fs::create_dir_all(&state).with_context(|| format!("creating {}", state.display()))?;
            env.push(("FAKE_CUDA_GPUS".to_owned(), cfg.fake_gpus.to_string()));
            env.push(("FAKE_CUDA_GPU_MEMORY_MIB".to_owned(), cfg.fake_gpu_memory_mib.to_string()));
            env.push(("FAKE_CUDA_STATE_DIR".to_owned(), path(&state)));
        }
        tracing::info!(shim = %shim.display(), driver = %driver.display(), dir = %dir.display(), "kernels run under the CUDA shim");
        Ok(Self { dir, driver, counters_dir, env })
    }

    /// The `FAKE_CUDA_*` part of the environment: the daemon's own driver calls
    /// (checkpoint, restore) must see the same simulated GPUs as the kernels.
    pub fn fake_env(&self) -> impl Iterator<Item = &(String, String)> {
        self.env.iter().filter(|(k, _)| k.starts_with("FAKE_CUDA_"))
    }
}

/// `dir` first, then whatever the daemon was started with.
fn ld_library_path(dir: &Path) -> String {
    match std::env::var("LD_LIBRARY_PATH") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", dir.display()),
        _ => dir.display().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_configured_shim_is_a_clear_error() {
        let cfg = GpuConfig { shim_library: Some(PathBuf::from("/nonexistent/libshim.so")), ..GpuConfig::default() };
        let e = find_shim(&cfg).expect_err("missing shim");
        assert!(format!("{e:#}").contains("gpu.shim_library = /nonexistent/libshim.so"), "{e:#}");
    }

    #[test]
    fn fake_driver_env_names_the_shared_simulated_gpus() {
        let dir = tempfile::tempdir().expect("tempdir");
        let shim = dir.path().join("shim.so");
        let fake = dir.path().join("fake.so");
        std::fs::write(&shim, b"shim").expect("write");
        std::fs::write(&fake, b"fake").expect("write");
        let cfg = GpuConfig {
            driver: GpuDriver::Fake,
            fake_gpus: 3,
            shim_library: Some(shim),
            cuda_driver_path: Some(fake.clone()),
            ..GpuConfig::default()
        };
        let sock = dir.path().join("lease.sock");
        let env = ShimEnvironment::prepare(&cfg, dir.path(), &sock).expect("prepare");
        let get = |k: &str| env.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()).unwrap_or_default();
        assert_eq!(std::fs::read(env.dir.join("libcuda.so.1")).expect("copied"), b"shim");
        assert_eq!(get("LD_PRELOAD"), env.dir.join("libcuda.so.1").display().to_string());
        assert!(get("LD_LIBRARY_PATH").starts_with(&env.dir.display().to_string()));
        assert_eq!(env.driver, fake);
        assert!(env.env.iter().all(|(k, _)| k != "NBOS_CUDA_DRIVER"), "the lease server names the driver");
        assert_eq!(get("NBOS_LEASE_SOCKET"), sock.display().to_string());
        assert_eq!(get("FAKE_CUDA_GPUS"), "3");
        assert!(env.counters_dir.is_dir());
        assert_eq!(get("NBOS_SHIM_COUNTERS_DIR"), env.counters_dir.display().to_string());
        assert_eq!(env.fake_env().count(), 3);
    }
}
