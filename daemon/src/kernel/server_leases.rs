//! [`LeaseControl`] over the host's lease server: what the binder decides reaches
//! the shims inside the kernel processes.
//!
//! The binder (scheduler core) decides when a kernel's cell runs; only then is the
//! cell forwarded to the kernel, whose shim asks the lease server for GPUs on its
//! first gated call. `bind` first hands the binder's GPU indices to the lease server
//! ([`LeaseServer::assign`]), so the grant is exactly those GPUs (waiting while a
//! previous holder still releases them): one source of truth for GPU assignment.

use std::sync::Arc;

use super::binding::LeaseControl;
use crate::lease::{LeaseServer, RegisteredProcess};
use crate::sys::credentials;

/// Lease control backed by the running [`LeaseServer`].
pub struct ServerLeases {
    server: Arc<LeaseServer>,
    /// The daemon's user: kernel processes run as it.
    uid: u32,
}

impl ServerLeases {
    /// Controls leases through `server`.
    pub fn new(server: Arc<LeaseServer>) -> Self {
        Self { server, uid: credentials::uid() }
    }
}

impl LeaseControl for ServerLeases {
    fn register(&self, kernel: &str, pid: u32, gpus: u32) {
        // A root daemon's kernels run as their own account (kernel.user, kernel.uid_range):
        // the shim connects with that uid, not the daemon's.
        let uid = effective_uid_of(pid).unwrap_or(self.uid);
        self.server.register_process(RegisteredProcess { kernel_id: kernel.to_owned(), replica: 0, pid, uid, gpus });
    }

    fn bind(&self, kernel: &str, pids: &[u32], gpus: &[u32]) {
        tracing::debug!(kernel, ?pids, ?gpus, "GPUs committed; the shim's next request is granted them");
        // Sent before the cell is forwarded: the events reach the lease actor in order,
        // so the shim's request (caused by the cell) always sees the assignment.
        self.server.assign(kernel, gpus.iter().map(|&g| g as usize).collect());
    }

    fn revoke(&self, kernel: &str, pids: &[u32], gpus: &[u32], preempted: bool) {
        tracing::debug!(kernel, ?pids, ?gpus, preempted, "revoking the kernel's leases");
        for &pid in pids {
            self.server.revoke(pid);
        }
    }

    fn forget(&self, kernel: &str, pids: &[u32]) {
        tracing::debug!(kernel, ?pids, "kernel processes may no longer lease");
        for &pid in pids {
            self.server.revoke(pid);
            self.server.unregister_process(pid);
        }
        self.server.clear_assignment(kernel);
    }
}

/// The effective uid of process `pid` (what `SO_PEERCRED` reports for its connections),
/// from `/proc/<pid>/status`. Read once the kernel has exec'd as its own account and
/// answered: its pid names it while it runs (in a PID namespace of its own it is reaped by
/// that namespace's init, not the daemon, so one that died just now leaves its pid free).
fn effective_uid_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let ids = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    ids.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_effective_uid_of_this_process_is_read_from_proc() {
        let euid = crate::sys::credentials::euid();
        assert_eq!(super::effective_uid_of(std::process::id()), Some(euid));
        assert_eq!(super::effective_uid_of(u32::MAX), None);
    }
}
