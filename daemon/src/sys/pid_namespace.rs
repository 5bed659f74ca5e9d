//! A PID namespace per kernel process (root daemons, `kernel.pid_namespace`): kill(2),
//! ptrace(2) and pidfd_open(2) take pids of the caller's namespace, so a kernel reaches its
//! own processes only, never a pre-warmed pool process, another kernel or the daemon,
//! whatever account they share (issue 29; the BPF LSM pool guard needs a kernel that
//! few hosts run).
//!
//! Between fork and exec the child S (the daemon's child, in the host's namespace)
//! unshares a new namespace and forks its init R, which forks the kernel P:
//!
//! ```text
//! notebookosd ── S (root, host namespace) ── R (root, pid 1: reaps) ── P (python, pid 2)
//! ```
//!
//! S and R exec a fresh image of the daemon's binary (opened at start, so an upgrade that
//! replaced the file changes nothing) as `nbos-kernel-init supervise|reap` ([`run_as_init`]):
//! a fork that stayed would keep a copy of every daemon page the daemon later changes, per
//! kernel. R reaps whatever the kernel orphans (a Python at pid 1 would not) and exits with
//! P's code; S exits with R's, so the daemon's wait on S is its wait on the kernel (a kernel
//! killed by signal N shows as "exit status: 128+N": R, its namespace's init, cannot die of
//! a signal it sends itself). S kills R when the daemon is gone (as ipykernel's parent
//! poller did when P was the daemon's child), R dies with S (`PR_SET_PDEATHSIG`), and the
//! namespace dies with R.
//!
//! P tells the daemon its pid in the daemon's namespace (from `/proc/self`, still the
//! host's procfs) on a pipe, then mounts a procfs of its namespace on `/proc` (in the
//! kernel's own mount namespace) before it drops root and execs: inside, `/proc` shows the
//! kernel's own processes only, with the pids `os.getpid()` gives (psutil and the like
//! work), and no other process's files. The reported pid is what the daemon signals
//! (through a pidfd), registers with the lease server and finds in its `/proc`; the CUDA
//! shim learns it on registration.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;

use anyhow::Context;

use super::pidfd::{is_alive, pidfd_open};
use super::procfs::parent_of;

/// How often S looks whether the daemon is still its parent (P's exit wakes it at once).
const PARENT_POLL_MS: libc::c_int = 1000;
/// `argv[0]` of S and R after their exec (what `ps` shows), which [`run_as_init`] knows.
const INIT_NAME: &CStr = c"nbos-kernel-init";
/// P's pid inside: the second process of a new namespace, after R.
const KERNEL_PID_INSIDE: libc::pid_t = 2;

/// The daemon's own binary, opened once (`/proc/self/exe`), for S and R to exec.
static EXE: OnceLock<OwnedFd> = OnceLock::new();

/// Opens the daemon's binary for S and R (once per process); without it they stay forks
/// of the daemon (working, but each holds a copy of the daemon's memory as it changes).
pub fn open_own_binary() {
    if EXE.get().is_some() {
        return;
    }
    match std::fs::File::open("/proc/self/exe") {
        Ok(f) => {
            let _ = EXE.set(OwnedFd::from(f));
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot open the daemon's own binary (/proc/self/exe): kernels' PID namespace init stays a fork of the daemon")
        }
    }
}

/// In a process started as `nbos-kernel-init` (S or R after their exec), runs its loop and
/// never returns; in any other, returns at once. The daemon's `main` calls it first.
pub fn run_as_init() {
    let mut args = std::env::args_os();
    if args.next().as_deref() != Some(std::ffi::OsStr::new(INIT_NAME.to_str().unwrap_or_default())) {
        return;
    }
    let role = args.next();
    let mut pid = || args.next().and_then(|a| a.to_str()?.parse::<libc::pid_t>().ok());
    let (first, second) = (pid(), pid());
    // SAFETY: supervise and reap only make system calls on integers and stack structs.
    unsafe {
        match (role.as_deref().and_then(std::ffi::OsStr::to_str), first, second) {
            (Some("supervise"), Some(init), Some(daemon)) => supervise(init, daemon),
            (Some("reap"), Some(kernel), None) => reap(kernel),
            _ => {
                eprintln!("nbos-kernel-init: started with unexpected arguments (it is run by notebookosd only)");
                std::process::exit(2)
            }
        }
    }
}

