//! Prepares the kernels' directory `<state_dir>/kernels`: the kernel sandbox, what a
//! previous daemon of this host left (processes, cgroups, directories), and the modes that
//! let kernels running as another uid reach their own files.

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::fs::create_private_dir;
use super::gpus::Gpus;
use crate::config::Config;
use crate::kernel::identity;
use crate::kernel::shim_env::ShimEnvironment;

/// Makes the kernels' directory and clears what an earlier run left in it; `switches_user`:
/// kernels run as another uid than the daemon's.
pub(super) fn prepare_kernels_dir(config: &Config, gpus: &Gpus, switches_user: bool) -> anyhow::Result<PathBuf> {
    // On disk under the state directory, not in the runtime directory's tmpfs (/run, shared
    // with systemd and the lease socket): kernels' homes have a quota there (kernel/home.rs).
    let kernels_dir = config.node.state_dir.join("kernels");
    create_private_dir(&kernels_dir)?;
    crate::kernel::sandbox::configure(crate::kernel::sandbox::Sandbox::from_config(
        &config.kernel,
        identity::daemon_is_root(),
    ));
    // Kernels a killed predecessor left (outside systemd): none is ever adopted.
    let orphans =
        crate::kernel::orphans::kill_left_over(&std::path::absolute(&kernels_dir).unwrap_or(kernels_dir.clone()));
    if orphans > 0 {
        tracing::warn!(count = orphans, dir = %kernels_dir.display(), "killed kernel processes a previous daemon of this host left running");
    }
    // And their cgroups (memory, pids, device guard), which only a daemon that ends can remove.
    let host_tag = crate::kernel::registry::host_tag(&kernels_dir);
    let cgroups = crate::kernel::orphans::remove_left_over_cgroups(
        &crate::kernel::orphans::kernel_cgroup_parents(
            Path::new("/sys/fs/cgroup"),
            &std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default(),
        ),
        &host_tag,
    );
    if cgroups > 0 {
        tracing::warn!(count = cgroups, "removed kernel cgroups a previous daemon of this host left");
    }
    if let Some(dc) = &gpus.device_cgroups {
        // Named like the kernels' other cgroups, so the next daemon finds what this one leaves.
        dc.set_tag(host_tag);
    }
    // Their directories (no kernel is adopted): on disk now, they would pile up.
    crate::kernel::home::remove_left_over(&kernels_dir);
    if switches_user {
        open_to_kernels(config, &kernels_dir, gpus.leasing.as_ref().map(|(_, shim)| shim))?;
    }
    Ok(kernels_dir)
}

/// Kernels run as another uid: it must pass through the daemon's runtime directory and
/// `kernels/` (0711: enter, not list) to its own directory and the lease socket, load the
/// CUDA shim (0755), and write
/// the shim's counters (1733: create, not list, not remove others') and the fake GPUs'
/// ledgers (1777). In cluster mode they also pass through the state directory to their
/// namespace export directories under `sync/` (the raft log and objects stay 0700). Only
/// the daemon's own directories change, never anything above them.
fn open_to_kernels(config: &Config, kernels_dir: &Path, shim: Option<&ShimEnvironment>) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let chmod = |dir: &Path, mode: u32| {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("making {} mode {mode:o} for kernels", dir.display()))
    };
    let (runtime_dir, state_dir) = (&config.node.runtime_dir, &config.node.state_dir);
    chmod(runtime_dir, 0o711)?;
    chmod(kernels_dir, 0o711)?;
    // Kernels' directories are in the state directory: kernels pass through it.
    if kernels_dir.starts_with(state_dir) || config.cluster.enabled || runtime_dir.starts_with(state_dir) {
        if config.cluster.enabled {
            for private in [state_dir.join("raft"), state_dir.join("objects")] {
                create_private_dir(&private)?;
                chmod(&private, 0o700)?;
            }
        }
        chmod(state_dir, 0o711)?;
    }
    if let Some(shim) = shim {
        // The shim kernels load as libcuda.so.1 (the unit's UMask=0077 would keep it private).
        chmod(&shim.dir, 0o755)?;
        chmod(&shim.dir.join("libcuda.so.1"), 0o755)?;
    }
    for (key, value) in shim.map(|s| s.env.as_slice()).unwrap_or_default() {
        match key.as_str() {
            "NBOS_SHIM_COUNTERS_DIR" => chmod(Path::new(value), 0o1733)?,
            "FAKE_CUDA_STATE_DIR" => chmod(Path::new(value), 0o1777)?,
            _ => {}
        }
    }
    Ok(())
}
