//! Pool processes out of the kernels' reach: a BPF LSM program ([`nbos_ebpf::PoolGuard`],
//! `ebpf/bpf/pool_guard.bpf.c`) refuses signals, ptrace and `/proc` access to the pids the
//! daemon protects, unless they come from root or the process itself. Kernels share the
//! pool's account (`kernel.user`); what keeps them from SIGSTOPping a pool process is first
//! the PID namespace each kernel runs in ([`crate::kernel::pid_namespace`]), then this guard
//! where it loads. When neither holds (not root, a kernel without the BPF LSM) the
//! hand-over check ([`super::check`]) keeps a poisoned process from becoming a kernel.

use std::sync::Mutex;

/// What the pool asks of the guard; the real one is the BPF program, tests use a fake.
pub trait Guard: Send + Sync {
    /// From now on, only root and `pid` itself may signal or trace `pid`.
    fn protect(&self, pid: u32) -> anyhow::Result<()>;
    /// `pid` is a kernel now (or gone): as any process of its account again.
    fn release(&self, pid: u32) -> anyhow::Result<()>;
}

/// The BPF LSM program, behind a lock (its map handle needs `&mut`).
pub struct LsmGuard(Mutex<nbos_ebpf::PoolGuard>);

impl LsmGuard {
    /// Loads and attaches the program; `None` (logged once) when this host cannot run it.
    pub fn load(max_pids: u32) -> Option<Self> {
        match nbos_ebpf::PoolGuard::load(max_pids) {
            Ok(g) => {
                tracing::info!("pre-warm pool guard (BPF LSM) loaded: kernels cannot signal or trace pool processes");
                Some(Self(Mutex::new(g)))
            }
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "pre-warm pool guard (BPF LSM) not loaded: kernels of the shared kernel.user can signal pool \
                     processes; a stopped or unresponsive one is rejected at hand-over and the kernel starts a new \
                     Python (it needs root and a kernel that loads BPF LSM programs: \"bpf\" in its LSM list, BPF \
                     trampolines; docs/prewarm.md)"
                );
                None
            }
        }
    }
}

impl Guard for LsmGuard {
    fn protect(&self, pid: u32) -> anyhow::Result<()> {
        let mut g = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        g.protect(pid).map_err(anyhow::Error::new)
    }

    fn release(&self, pid: u32) -> anyhow::Result<()> {
        let mut g = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        g.release(pid).map_err(anyhow::Error::new)
    }
}
