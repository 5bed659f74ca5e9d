//! What a kernel's child does between fork and exec besides joining its cgroups and
//! dropping root: resource limits (RLIMIT_NOFILE, RLIMIT_NPROC) and, for a root daemon, a
//! mount namespace of its own with a bounded private `/dev/shm`. Prepared before the fork
//! (the child may not allocate); the host's settings are `kernel::sandbox`'s.

use std::ffi::CString;

/// What the child does between fork and exec, prepared before the fork (the child may
/// not allocate).
#[derive(Debug)]
pub struct ChildConfinement {
    rlimits: Vec<(libc::__rlimit_resource_t, libc::rlimit)>,
    /// The `/dev/shm` tmpfs options ("size=…,mode=1777").
    shm_options: Option<CString>,
    private_mounts: bool,
    pid_namespace: bool,
}

impl ChildConfinement {
    /// RLIMIT_NOFILE `open_files_max` and RLIMIT_NPROC `nproc_max`, each cut to the
    /// daemon's own hard limit (so kernels still start); a private mount namespace when
    /// `private_mounts`, with a `/dev/shm` of `shm_bytes`; a PID namespace when `pid_namespace`.
    pub fn new(
        open_files_max: Option<u64>,
        nproc_max: Option<u64>,
        shm_bytes: Option<u64>,
        private_mounts: bool,
        pid_namespace: bool,
    ) -> std::io::Result<Self> {
        let mut rlimits = Vec::new();
        for (resource, value) in [(libc::RLIMIT_NOFILE, open_files_max), (libc::RLIMIT_NPROC, nproc_max)] {
            let Some(value) = value else { continue };
            let mut current = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            // SAFETY: getrlimit(2) writes one rlimit into `current`, which outlives the call.
            if unsafe { libc::getrlimit(resource, &mut current) } != 0 {
                let e = std::io::Error::last_os_error();
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("reading the daemon's resource limit {resource}: {e}"),
                ));
            }
            // A cap, never a raise: raising a hard limit needs CAP_SYS_RESOURCE, which a
            // container may withhold from even a root daemon.
            let value = value.min(current.rlim_max);
            rlimits.push((resource, libc::rlimit { rlim_cur: value, rlim_max: value }));
        }
        let shm_options = match shm_bytes {
            Some(bytes) => Some(CString::new(format!("size={bytes},mode=1777"))?),
            None => None,
        };
        Ok(Self { rlimits, shm_options, private_mounts, pid_namespace })
    }

    /// Whether the child enters a PID namespace of its own ([`super::pid_namespace::enter`]).
    pub fn pid_namespace(&self) -> bool {
        self.pid_namespace
    }

    /// In the child, still root: limits, then a mount namespace of its own whose mounts
    /// no longer propagate to the host's, with a fresh bounded `/dev/shm`.
    ///
    /// # Safety
    /// Only between fork and exec: calls setrlimit(2), unshare(2) and mount(2) alone,
    /// all async-signal-safe, and allocates nothing.
    pub(super) unsafe fn apply(&self) -> std::io::Result<()> {
        // SAFETY: each call reads only integers and C strings this struct owns (or static
        // ones), which outlive the calls.
        unsafe {
            for (resource, limit) in &self.rlimits {
                if libc::setrlimit(*resource, limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if !self.private_mounts {
                return Ok(());
            }
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Slave, not private: unmounts on the host (a removed GPU, a lazily unmounted
            // disk) still reach the kernel, but nothing mounted here reaches the host.
            let none = std::ptr::null::<libc::c_char>();
            if libc::mount(none, c"/".as_ptr(), none, libc::MS_REC | libc::MS_SLAVE, std::ptr::null()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(options) = &self.shm_options {
                // Over the host's /dev/shm in this namespace only: the kernel sees neither the
                // host's nor another kernel's segments, and cannot fill the host's memory.
                let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
                if libc::mount(
                    c"tmpfs".as_ptr(),
                    c"/dev/shm".as_ptr(),
                    c"tmpfs".as_ptr(),
                    flags,
                    options.as_ptr().cast(),
                ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A limit is never raised above the daemon's own hard limit.
    #[test]
    fn limits_are_cut_to_the_daemons_hard_limit() {
        let child = ChildConfinement::new(Some(u64::MAX), None, None, false, false).expect("confinement");
        let mut now = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit(2) writes one rlimit into `now`, which outlives the call.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut now) }, 0);
        assert_eq!(child.rlimits[0].1.rlim_max, now.rlim_max);
    }
}
