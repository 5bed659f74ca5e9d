//! What confines a kernel process besides its cgroups and its account: resource limits
//! (RLIMIT_NOFILE, RLIMIT_NPROC) and, when the daemon is root, a mount namespace of its
//! own with a bounded private `/dev/shm` and its home on a quota'd filesystem
//! ([`super::home`]), and a PID namespace of its own ([`crate::sys::pid_namespace`]).
//!
//! One set per host (`kernel.*`), applied by every spawn ([`super::process::Launch`]), so a
//! pre-warmed process, started before its kernel is known, has exactly the limits of a
//! kernel started afresh.

use std::sync::OnceLock;

use anyhow::Context;

use crate::config::KernelConfig;
use crate::sys::confinement::ChildConfinement;
use crate::sys::pid_namespace;

/// The host's kernel confinement (`kernel.open_files_max`, `nproc_max`, `shm_size_mib`,
/// `home_quota_mib`). `None`: not applied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sandbox {
    /// RLIMIT_NOFILE, soft and hard.
    pub open_files_max: Option<u64>,
    /// RLIMIT_NPROC, soft and hard (per uid: see `docs/configuration.md`).
    pub nproc_max: Option<u64>,
    /// Size of the private `/dev/shm` tmpfs (root only).
    pub shm_bytes: Option<u64>,
    /// Size of the home's ext4 image (root only).
    pub home_quota_bytes: Option<u64>,
    /// `kernel.limit_address_space`: the memory limit is also each process's RLIMIT_AS.
    pub limit_address_space: bool,
    /// `kernel.pid_namespace`: each kernel process in a PID namespace of its own (root only).
    pub pid_namespace: bool,
}

static HOST: OnceLock<Sandbox> = OnceLock::new();
static NONE: Sandbox = Sandbox {
    open_files_max: None,
    nproc_max: None,
    shm_bytes: None,
    home_quota_bytes: None,
    limit_address_space: false,
    pid_namespace: false,
};

impl Sandbox {
    /// The confinement `kernel` asks for that a daemon with (or without) `root` can give:
    /// mounts need root, so without it the namespace parts are dropped (and said once).
    pub fn from_config(kernel: &KernelConfig, root: bool) -> Self {
        let some = |v: u64| (v > 0).then_some(v);
        let mib = |v: u64| some(v).map(|v| v.saturating_mul(1 << 20));
        let mut s = Self {
            open_files_max: some(kernel.open_files_max),
            nproc_max: some(kernel.nproc_max),
            shm_bytes: mib(kernel.shm_size_mib),
            home_quota_bytes: mib(kernel.home_quota_mib),
            limit_address_space: kernel.limit_address_space,
            pid_namespace: kernel.pid_namespace && root,
        };
        if !root && (s.shm_bytes.is_some() || s.home_quota_bytes.is_some() || kernel.pid_namespace) {
            tracing::warn!(
                "the daemon is not root: kernels get no home quota (kernel.home_quota_mib), share the host's \
                 /dev/shm (kernel.shm_size_mib) and the daemon's PID namespace (kernel.pid_namespace: a kernel \
                 can signal the pre-warm pool's processes, which are checked at hand-over); all need namespaces \
                 per kernel"
            );
            s.shm_bytes = None;
            s.home_quota_bytes = None;
        }
        if s.private_mounts() && !root_is_a_mount_point() {
            // In a chroot, "/" is a directory of some mount: its propagation cannot be made
            // one-way (EINVAL), and a kernel's mounts (its /dev/shm, home, /proc) could then
            // appear on the host.
            tracing::warn!(
                "the daemon's root directory is not a mount point (a chroot?): kernels get no home quota \
                 (kernel.home_quota_mib), share the host's /dev/shm (kernel.shm_size_mib) and the daemon's PID \
                 namespace (kernel.pid_namespace)"
            );
            s.shm_bytes = None;
            s.home_quota_bytes = None;
            s.pid_namespace = false;
        }
        if s.pid_namespace && !pid_namespace::supported() {
            // A container, or a unit whose RestrictNamespaces= leaves out "pid".
            tracing::warn!(
                "this host refuses new PID namespaces (unshare(CLONE_NEWPID), or mounting their /proc) or has no \
                 pidfd_open (Linux 5.3): \
                 kernels share the daemon's (kernel.pid_namespace), so a kernel can signal the pre-warm pool's \
                 processes (they are checked at hand-over)"
            );
            s.pid_namespace = false;
        }
        if s.pid_namespace {
            pid_namespace::open_own_binary();
        }
        s
    }

    /// Whether kernels get a mount namespace of their own (a PID namespace brings one: its
    /// own /proc is mounted in it).
    pub fn private_mounts(&self) -> bool {
        self.shm_bytes.is_some() || self.home_quota_bytes.is_some() || self.pid_namespace
    }
}

/// Whether this process's root directory is a mount point (it is not in a chroot), as
/// `/proc/self/mountinfo` says; unreadable counts as not.
fn root_is_a_mount_point() -> bool {
    procfs::process::Process::myself()
        .and_then(|p| p.mountinfo())
        .is_ok_and(|mounts| mounts.into_iter().any(|m| m.mount_point == std::path::Path::new("/")))
}

/// Sets the host's confinement; the first call wins (one daemon per process).
pub fn configure(sandbox: Sandbox) {
    if HOST.set(sandbox.clone()).is_err() && HOST.get() != Some(&sandbox) {
        tracing::warn!("kernel confinement already set for this process; keeping the first");
    }
    tracing::info!(?sandbox, "kernel confinement");
}

/// The host's confinement (none until [`configure`]d).
pub fn host() -> &'static Sandbox {
    HOST.get().unwrap_or(&NONE)
}

/// What the child of a spawn does between fork and exec under `sandbox`.
pub(super) fn child_confinement(sandbox: &Sandbox) -> anyhow::Result<ChildConfinement> {
    ChildConfinement::new(
        sandbox.open_files_max,
        sandbox.nproc_max,
        sandbox.shm_bytes,
        sandbox.private_mounts(),
        sandbox.pid_namespace,
    )
    .context("preparing the kernel's limits and /dev/shm")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mounts need root: a daemon that is not root keeps the limits and drops the rest.
    #[test]
    fn without_root_kernels_keep_their_limits_but_get_no_mounts() {
        let k = KernelConfig::default();
        let root = Sandbox::from_config(&k, true);
        assert!(root.private_mounts() && root.home_quota_bytes == Some(10 << 30) && root.shm_bytes == Some(2 << 30));
        let user = Sandbox::from_config(&k, false);
        assert!(!user.private_mounts());
        assert_eq!((user.open_files_max, user.nproc_max), (Some(65_536), Some(32_768)));
        let off = KernelConfig {
            open_files_max: 0,
            nproc_max: 0,
            shm_size_mib: 0,
            home_quota_mib: 0,
            pid_namespace: false,
            ..k
        };
        assert_eq!(Sandbox::from_config(&off, true), Sandbox::default());
    }
}
