//! The pid a process claims on the lease socket and names its counters file by: its pid
//! as the daemon sees it. A kernel in a PID namespace of its own (`kernel.pid_namespace`)
//! is pid 2 there; `/proc/self` of the host's procfs, which its namespace keeps, names its
//! pid in the daemon's namespace.

/// This process's pid in the namespace of the procfs mounted at `/proc` (`getpid()` when
/// that cannot be read).
pub fn own_pid() -> u32 {
    std::fs::read_link("/proc/self").ok().and_then(|p| p.to_str()?.parse().ok()).unwrap_or_else(std::process::id)
}

#[cfg(test)]
mod tests {
    /// Outside a PID namespace of its own, both views agree.
    #[test]
    fn own_pid_is_getpid_in_the_daemons_namespace() {
        assert_eq!(super::own_pid(), std::process::id());
    }
}
