//! Socket calls std lacks: shutdown(2) of a listening socket.

use std::os::fd::{AsFd, AsRawFd};

/// Shuts a listening socket down both ways: a thread blocked in accept() on it returns
/// with an error. The descriptor stays open.
pub fn shutdown_listener(listener: &impl AsFd) -> std::io::Result<()> {
    // SAFETY: the fd is borrowed from a live owner; shutdown(2) does not close it.
    if unsafe { libc::shutdown(listener.as_fd().as_raw_fd(), libc::SHUT_RDWR) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