/// Whether this host can give kernels a PID namespace: `pidfd_open` exists (Linux 5.3),
/// and a child can do what a kernel's start does, in namespaces that end with it: unshare a
/// mount and a PID namespace, and mount the new namespace's procfs from inside it (a
/// container, or a unit's `RestrictNamespaces=`, may refuse either).
pub fn supported() -> bool {
    if pidfd_open(std::process::id()).is_err() {
        return false;
    }
    // SAFETY: fork(2) twice; each child only calls unshare(2), mount(2), fork(2), waitpid(2)
    // and _exit(2), all async-signal-safe, on integers and static strings, and each parent
    // reaps its child with waitpid(2) on the pid fork returned.
    unsafe {
        let probe = libc::fork();
        if probe == 0 {
            let none = std::ptr::null::<libc::c_char>();
            if libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWPID) != 0
                || libc::mount(none, c"/".as_ptr(), none, libc::MS_REC | libc::MS_SLAVE, std::ptr::null()) != 0
            {
                libc::_exit(1);
            }
            let inside = libc::fork();
            if inside == 0 {
                let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
                libc::_exit(i32::from(
                    libc::mount(c"proc".as_ptr(), c"/proc".as_ptr(), c"proc".as_ptr(), flags, std::ptr::null()) != 0,
                ));
            }
            libc::_exit(if inside > 0 && exited_zero(inside) { 0 } else { 1 });
        }
        probe > 0 && exited_zero(probe)
    }
}

/// Reaps child `pid`: whether it exited with 0.
fn exited_zero(pid: libc::pid_t) -> bool {
    let mut status = 0;
    // SAFETY: waitpid(2) on a child of this process, into a local.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return false;
        }
    }
    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
}

/// The pipe on which P reports its pid, made before the fork (close-on-exec both ends).
#[derive(Debug)]
pub struct PidReport {
    read: OwnedFd,
    write: OwnedFd,
}

