//! What the device-guard tests of both crates do as a kernel process would: make a device
//! node with mknod, and open device files from a child that first joins a cgroup.
//! Included by `ebpf/tests/device_guard.rs` and `daemon/tests/device_guard.rs` (`#[path]`).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Makes the char device node `path` (mode 0666) for `major:minor`.
pub fn mknod(path: &Path, major: u32, minor: u32) {
    let c = CString::new(path.as_os_str().as_bytes()).expect("path");
    // SAFETY: mknod reads the NUL-terminated path and integers only.
    let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(major, minor)) };
    assert_eq!(rc, 0, "mknod {}: {}", path.display(), std::io::Error::last_os_error());
}

/// Opens each of `paths` from a child process that first joins the cgroup whose
/// `cgroup.procs` is `procs`; returns 0 for an open that succeeded, else its errno.
pub fn errnos_in_cgroup(procs: &Path, paths: &[&Path]) -> Vec<i32> {
    let procs = CString::new(procs.as_os_str().as_bytes()).expect("procs");
    let paths: Vec<CString> = paths.iter().map(|p| CString::new(p.as_os_str().as_bytes()).expect("path")).collect();
    let mut fds = [0i32; 2];
    // SAFETY: pipe writes two fds into the array we own.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child only makes async-signal-safe calls (open, write, close, _exit) on
    // memory prepared before the fork, then exits without returning into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: see above; every pointer is a live CString or a local array.
        unsafe {
            libc::close(fds[0]);
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
            if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                libc::_exit(2);
            }
            libc::close(fd);
            for p in &paths {
                let fd = libc::open(p.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
                let errno = if fd >= 0 {
                    libc::close(fd);
                    0
                } else {
                    *libc::__errno_location()
                };
                libc::write(fds[1], (&raw const errno).cast(), 4);
            }
            libc::_exit(0);
        }
    }
    // SAFETY: closing our copy of the write end, an fd we own.
    unsafe { libc::close(fds[1]) };
    let mut bytes = Vec::new();
    let mut buf = [0u8; 64];
    loop {
        // SAFETY: read into a local buffer of the given length from our read end.
        let n = unsafe { libc::read(fds[0], buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        bytes.extend_from_slice(&buf[..n as usize]);
    }
    let mut status = 0;
    // SAFETY: waiting for our own child; closing our read end.
    unsafe {
        libc::waitpid(pid, &mut status, 0);
        libc::close(fds[0]);
    }
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child could not join the cgroup: {status}");
    bytes.chunks_exact(4).map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect()
}
