//! The daemon's own user ids (getuid(2), geteuid(2)).

/// The real user id of this process.
pub fn uid() -> u32 {
    // SAFETY: getuid(2) has no arguments and cannot fail.
    unsafe { libc::getuid() }
}

/// The effective user id of this process.
pub fn euid() -> u32 {
    // SAFETY: geteuid(2) has no arguments and cannot fail.
    unsafe { libc::geteuid() }
}
