//! This process's pid as the host sees it, which the daemon tells the shim on registration
//! (`Registered::host_pid`, from the lease socket's peer credentials). A kernel in a PID
//! namespace of its own knows only its pid there (`getpid()` is 2 in the kernel process);
//! the counters file is named by the host's, and a driver underneath that records pids
//! (the fake driver, as the real one does in its kernel module) asks [`nbos_shim_host_pid`].

use std::sync::atomic::{AtomicU64, Ordering};

/// `getpid() << 32 | host pid` of the process that registered: a forked child, which has
/// another `getpid()`, does not take its parent's (it registers itself).
static HOST_PID: AtomicU64 = AtomicU64::new(0);

/// Remembers `host` as this process's host pid.
pub fn set(host: u32) {
    HOST_PID.store(u64::from(std::process::id()) << 32 | u64::from(host), Ordering::Relaxed);
}

/// This process's host pid, once it registered.
pub fn get() -> Option<u32> {
    let v = HOST_PID.load(Ordering::Relaxed);
    ((v >> 32) as u32 == std::process::id() && v != 0).then_some(v as u32)
}

/// This process's pid as the host sees it, 0 while unknown (not registered, or no lease
/// socket: then `getpid()` is the host's). For the driver under the shim.
#[no_mangle]
pub extern "C" fn nbos_shim_host_pid() -> u32 {
    get().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_host_pid_belongs_to_the_process_that_registered() {
        assert_eq!(super::nbos_shim_host_pid(), 0);
        super::set(4242);
        assert_eq!(super::get(), Some(4242));
        assert_eq!(super::nbos_shim_host_pid(), 4242);
        // As a forked child would see it: another getpid().
        super::HOST_PID
            .store(u64::from(std::process::id().wrapping_add(1)) << 32 | 7, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(super::get(), None);
    }
}
