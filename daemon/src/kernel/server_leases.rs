//! [`LeaseControl`] over the host's lease server: what the binder decides reaches
//! the shims inside the kernel processes.
//!
//! The binder (scheduler core) decides when a kernel's cell runs; only then is the
//! cell forwarded to the kernel, whose shim asks the lease server for GPUs on its
//! first gated call. The lease server grants free GPUs; since the binder commits a
//! GPU to at most one cell at a time and revokes idle-held GPUs before committing
//! them to another kernel, the free GPUs the lease server finds are the ones the
//! binder committed. (Pinning the exact indices needs a lease server API that takes
//! them; see the lead's notes.)

use std::sync::Arc;

use super::binding::LeaseControl;
use crate::lease::{KernelProcess, LeaseServer};

/// Lease control backed by the running [`LeaseServer`].
pub struct ServerLeases {
    server: Arc<LeaseServer>,
    /// The daemon's user: kernel processes run as it.
    uid: u32,
}

impl ServerLeases {
    /// Controls leases through `server`.
    pub fn new(server: Arc<LeaseServer>) -> Self {
        // SAFETY: getuid(2) has no arguments and cannot fail.
        let uid = unsafe { libc::getuid() };
        Self { server, uid }
    }
}

impl LeaseControl for ServerLeases {
    fn register(&self, kernel: &str, pid: u32, gpus: u32) {
        self.server.register_process(KernelProcess {
            kernel_id: kernel.to_owned(),
            replica: 0,
            pid,
            uid: self.uid,
            gpus,
        });
    }

    fn bind(&self, kernel: &str, pids: &[u32], gpus: &[u32]) {
        tracing::debug!(kernel, ?pids, ?gpus, "GPUs committed; the shim's next request is granted");
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
    }
}
