//! Who is on the other end of a unix socket: `SO_PEERCRED`.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_cred_of_a_socket_pair_is_this_process() {
        let (a, _b) = UnixStream::pair().expect("pair");
        let c = peer_cred(&a).expect("cred");
        assert_eq!(c.pid, std::process::id());
        assert_eq!(c.uid, super::super::credentials::uid());
    }
}
