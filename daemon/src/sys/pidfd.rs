//! Process descriptors (pidfds): a pidfd refers to one process until it is reaped, and
//! never to a later process that gets the same pid. Taken by `pidfd_open`, or from a unix
//! socket's peer (`SO_PEERPIDFD`); signals go through them (`pidfd_send_signal`).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use super::signals::Signal;

/// `SO_PEERPIDFD` (Linux 6.5): a pidfd of the process that connected, taken at connect time.
const SO_PEERPIDFD: libc::c_int = 77;

/// A pidfd of process `pid` (`pidfd_open`): it refers to that process until it is reaped,
/// and never to a later process that gets the same pid.
pub fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| std::io::Error::other("pid out of range"))?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd (or -1).
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = libc::c_int::try_from(fd).map_err(|_| std::io::Error::other("pidfd out of range"))?;
    // SAFETY: a fresh fd from the kernel, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A pidfd of the socket's peer: `SO_PEERPIDFD` where the kernel has it (the very process
/// that connected), else `pidfd_open(pid)` of its `SO_PEERCRED` pid (the caller checks it
/// to be alive after its `/proc` reads, see [`is_alive`]).
pub fn peer_pidfd(s: &UnixStream, pid: u32) -> std::io::Result<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: SO_PEERPIDFD writes one int (a new fd we then own) into `fd`; the socket fd is
    // borrowed from a live stream.
    let rc = unsafe { libc::getsockopt(s.as_raw_fd(), libc::SOL_SOCKET, SO_PEERPIDFD, (&raw mut fd).cast(), &mut len) };
    if rc == 0 && fd >= 0 {
        // SAFETY: the kernel just created this fd for us; nothing else owns it.
        return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    pidfd_open(pid)
}

/// Whether the process of `pidfd` is still running (so its pid still names it).
pub fn is_alive(pidfd: &OwnedFd) -> bool {
    // SAFETY: signal 0 checks existence only; the pidfd is borrowed and alive.
    let rc = unsafe {
        libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), 0, std::ptr::null::<libc::siginfo_t>(), 0)
    };
    rc == 0
}

/// Sends `sig` through `pidfd`; a process that is gone is no error.
pub fn signal(pidfd: &OwnedFd, sig: Signal) -> std::io::Result<()> {
    // SAFETY: pidfd_send_signal(2) with a pidfd we own, a signal number and no siginfo.
    let rc = unsafe { libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), sig, std::ptr::null::<u8>(), 0) };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ESRCH) {
            return Err(err);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pidfds_pin_the_peer_and_see_a_registered_process_exit() {
        let (a, _b) = UnixStream::pair().expect("pair");
        // A socket pair's peer is this process: SO_PEERPIDFD (or the pid fallback) pins it.
        assert!(is_alive(&peer_pidfd(&a, std::process::id()).expect("peer pidfd")));
        let mut child = std::process::Command::new("sleep").arg("5").spawn().expect("spawn sleep");
        let fd = pidfd_open(child.id()).expect("pidfd");
        assert!(is_alive(&fd));
        let _ = child.kill();
        let _ = child.wait();
        assert!(!is_alive(&fd), "a reaped process's pidfd says it is gone, whatever its pid names now");
    }
}
