//! Who is on the other end of the lease socket: `SO_PEERCRED`, and whether that
//! process is a kernel process the daemon started, or a descendant of one (forked
//! workers and subprocesses of a cell), found through the parent chain in `/proc`.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

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
    fn peer_cred_of_a_socket_pair_is_this_process() {
        let (a, _b) = UnixStream::pair().expect("pair");
        let c = peer_cred(&a).expect("cred");
        assert_eq!(c.pid, std::process::id());
        // SAFETY: getuid cannot fail.
        assert_eq!(c.uid, unsafe { libc::getuid() });
    }
}