impl PidReport {
    pub fn new() -> anyhow::Result<Self> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: pipe2(2) writes two descriptors into `fds`, which outlives the call.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(std::io::Error::last_os_error()).context("making the kernel's pid report pipe");
        }
        // SAFETY: pipe2 succeeded: both descriptors are open and owned by nobody else.
        Ok(unsafe { Self { read: OwnedFd::from_raw_fd(fds[0]), write: OwnedFd::from_raw_fd(fds[1]) } })
    }

    /// The write end's number, for the child (valid while `self` lives).
    pub fn write_fd(&self) -> RawFd {
        self.write.as_raw_fd()
    }

    /// After the spawn returned (P has exec'd, so it reported): P's pid, pinned by a
    /// pidfd, checked to be the grandchild of `supervisor` (S).
    pub fn take(self, supervisor: u32) -> anyhow::Result<(u32, OwnedFd)> {
        drop(self.write);
        let mut buf = [0u8; 4];
        // SAFETY: read(2) into a 4-byte buffer that outlives the call.
        let n = unsafe { libc::read(self.read.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        anyhow::ensure!(n == 4, "the kernel's pid namespace did not report its process (read {n} bytes)");
        let pid = u32::from_ne_bytes(buf);
        let pidfd = pidfd_open(pid)
            .with_context(|| format!("pidfd_open of kernel process {pid} (did it exit at once? see kernel.log)"))?;
        // The pidfd names the process that has the pid now; it is P only if P's parent's
        // parent is S, checked while the pidfd's process still runs.
        let init = parent_of(pid).context("reading the kernel process's parent")?;
        anyhow::ensure!(
            parent_of(init) == Some(supervisor) && is_alive(&pidfd),
            "process {pid} is not the kernel of pid namespace supervisor {supervisor}"
        );
        Ok((pid, pidfd))
    }
}

/// In the daemon's child, still root: makes S, R and P; returns in P only (which goes on to
/// drop root and exec). `report` is [`PidReport::write_fd`], `exe` [`init_exe`], `daemon`
/// the daemon's pid (read before the fork: the daemon may die meanwhile).
///
/// # Safety
/// Only between fork and exec. Calls only async-signal-safe functions (unshare, fork,
/// prctl, readlink, write, mount, close_range, close, execveat, poll, waitpid, kill,
/// getppid, _exit) and allocates nothing. fork(2) is safe here: this child is single-threaded.
pub(super) unsafe fn enter(report: RawFd, exe: Option<RawFd>, daemon: libc::pid_t) -> std::io::Result<()> {
    // SAFETY: see the function's contract; every buffer passed is on this stack.
    unsafe {
        if libc::unshare(libc::CLONE_NEWPID) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let init = libc::fork();
        if init < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if init > 0 {
            let (mut a, mut b) = ([0u8; 12], [0u8; 12]);
            exec_init(exe, c"supervise", &[digits(init, &mut a), digits(daemon, &mut b)]);
            supervise(init, daemon);
        }
        // R, pid 1 of the new namespace: dies with S.
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let kernel = libc::fork();
        if kernel < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if kernel > 0 {
            if kernel == KERNEL_PID_INSIDE {
                let mut a = [0u8; 12];
                exec_init(exe, c"reap", &[digits(kernel, &mut a)]);
            }
            reap(kernel);
        }
        // P: report our pid as the daemon sees it, then go on to exec.
        let mut link = [0u8; 16];
        let n = libc::readlink(c"/proc/self".as_ptr(), link.as_mut_ptr().cast(), link.len());
        let Some(pid) = usize::try_from(n).ok().and_then(|n| parse_pid(&link[..n.min(link.len())])) else {
            return Err(std::io::Error::from_raw_os_error(libc::ENOENT));
        };
        let bytes = pid.to_ne_bytes();
        if libc::write(report, bytes.as_ptr().cast(), bytes.len()) != 4 {
            return Err(std::io::Error::last_os_error());
        }
        // This namespace's procfs over the host's, in the kernel's own mount namespace.
        let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
        if libc::mount(c"proc".as_ptr(), c"/proc".as_ptr(), c"proc".as_ptr(), flags, std::ptr::null()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// The pid an init of the daemon's image for a new kernel process would be handed:
/// [`EXE`]'s descriptor, read before the fork.
pub(super) fn init_exe() -> Option<RawFd> {
    EXE.get().map(AsRawFd::as_raw_fd)
}

/// `n` as a NUL-terminated decimal string in `buf`, without allocating.
fn digits(n: libc::pid_t, buf: &mut [u8; 12]) -> *const libc::c_char {
    let mut v = n.unsigned_abs();
    let mut i = buf.len() - 1;
    buf[i] = 0;
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 || i == 0 {
            break;
        }
    }
    buf[i..].as_ptr().cast()
}

/// S or R: closes every descriptor but the binary's (std's exec-error pipe among them: the
/// spawn returns once P has exec'd), then execs the daemon's binary as `nbos-kernel-init
/// <role> <args>`. Returns only if that failed (the caller then runs the loop itself).
///
/// # Safety
/// Between fork and exec, in S or R; `args` point to NUL-terminated strings on the stack.
unsafe fn exec_init(exe: Option<RawFd>, role: &CStr, args: &[*const libc::c_char]) {
    let Some(exe) = exe else { return };
    // SAFETY: close_range(2) and execveat(2) with integers and NULL-terminated arrays of
    // pointers to NUL-terminated strings, all on this stack or static.
    unsafe {
        let fd = u32::try_from(exe).unwrap_or(0);
        if fd == 0
            || libc::syscall(libc::SYS_close_range, 0u32, fd - 1, 0u32) != 0
            || libc::syscall(libc::SYS_close_range, fd + 1, u32::MAX, 0u32) != 0
        {
            return;
        }
        let mut argv = [std::ptr::null::<libc::c_char>(); 5];
        argv[0] = INIT_NAME.as_ptr();
        argv[1] = role.as_ptr();
        for (slot, a) in argv[2..4].iter_mut().zip(args) {
            *slot = *a;
        }
        let envp = [std::ptr::null::<libc::c_char>()];
        libc::syscall(libc::SYS_execveat, exe, c"".as_ptr(), argv.as_ptr(), envp.as_ptr(), libc::AT_EMPTY_PATH);
    }
}

/// Digits to a pid, without allocating.
fn parse_pid(digits: &[u8]) -> Option<u32> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u32, |acc, &d| {
        d.is_ascii_digit().then_some(())?;
        acc.checked_mul(10)?.checked_add(u32::from(d - b'0'))
    })
}

/// Closes every descriptor (std's exec-error pipe among them: the spawn returns once P
/// has exec'd, not when S exits).
///
/// # Safety
/// Between fork and exec, in S or R.
unsafe fn close_all() {
    // SAFETY: close_range(2) and close(2) take integers.
    unsafe {
        if libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32) != 0 {
            // Before Linux 5.9: every descriptor up to the open-file limit.
            let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            let top = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 { lim.rlim_cur } else { 1 << 20 };
            for fd in 0..libc::c_int::try_from(top).unwrap_or(libc::c_int::MAX) {
                libc::close(fd);
            }
        }
    }
}

