//! The pre-warm pool's processes out of the kernels' reach: loads `bpf/pool_guard.bpf.c`
//! (BPF LSM programs on `task_kill`, `file_send_sigiotask` and `ptrace_access_check`) and
//! keeps its map of protected pids. A signal, ptrace or ptrace-checked `/proc` access whose
//! target is a protected process is refused with `EPERM` unless it comes from root (real
//! uid 0) or from the process itself.
//!
//! It needs a kernel with the BPF LSM active (`bpf` in `/sys/kernel/security/lsm`, e.g.
//! booted with `lsm=...,bpf`), BTF, and root (CAP_BPF, CAP_SYS_ADMIN).
//!
//! ```no_run
//! let mut guard = nbos_ebpf::PoolGuard::load(256)?;
//! guard.protect(1234)?; // a pool process started
//! guard.release(1234)?; // it became a kernel
//! # Ok::<(), nbos_ebpf::PoolGuardError>(())
//! ```

use aya::maps::{HashMap as BpfHashMap, MapData, MapError, PerCpuArray};
use aya::programs::Lsm;
use aya::{Btf, Ebpf, EbpfLoader};

use crate::error::with_sources;

/// The compiled object, built by `build.rs`.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/pool_guard.bpf.o"));

/// Each program and the LSM hook it runs on.
const PROGRAMS: &[(&str, &str)] = &[
    ("nbos_pool_task_kill", "task_kill"),
    ("nbos_pool_sigiotask", "file_send_sigiotask"),
    ("nbos_pool_ptrace", "ptrace_access_check"),
];
const PROTECTED_MAP: &str = "protected";
const DENIALS_MAP: &str = "denials";

/// A failed pool-guard operation, naming what failed.
#[derive(Debug, thiserror::Error)]
pub enum PoolGuardError {
    /// Loading or attaching failed (no permission, no BTF, the BPF LSM not active).
    #[error("loading the pre-warm pool guard (BPF LSM): {0}")]
    Load(String),
    /// Reading or writing a map failed (e.g. full).
    #[error("pre-warm pool guard map {map}: {reason}")]
    Map {
        /// The map's name.
        map: &'static str,
        /// The error.
        reason: String,
    },
}

/// The loaded and attached programs and their map. Dropping it detaches them.
pub struct PoolGuard {
    // Owns the programs and their links: the hooks run while it lives.
    _bpf: Ebpf,
    protected: BpfHashMap<MapData, u32, u8>,
    denials: PerCpuArray<MapData, u64>,
}

impl std::fmt::Debug for PoolGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolGuard").finish_non_exhaustive()
    }
}

impl PoolGuard {
    /// Loads and attaches the programs; at most `max_pids` processes protected at once.
    pub fn load(max_pids: u32) -> Result<Self, PoolGuardError> {
        if !lsm_active() {
            return Err(PoolGuardError::Load(
                "the BPF LSM is not active on this kernel (\"bpf\" missing from /sys/kernel/security/lsm; boot with \
                 lsm=...,bpf)"
                    .into(),
            ));
        }
        let load = |e: &dyn std::error::Error| PoolGuardError::Load(with_sources(e));
        let btf = Btf::from_sys_fs().map_err(|e| load(&e))?;
        let mut bpf = EbpfLoader::new()
            .btf(Some(&btf))
            .map_max_entries(PROTECTED_MAP, max_pids.max(1))
            .load(OBJECT)
            .map_err(|e| load(&e))?;
        for (name, hook) in PROGRAMS {
            let p = bpf.program_mut(name).ok_or_else(|| PoolGuardError::Load(format!("program {name} missing")))?;
            let p: &mut Lsm = p.try_into().map_err(|e| load(&e))?;
            p.load(hook, &btf).map_err(|e| PoolGuardError::Load(format!("program {name}: {}", with_sources(&e))))?;
            p.attach().map_err(|e| PoolGuardError::Load(format!("attaching {name}: {}", with_sources(&e))))?;
        }
        let protected = BpfHashMap::try_from(take_map(&mut bpf, PROTECTED_MAP)?).map_err(map_err(PROTECTED_MAP))?;
        let denials = PerCpuArray::try_from(take_map(&mut bpf, DENIALS_MAP)?).map_err(map_err(DENIALS_MAP))?;
        Ok(Self { _bpf: bpf, protected, denials })
    }

    /// From now on only root and `pid` itself may signal or trace the process `pid` (a
    /// thread group id).
    pub fn protect(&mut self, pid: u32) -> Result<(), PoolGuardError> {
        self.protected.insert(pid, 1, 0).map_err(map_err(PROTECTED_MAP))
    }

    /// `pid` is no longer protected (absent is fine).
    pub fn release(&mut self, pid: u32) -> Result<(), PoolGuardError> {
        match self.protected.remove(&pid) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(map_err(PROTECTED_MAP)(e)),
        }
    }

    /// Whether `pid` is protected now.
    pub fn protects(&self, pid: u32) -> Result<bool, PoolGuardError> {
        match self.protected.get(&pid, 0) {
            Ok(_) => Ok(true),
            Err(MapError::KeyNotFound) => Ok(false),
            Err(e) => Err(map_err(PROTECTED_MAP)(e)),
        }
    }

    /// Signals and accesses the programs refused since they were loaded.
    pub fn denials(&self) -> Result<u64, PoolGuardError> {
        let per_cpu = self.denials.get(&0, 0).map_err(map_err(DENIALS_MAP))?;
        Ok(per_cpu.iter().copied().fold(0u64, u64::saturating_add))
    }
}

/// Whether the running kernel has the BPF LSM among its active LSMs (securityfs's list; when
/// securityfs is not mounted, loading is tried and the kernel answers).
fn lsm_active() -> bool {
    match std::fs::read_to_string("/sys/kernel/security/lsm") {
        Ok(list) => list.trim().split(',').any(|l| l == "bpf"),
        Err(_) => true,
    }
}

fn take_map(bpf: &mut Ebpf, name: &'static str) -> Result<aya::maps::Map, PoolGuardError> {
    bpf.take_map(name).ok_or(PoolGuardError::Map { map: name, reason: "missing from the object".into() })
}

fn map_err(map: &'static str) -> impl Fn(MapError) -> PoolGuardError {
    move |e| PoolGuardError::Map { map, reason: e.to_string() }
}
