//! What a kernel process's child does between fork and exec, as root, before any of the
//! kernel's code runs: join its cgroups, take its limits and namespaces, mount its home,
//! enter its PID namespace, drop to its account, forbid new privileges, enter its working
//! directory. Everything is prepared before the fork: the child may not allocate.

use std::ffi::CString;
use std::os::fd::RawFd;

use super::confinement::ChildConfinement;
use super::mount::Ext4Mount;
use super::pid_namespace;

/// The child's steps, prepared before the fork.
#[derive(Debug)]
pub struct ChildSetup {
    /// Open `cgroup.procs` files the child joins (they stay open in the parent until the
    /// spawn returns).
    pub cgroup_procs: Vec<RawFd>,
    /// RLIMIT_AS, soft and hard.
    pub address_space_limit: Option<u64>,
    /// Limits and the private mount namespace.
    pub confinement: ChildConfinement,
    /// The home to mount (its loop device held by the caller until the spawn returns).
    pub home: Option<Ext4Mount>,
    /// The write end of the PID namespace's report pipe ([`pid_namespace::PidReport::write_fd`]):
    /// the child enters a PID namespace of its own.
    pub pid_report: Option<RawFd>,
    /// The account to drop to: (uid, gid).
    pub ids: Option<(u32, u32)>,
    /// Its supplementary groups (an owner's account's; empty: none).
    pub groups: Vec<u32>,
    /// Instead of dropping every capability with root: keep exactly CAP_SETUID and
    /// CAP_SETGID across the exec (a pre-warmed process under `kernel.run_as = "owner"`,
    /// which switches to its kernel's owner when taken; [`super::capabilities`]).
    pub keep_setid_caps: bool,
    /// The working directory to enter again once the home is mounted over it.
    pub cwd_again: Option<CString>,
}

impl ChildSetup {
    /// Makes the child of `cmd` run these steps between fork and exec.
    pub fn install(self, cmd: &mut tokio::process::Command) -> std::io::Result<()> {
        let Self {
            cgroup_procs,
            address_space_limit,
            confinement,
            home,
            pid_report,
            ids,
            groups,
            keep_setid_caps,
            cwd_again,
        } = self;
        let groups: Vec<libc::gid_t> = groups;
        let rlimit_as = address_space_limit.map(|limit| libc::rlimit { rlim_cur: limit, rlim_max: limit });
        let init_exe = pid_namespace::init_exe();
        let daemon_pid = libc::pid_t::try_from(std::process::id())
            .map_err(|_| std::io::Error::other("the daemon's pid out of range"))?;
        // SAFETY: the closure runs in the child between fork and exec, where only
        // async-signal-safe calls are allowed: write(2), setrlimit(2), unshare(2),
        // mount(2), open(2), fchdir(2), chdir(2), setgroups(2), setgid(2), setuid(2),
        // prctl(2), capset(2) and those of pid_namespace::enter are, and the closure
        // allocates nothing (it reads its own copies of plain integers, C strings and
        // Vecs made before the fork; the fds stay open in the parent until spawn returns,
        // the loop device too, held by the caller).
        unsafe {
            cmd.pre_exec(move || {
                // Join the cgroups first, while still root (joining needs write access
                // to cgroup.procs): no kernel code runs outside them.
                for &fd in &cgroup_procs {
                    if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                // RLIMIT_AS: an allocation beyond the limit fails inside the kernel
                // (Python raises MemoryError) instead of the OOM killer taking the host's
                // memory back from some other process. It bounds each process, not the
                // tree; the memory cgroup bounds the tree (`kernel/cgroup.rs`).
                if let Some(rlim) = &rlimit_as {
                    if libc::setrlimit(libc::RLIMIT_AS, rlim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                // Open files, processes of its uid, its own mount namespace and /dev/shm
                // (confinement.rs), then its home with the quota (mount.rs); still root.
                confinement.apply()?;
                if let Some(home) = &home {
                    home.mount_here()?;
                }
                // A PID namespace of its own; only the kernel process returns from it.
                if let Some(fd) = pid_report {
                    pid_namespace::enter(fd, init_exe, daemon_pid)?;
                }
                // Drop root for good: the account's supplementary groups (none but an
                // owner's), then the group, then the user (after setuid nothing else could
                // be changed; a switching pool process keeps CAP_SETUID/CAP_SETGID only).
                // Done here rather than with CommandExt::uid/gid, which std runs before
                // pre_exec closures, so the cgroup writes above still run as root.
                if let Some((uid, gid)) = ids {
                    if keep_setid_caps {
                        // While root (CAP_SETPCAP): the bounding set down to the two, and
                        // the permitted set kept through the setuid below.
                        super::capabilities::before_setuid_keep_setid()?;
                    }
                    if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                        || libc::setgid(gid) != 0
                        || libc::setuid(uid) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    if keep_setid_caps {
                        super::capabilities::after_setuid_keep_setid()?;
                    }
                }
                // Nothing the kernel execs (setuid binaries, file capabilities) gains privileges.
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // As the kernel's user: its working directory may be the home just mounted.
                if let Some(cwd) = &cwd_again {
                    if libc::chdir(cwd.as_ptr()) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        Ok(())
    }
}