/// `status` of a reaped child as an exit code: its own, or 128 + the signal that ended it.
fn exit_code(status: libc::c_int) -> libc::c_int {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    }
}

/// S: waits for R; kills it (and the namespace) once the daemon is no longer its parent.
///
/// # Safety
/// In S: between fork and exec, or after its exec as `nbos-kernel-init`.
unsafe fn supervise(init: libc::pid_t, daemon: libc::pid_t) -> ! {
    // SAFETY: async-signal-safe calls on integers and on-stack structs only.
    unsafe {
        close_all();
        if libc::getppid() != daemon {
            // The daemon died before this exec'd: its death went unseen by the loop below.
            libc::kill(init, libc::SIGKILL);
        }
        let pidfd = libc::syscall(libc::SYS_pidfd_open, init, 0) as libc::c_int;
        loop {
            // R's exit wakes the poll at once; without a pidfd (supported() found pidfd_open,
            // so only out of descriptors) the poll is a plain wait of PARENT_POLL_MS.
            let mut p = libc::pollfd { fd: pidfd, events: libc::POLLIN, revents: 0 };
            libc::poll(&mut p, libc::nfds_t::from(pidfd >= 0), PARENT_POLL_MS);
            let mut status = 0;
            let r = libc::waitpid(init, &mut status, libc::WNOHANG);
            if r == init {
                libc::_exit(exit_code(status));
            }
            if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                libc::_exit(127);
            }
            if libc::getppid() != daemon {
                libc::kill(init, libc::SIGKILL);
            }
        }
    }
}

/// R: reaps every process of the namespace; exits as P did.
///
/// # Safety
/// In R: between fork and exec, or after its exec as `nbos-kernel-init`.
unsafe fn reap(kernel: libc::pid_t) -> ! {
    // SAFETY: async-signal-safe calls on integers only.
    unsafe {
        close_all();
        loop {
            let mut status = 0;
            let r = libc::waitpid(-1, &mut status, 0);
            if r == kernel {
                libc::_exit(exit_code(status));
            }
            if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                libc::_exit(127);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{digits, parse_pid};

    #[test]
    fn pids_are_written_and_parsed_without_allocating() {
        for n in [0, 7, 42, 4_194_304, libc::pid_t::MAX] {
            let mut buf = [0u8; 12];
            // SAFETY: digits returns a pointer into `buf`, NUL-terminated, alive here.
            let s = unsafe { std::ffi::CStr::from_ptr(digits(n, &mut buf)) };
            assert_eq!(s.to_str().ok(), Some(n.to_string().as_str()));
        }
        assert_eq!(parse_pid(b"4242"), Some(4242));
        assert_eq!(parse_pid(b""), None);
        assert_eq!(parse_pid(b"12a"), None);
        assert_eq!(parse_pid(b"99999999999"), None);
    }
}
