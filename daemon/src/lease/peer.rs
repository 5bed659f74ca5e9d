//! Who is on the other end of the lease socket: `SO_PEERCRED`, and whether that
//! process is a kernel process the daemon started, or a descendant of one (forked
//! workers and subprocesses of a cell), found through the parent chain in `/proc`.
//!
//! Pids are reused, so a pid alone proves nothing: the peer is pinned by a pidfd
//! (`SO_PEERPIDFD`, else `pidfd_open`) while its `/proc` entries are read, and a
//! registered kernel process is held by a pidfd taken at registration, which tells when
//! that very process has exited whatever its pid names now.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// `SO_PEERPIDFD` (Linux 6.5): a pidfd of the process that connected, taken at connect time.
const SO_PEERPIDFD: libc::c_int = 77;

/// Longest parent chain followed (deeper trees are refused, not walked forever).
pub const MAX_ANCESTRY: usize = 64;

/// The peer's credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    /// Process id.
    pub pid: u32,
    /// User id.
    pub uid: u32,
}

/// Reads the peer's credentials from the kernel.
pub fn peer_cred(s: &UnixStream) -> std::io::Result<PeerCred> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes at most `len` bytes into `cred`, which we own; the fd is
    // borrowed from a live stream.
    let rc = unsafe {
        libc::getsockopt(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, (&raw mut cred).cast(), &mut len)
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let pid = u32::try_from(cred.pid).map_err(|_| std::io::Error::other("negative peer pid"))?;
    Ok(PeerCred { pid, uid: cred.uid })
}

/// Parent of `pid` from `/proc/<pid>/stat` (None when the process is gone).
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: parse after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The pid `pid` has in its own (innermost) PID namespace: the last of `NSpid` in
/// `/proc/<pid>/status` (None when the process is gone).
pub fn innermost_pid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("NSpid:"))?.split_whitespace().last()?.parse().ok()
}

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
/// that connected), else `pidfd_open(pid)` of its `SO_PEERCRED` pid (checked to be alive
/// after the `/proc` reads, see [`is_alive`]).
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

/// `pid` itself and its ancestors, nearest first (up to [`MAX_ANCESTRY`]).
pub fn lineage(pid: u32) -> Vec<u32> {
    let mut out = vec![pid];
    let mut cur = pid;
    while out.len() < MAX_ANCESTRY {
        match parent_of(cur) {
            Some(p) if p > 1 && !out.contains(&p) => {
                out.push(p);
                cur = p;
            }
            _ => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lineage_of_a_child_includes_this_process() {
        let mut child = std::process::Command::new("sleep").arg("5").spawn().expect("spawn sleep");
        let l = lineage(child.id());
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(l[0], child.id());
        assert_eq!(l.get(1), Some(&std::process::id()));
    }

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

    #[test]
    fn peer_cred_of_a_socket_pair_is_this_process() {
        let (a, _b) = UnixStream::pair().expect("pair");
        let c = peer_cred(&a).expect("cred");
        assert_eq!(c.pid, std::process::id());
        // SAFETY: getuid cannot fail.
        assert_eq!(c.uid, unsafe { libc::getuid() });
    }
}
