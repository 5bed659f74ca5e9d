//! What the forked child does between fork and exec, in the order systemd's `exec_child`
//! does it. Only system calls on data prepared before the fork: the parent has threads, so
//! the child must neither allocate nor take a lock.

use std::io;

use super::UnitSandbox;

/// Writes `msg` to stderr (the step that failed) and returns the error the spawn reports.
fn fail(msg: &std::ffi::CStr) -> io::Error {
    let e = io::Error::last_os_error();
    let bytes = msg.to_bytes();
    // SAFETY: write(2) of a live buffer to stderr; async-signal-safe.
    unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
    e
}

fn check(rc: libc::c_long, msg: &std::ffi::CStr) -> io::Result<()> {
    if rc < 0 {
        Err(fail(msg))
    } else {
        Ok(())
    }
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_V3: u32 = 0x2008_0522;

/// `struct mount_attr` of mount_setattr(2).
#[repr(C)]
struct MountAttr {
    set: u64,
    clr: u64,
    propagation: u64,
    userns_fd: u64,
}

impl UnitSandbox {
    /// Applies the sandbox to the calling (forked, single-threaded) process.
    pub(super) fn enter(&self) -> io::Result<()> {
        for (resource, value) in &self.rlimits {
            let lim = libc::rlimit { rlim_cur: *value, rlim_max: *value };
            // SAFETY: setrlimit(2) with a live rlimit.
            check(unsafe { libc::setrlimit(*resource, &raw const lim) }.into(), c"unit sandbox: setrlimit failed\n")?;
        }
        if let Some(d) = &self.devices {
            // SAFETY: open/write/close of a NUL-terminated path and a static buffer.
            let fd = unsafe { libc::open(d.procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
            check(fd.into(), c"unit sandbox: joining the devices cgroup failed\n")?;
            // SAFETY: as above; "0" moves the writing process.
            let n = unsafe { libc::write(fd, c"0".as_ptr().cast(), 1) };
            // SAFETY: our own descriptor.
            unsafe { libc::close(fd) };
            check(n as libc::c_long, c"unit sandbox: joining the devices cgroup failed\n")?;
        }
        self.mounts()?;
        if self.keyring_private {
            // SAFETY: keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL): a new anonymous session keyring.
            let rc = unsafe { libc::syscall(libc::SYS_keyctl, 1, 0usize) };
            check(rc, c"unit sandbox: KeyringMode=private failed\n")?;
        }
        if let Some(mask) = self.umask {
            // SAFETY: umask(2) cannot fail.
            unsafe { libc::umask(mask) };
        }
        for cap in &self.bounding_drop {
            // SAFETY: prctl(PR_CAPBSET_DROP, cap).
            let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, *cap, 0, 0, 0) };
            check(rc.into(), c"unit sandbox: CapabilityBoundingSet failed\n")?;
        }
        self.ambient()?;
        if let Some(bits) = self.securebits {
            // SAFETY: prctl(PR_SET_SECUREBITS, bits); we still have CAP_SETPCAP.
            let rc = unsafe { libc::prctl(libc::PR_SET_SECUREBITS, bits, 0, 0, 0) };
            check(rc.into(), c"unit sandbox: SecureBits failed\n")?;
        }
        if self.no_new_privs {
            // SAFETY: prctl(PR_SET_NO_NEW_PRIVS, 1).
            let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
            check(rc.into(), c"unit sandbox: NoNewPrivileges failed\n")?;
        }
        for program in &self.filters {
            let prog = libc::sock_fprog {
                len: u16::try_from(program.len()).map_err(|_| io::Error::from_raw_os_error(libc::E2BIG))?,
                filter: program.as_ptr().cast_mut(),
            };
            // SAFETY: seccomp(SECCOMP_SET_MODE_FILTER, 0, prog); the kernel copies the
            // program, which outlives the call.
            let rc = unsafe { libc::syscall(libc::SYS_seccomp, 1, 0, &raw const prog) };
            check(rc, c"unit sandbox: installing a seccomp filter failed\n")?;
        }
        Ok(())
    }

    fn mounts(&self) -> io::Result<()> {
        for (step, msg) in &self.mounts.steps {
            check(run_step(step), msg)?;
        }
        Ok(())
    }

    /// `AmbientCapabilities=`: cleared, then each raised (inheritable first, as the kernel asks).
    fn ambient(&self) -> io::Result<()> {
        // SAFETY: prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL).
        let rc = unsafe { libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) };
        check(rc.into(), c"unit sandbox: clearing the ambient set failed\n")?;
        if self.ambient.is_empty() {
            return Ok(());
        }
        let mut header = CapHeader { version: CAP_V3, pid: 0 };
        let mut data = [CapData { effective: 0, permitted: 0, inheritable: 0 }; 2];
        // SAFETY: capget(2) into a v3 header and its two data words.
        let rc = unsafe { libc::syscall(libc::SYS_capget, &raw mut header, data.as_mut_ptr()) };
        check(rc, c"unit sandbox: capget failed\n")?;
        for cap in &self.ambient {
            let (word, bit) = ((*cap / 32) as usize, *cap % 32);
            data[word].inheritable |= 1 << bit;
        }
        // SAFETY: capset(2) with the data capget filled in, inheritable bits added.
        let rc = unsafe { libc::syscall(libc::SYS_capset, &raw mut header, data.as_ptr()) };
        check(rc, c"unit sandbox: capset (inheritable) failed\n")?;
        for cap in &self.ambient {
            // SAFETY: prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap).
            let rc = unsafe { libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_RAISE, *cap, 0, 0) };
            check(rc.into(), c"unit sandbox: AmbientCapabilities failed\n")?;
        }
        Ok(())
    }
}

/// One mount step's system call; its return value.
fn run_step(step: &super::mounts::Step) -> libc::c_long {
    use super::mounts::Step;
    let null = std::ptr::null::<libc::c_char>();
    match step {
        // SAFETY: unshare(2) with flags only.
        Step::Unshare(flags) => unsafe { libc::unshare(*flags) }.into(),
        Step::Slave => {
            let flags = libc::MS_REC | libc::MS_SLAVE;
            // SAFETY: mount(2) changing propagation; "/" is a static C string.
            unsafe { libc::mount(null, c"/".as_ptr(), null, flags, std::ptr::null()) }.into()
        }
        Step::Bind(from, to) => {
            let flags = libc::MS_BIND | libc::MS_REC;
            // SAFETY: mount(2) with two live NUL-terminated paths.
            unsafe { libc::mount(from.as_ptr(), to.as_ptr(), null, flags, std::ptr::null()) }.into()
        }
        Step::ReadOnly(path, on) => {
            let ro = libc::MOUNT_ATTR_RDONLY;
            let (set, clr) = if *on { (ro, 0) } else { (0, ro) };
            let attr = MountAttr { set, clr, propagation: 0, userns_fd: 0 };
            let size = std::mem::size_of::<MountAttr>();
            // SAFETY: mount_setattr(2) with a live path and a live mount_attr of `size` bytes.
            unsafe {
                libc::syscall(
                    libc::SYS_mount_setattr,
                    libc::AT_FDCWD,
                    path.as_ptr(),
                    libc::AT_RECURSIVE,
                    &raw const attr,
                    size,
                )
            }
        }
        Step::Proc(options) => {
            let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
            // SAFETY: mount(2) of a new procfs with static strings and live options.
            unsafe {
                libc::mount(c"proc".as_ptr(), c"/proc".as_ptr(), c"proc".as_ptr(), flags, options.as_ptr().cast())
            }
            .into()
        }
    }
}
