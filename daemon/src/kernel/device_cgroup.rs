//! A cgroup v2 per kernel with the GPU device guard attached (`gpu.device_guard = "ebpf"`):
//! the kernel's processes may open `/dev/nvidiaN` only for the GPUs the kernel holds a lease
//! on, so a kernel that bypasses the CUDA shim (dlopen of the real driver, raw ioctls) still
//! cannot reach a GPU it was not granted.
//!
//! The cgroup is `<cgroup2>/notebookos/<kernel id>[.<host tag>]` (`<cgroup2>`: `/sys/fs/cgroup/unified` on
//! a hybrid host, `/sys/fs/cgroup` on a pure v2 one), or the kernel's v2 memory cgroup when
//! there is one (a process is in one v2 cgroup only). The kernel process joins it before it
//! execs (its `cgroup.procs` goes into [`super::process::LaunchSpec::cgroup_procs`]). The
//! lease server reports every change of a kernel's held GPUs ([`DeviceCgroups::set_gpus`]),
//! before a grant reaches the shim and after a release.
//!
//! The BPF side is behind [`GuardBackend`] (the real one is [`nbos_ebpf::DeviceGuard`]) so the
//! bookkeeping is unit-tested without privileges.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use nbos_ebpf::{CgroupId, DeviceGuard, DeviceGuardError};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::gpu::GpuInfo;
use crate::sys::signals;

/// How long removing a cgroup waits for the processes killed in it to be gone.
const REMOVE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Most kernel cgroups the guard's map holds (more kernels than a host runs).
pub const MAX_KERNEL_CGROUPS: u32 = 4096;

/// The BPF operations the device guard needs (the seam tests replace).
pub trait GuardBackend: Send {
    /// Attaches to the cgroup directory, no GPU minor allowed yet.
    fn attach(&mut self, dir: &Path) -> Result<CgroupId, DeviceGuardError>;
    /// Sets the GPU minors the cgroup's processes may open.
    fn allow(&mut self, cgroup: CgroupId, minors: &[u32]) -> Result<(), DeviceGuardError>;
    /// Detaches from the cgroup.
    fn detach(&mut self, cgroup: CgroupId) -> Result<(), DeviceGuardError>;
    /// Accesses refused since load.
    fn denials(&self) -> Result<u64, DeviceGuardError>;
}

impl GuardBackend for DeviceGuard {
    fn attach(&mut self, dir: &Path) -> Result<CgroupId, DeviceGuardError> {
        DeviceGuard::attach(self, dir)
    }
    fn allow(&mut self, cgroup: CgroupId, minors: &[u32]) -> Result<(), DeviceGuardError> {
        DeviceGuard::allow(self, cgroup, minors)
    }
    fn detach(&mut self, cgroup: CgroupId) -> Result<(), DeviceGuardError> {
        DeviceGuard::detach(self, cgroup)
    }
    fn denials(&self) -> Result<u64, DeviceGuardError> {
        DeviceGuard::denials(self)
    }
}

/// Labels of `notebookos_gpu_device_guard_updates_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct UpdateLabels {
    /// `grant` (GPUs added), `release` (GPUs removed), `failed` (the map update failed).
    pub change: String,
}

/// The device guard's metrics.
#[derive(Clone, Default)]
pub struct DeviceGuardMetrics {
    /// `notebookos_gpu_device_guard_updates_total{change}`.
    pub updates: Family<UpdateLabels, Counter>,
    /// `notebookos_gpu_device_guard_cgroups`: kernel cgroups the program is attached to.
    pub cgroups: Gauge,
    /// `notebookos_gpu_device_guard_denials_total`, read from the program's counter at scrape.
    pub denials: Counter,
}

impl DeviceGuardMetrics {
    /// Registers the metrics.
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "notebookos_gpu_device_guard_updates",
            "Changes of a kernel's allowed GPU device minors (grant, release) and failed ones",
            self.updates.clone(),
        );
        registry.register(
            "notebookos_gpu_device_guard_cgroups",
            "Kernel cgroups the GPU device guard is attached to",
            self.cgroups.clone(),
        );
        registry.register(
            "notebookos_gpu_device_guard_denials",
            "Opens of NVIDIA GPU device files refused to kernel processes (no lease on that GPU)",
            self.denials.clone(),
        );
    }
}

/// Why a kernel's device cgroup could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum DeviceCgroupError {
    /// Creating the cgroup directory failed.
    #[error("creating cgroup {path}: {source}")]
    Create {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The BPF side failed.
    #[error(transparent)]
    Guard(#[from] DeviceGuardError),
}

struct KernelCgroup {
    dir: PathBuf,
    id: CgroupId,
    /// The directory is ours to remove (false: the kernel's memory cgroup, removed by its owner).
    owned: bool,
    /// GPU indices allowed now.
    gpus: Vec<usize>,
}

/// The kernels' device cgroups and the guard attached to them.
pub struct DeviceCgroups {
    backend: Mutex<Box<dyn GuardBackend>>,
    kernels: Mutex<HashMap<String, KernelCgroup>>,
    /// `<cgroup2>/notebookos`.
    base: PathBuf,
    /// Suffix naming this host's cgroups (`<id>.<tag>`): several hosts on one machine share
    /// `base`, and a daemon removes only its own predecessor's leftovers ([`super::orphans`]).
    tag: OnceLock<String>,
    /// Device minor of each GPU index of the host.
    minors: Vec<u32>,
    metrics: DeviceGuardMetrics,
}

impl std::fmt::Debug for DeviceCgroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceCgroups").field("base", &self.base).field("minors", &self.minors).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The cgroup v2 mount under `root` (normally `/sys/fs/cgroup`): `unified/` on a hybrid host,
/// `root` itself on a pure v2 one.
pub fn cgroup2_mount(root: &Path) -> Option<PathBuf> {
    let is_v2 = |p: &Path| p.join("cgroup.subtree_control").exists() && p.join("cgroup.procs").exists();
    [root.to_owned(), root.join("unified")].into_iter().find(|p| is_v2(p))
}

/// Device minor of each GPU, by index: from `/proc/driver/nvidia/gpus/*/information`
/// ("Device Minor", matched by UUID) where the NVIDIA driver has it, else the index (the
/// driver's order, and what the fake-cuda TEST DOUBLE's simulated GPUs are numbered by).
pub fn gpu_minors(gpus: &[GpuInfo], proc_nvidia_gpus: &Path) -> Vec<u32> {
    let mut by_uuid: HashMap<String, u32> = HashMap::new();
    if let Ok(entries) = std::fs::read_dir(proc_nvidia_gpus) {
        for e in entries.flatten() {
            if let Ok(text) = std::fs::read_to_string(e.path().join("information")) {
                if let Some((uuid, minor)) = parse_information(&text) {
                    by_uuid.insert(uuid, minor);
                }
            }
        }
    }
    gpus.iter().map(|g| by_uuid.get(&g.uuid.to_ascii_lowercase()).copied().unwrap_or(g.index)).collect()
}

/// `(GPU UUID lower-cased, Device Minor)` from a `/proc/driver/nvidia/gpus/*/information` text.
fn parse_information(text: &str) -> Option<(String, u32)> {
    let field = |name: &str| {
        text.lines().find_map(|l| l.split_once(':').filter(|(k, _)| k.trim() == name).map(|(_, v)| v.trim()))
    };
    Some((field("GPU UUID")?.to_ascii_lowercase(), field("Device Minor")?.parse().ok()?))
}

impl DeviceCgroups {
    /// Loads the BPF program; kernels' cgroups go under `<cgroup2>/notebookos`.
    pub fn load(cgroup2: &Path, minors: Vec<u32>, metrics: DeviceGuardMetrics) -> Result<Self, DeviceGuardError> {
        let guard = DeviceGuard::load(MAX_KERNEL_CGROUPS)?;
        Ok(Self::with_backend(Box::new(guard), cgroup2, minors, metrics))
    }

    /// With any backend (tests).
    pub fn with_backend(
        backend: Box<dyn GuardBackend>,
        cgroup2: &Path,
        minors: Vec<u32>,
        metrics: DeviceGuardMetrics,
    ) -> Self {
        Self {
            backend: Mutex::new(backend),
            kernels: Mutex::new(HashMap::new()),
            base: cgroup2.join("notebookos"),
            tag: OnceLock::new(),
            minors,
            metrics,
        }
    }

    /// Creates kernel `id`'s cgroup (or takes `shared`, its v2 memory cgroup) and attaches the
    /// guard, no GPU allowed; returns the `cgroup.procs` file the kernel process joins.
    /// Called again for a restarted kernel process, it keeps what is there.
    pub fn prepare(&self, id: &str, shared: Option<&Path>) -> Result<PathBuf, DeviceCgroupError> {
        let mut kernels = lock(&self.kernels);
        if let Some(k) = kernels.get(id) {
            if k.dir.exists() {
                return Ok(k.dir.join("cgroup.procs"));
            }
        }
        let (dir, owned) = match shared {
            Some(d) => (d.to_owned(), false),
            None => (self.base.join(self.dir_name(id)), true),
        };
        std::fs::create_dir_all(&dir).map_err(|source| DeviceCgroupError::Create { path: dir.clone(), source })?;
        let attached = lock(&self.backend).attach(&dir);
        let cgroup = match attached {
            Ok(c) => c,
            Err(e) => {
                if owned {
                    let _ = std::fs::remove_dir(&dir);
                }
                return Err(e.into());
            }
        };
        let procs = dir.join("cgroup.procs");
        kernels.insert(id.to_owned(), KernelCgroup { dir, id: cgroup, owned, gpus: Vec::new() });
        self.metrics.cgroups.set(i64::try_from(kernels.len()).unwrap_or(i64::MAX));
        tracing::debug!(kernel = %id, cgroup = %procs.display(), "GPU device guard attached");
        Ok(procs)
    }

    /// Names this host's kernel cgroups made from now on `<kernel id>.<tag>` (the tag of
    /// [`super::registry::host_tag`]), as the kernels' memory and pids cgroups are. Set
    /// once, before the first kernel; a second call changes nothing.
    pub fn set_tag(&self, tag: String) {
        if self.tag.set(tag).is_err() {
            tracing::warn!("the device cgroups' host tag is already set; keeping the first");
        }
    }

    fn dir_name(&self, id: &str) -> String {
        match self.tag.get() {
            Some(tag) => format!("{id}.{tag}"),
            None => id.to_owned(),
        }
    }

    /// Kernel `id` now holds GPUs `gpus` (host indices; empty: none). A kernel without a
    /// device cgroup (not hosted here, or already gone) is ignored.
    pub fn set_gpus(&self, id: &str, gpus: &[usize]) {
        let mut kernels = lock(&self.kernels);
        let Some(k) = kernels.get_mut(id) else { return };
        let mut wanted: Vec<usize> = gpus.to_vec();
        wanted.sort_unstable();
        wanted.dedup();
        if wanted == k.gpus {
            return;
        }
        let minors: Vec<u32> = wanted.iter().filter_map(|g| self.minors.get(*g).copied()).collect();
        let change = if wanted.iter().any(|g| !k.gpus.contains(g)) { "grant" } else { "release" };
        match lock(&self.backend).allow(k.id, &minors) {
            Ok(()) => {
                tracing::debug!(kernel = %id, gpus = ?wanted, minors = ?minors, "GPU device guard updated");
                k.gpus = wanted;
                self.metrics.updates.get_or_create(&UpdateLabels { change: change.into() }).inc();
            }
            Err(e) => {
                // A grant not applied leaves the GPU closed to the kernel (its calls fail);
                // a release not applied leaves it open: both logged loudly, both counted.
                tracing::error!(kernel = %id, gpus = ?wanted, error = %e, "GPU device guard update failed");
                self.metrics.updates.get_or_create(&UpdateLabels { change: "failed".into() }).inc();
            }
        }
    }

    /// GPU indices kernel `id` may open now (`None`: no device cgroup).
    pub fn gpus_of(&self, id: &str) -> Option<Vec<usize>> {
        lock(&self.kernels).get(id).map(|k| k.gpus.clone())
    }

    /// The `cgroup.procs` of kernel `id`'s device cgroup, if it has one.
    pub fn procs_file(&self, id: &str) -> Option<PathBuf> {
        lock(&self.kernels).get(id).map(|k| k.dir.join("cgroup.procs"))
    }

    /// Detaches the guard from kernel `id`'s cgroup and removes the cgroup (killing what is
    /// left in it) when it is ours. No-op for an unknown kernel.
    pub fn remove(&self, id: &str) {
        let Some(k) = lock(&self.kernels).remove(id) else { return };
        self.metrics.cgroups.set(i64::try_from(lock(&self.kernels).len()).unwrap_or(i64::MAX));
        if let Err(e) = lock(&self.backend).detach(k.id) {
            tracing::warn!(kernel = %id, error = %e, "could not detach the GPU device guard");
        }
        if k.owned {
            if let Err(e) = remove_cgroup_dir(&k.dir) {
                tracing::warn!(kernel = %id, cgroup = %k.dir.display(), error = %e, "could not remove the kernel's device cgroup");
            }
        }
    }

    /// Copies the program's denial counter into the metric (before a scrape).
    pub fn refresh_metrics(&self) {
        match lock(&self.backend).denials() {
            Ok(n) => {
                let seen = self.metrics.denials.get();
                if n > seen {
                    self.metrics.denials.inc_by(n - seen);
                }
            }
            Err(e) => tracing::debug!(error = %e, "cannot read the GPU device guard's denial counter"),
        }
    }

    /// The metrics.
    pub fn metrics(&self) -> &DeviceGuardMetrics {
        &self.metrics
    }
}

/// Kills what is left in the cgroup `dir` (whatever the kernel forked and left behind keeps
/// it busy) and removes it; absent is fine.
pub(crate) fn remove_cgroup_dir(dir: &Path) -> std::io::Result<()> {
    let deadline = std::time::Instant::now() + REMOVE_WAIT;
    loop {
        let procs = match std::fs::read_to_string(dir.join("cgroup.procs")) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        for pid in procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
            // The pid is a member of the kernel's own cgroup, which only the kernel's
            // processes join.
            let _ = signals::kill(pid, signals::SIGKILL);
        }
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::ResourceBusy && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => return Err(e),
        }
    }
}

/// The device cgroup of every kernel, shared by the registry and the lease server's hook.
pub type SharedDeviceCgroups = Arc<DeviceCgroups>;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Recorded {
        allowed: HashMap<u64, Vec<u32>>,
        detached: Vec<u64>,
        fail_allow: bool,
    }

    struct FakeGuard(Arc<Mutex<Recorded>>);

    impl GuardBackend for FakeGuard {
        fn attach(&mut self, dir: &Path) -> Result<CgroupId, DeviceGuardError> {
            let id = nbos_ebpf::cgroup_id(dir)?;
            lock(&self.0).allowed.insert(id.0, Vec::new());
            Ok(id)
        }
        fn allow(&mut self, cgroup: CgroupId, minors: &[u32]) -> Result<(), DeviceGuardError> {
            let mut r = lock(&self.0);
            if r.fail_allow {
                return Err(DeviceGuardError::Map { map: "gpu_minors", reason: "injected".into() });
            }
            r.allowed.insert(cgroup.0, minors.to_vec());
            Ok(())
        }
        fn detach(&mut self, cgroup: CgroupId) -> Result<(), DeviceGuardError> {
            lock(&self.0).detached.push(cgroup.0);
            Ok(())
        }
        fn denials(&self) -> Result<u64, DeviceGuardError> {
            Ok(7)
        }
    }

    const KERNEL: &str = "6f0c1a52-3b8e-4c1e-9d7a-0a1b2c3d4e5f";

    fn setup(minors: Vec<u32>) -> (tempfile::TempDir, DeviceCgroups, Arc<Mutex<Recorded>>) {
        let root = tempfile::tempdir().expect("tmp");
        let rec = Arc::new(Mutex::new(Recorded::default()));
        let dc = DeviceCgroups::with_backend(
            Box::new(FakeGuard(rec.clone())),
            root.path(),
            minors,
            DeviceGuardMetrics::default(),
        );
        (root, dc, rec)
    }

    #[test]
    fn a_kernels_allowed_minors_follow_its_leases_through_the_gpu_minor_table() {
        let (root, dc, rec) = setup(vec![4, 2]);
        let procs = dc.prepare(KERNEL, None).expect("prepare");
        assert_eq!(procs, root.path().join("notebookos").join(KERNEL).join("cgroup.procs"));
        let id = nbos_ebpf::cgroup_id(procs.parent().expect("dir")).expect("id").0;
        assert_eq!(lock(&rec).allowed.get(&id), Some(&Vec::new()), "attached with nothing allowed");
        dc.set_gpus(KERNEL, &[1]);
        assert_eq!(lock(&rec).allowed.get(&id), Some(&vec![2]), "GPU 1 is minor 2");
        dc.set_gpus(KERNEL, &[1, 0]);
        assert_eq!(lock(&rec).allowed.get(&id), Some(&vec![4, 2]));
        dc.set_gpus(KERNEL, &[]);
        assert_eq!(lock(&rec).allowed.get(&id), Some(&Vec::new()));
        let updates = |c: &str| dc.metrics().updates.get_or_create(&UpdateLabels { change: c.into() }).get();
        assert_eq!((updates("grant"), updates("release")), (2, 1));
        // Unchanged sets and unknown kernels change nothing.
        dc.set_gpus(KERNEL, &[]);
        dc.set_gpus("not-hosted", &[0]);
        assert_eq!(updates("release"), 1);
        dc.refresh_metrics();
        assert_eq!(dc.metrics().denials.get(), 7);
        dc.remove(KERNEL);
        assert_eq!(lock(&rec).detached, vec![id]);
        assert_eq!(dc.metrics().cgroups.get(), 0);
        assert!(dc.procs_file(KERNEL).is_none());
    }

    #[test]
    fn a_failed_update_is_counted_and_keeps_the_old_set() {
        let (_root, dc, rec) = setup(vec![0]);
        dc.prepare(KERNEL, None).expect("prepare");
        lock(&rec).fail_allow = true;
        dc.set_gpus(KERNEL, &[0]);
        assert_eq!(dc.gpus_of(KERNEL), Some(Vec::new()));
        assert_eq!(dc.metrics().updates.get_or_create(&UpdateLabels { change: "failed".into() }).get(), 1);
    }

    /// Named with the host's tag, as the memory and pids cgroups are: the next daemon of
    /// this host finds (and removes) what a killed one left, and no other host's.
    #[test]
    fn a_tagged_hosts_device_cgroups_carry_its_tag() {
        let (root, dc, _) = setup(vec![0]);
        dc.set_tag("aaaa".into());
        dc.set_tag("bbbb".into());
        let procs = dc.prepare("k", None).expect("prepare");
        assert_eq!(procs, root.path().join("notebookos/k.aaaa/cgroup.procs"));
        let parents = [root.path().join("notebookos")];
        assert_eq!(
            super::super::orphans::left_over_cgroups(&parents, "aaaa"),
            vec![root.path().join("notebookos/k.aaaa")]
        );
    }

    #[test]
    fn a_shared_memory_cgroup_is_used_and_not_removed() {
        let (root, dc, _rec) = setup(vec![0]);
        let mem = root.path().join("memory-cgroup");
        std::fs::create_dir(&mem).expect("mkdir");
        assert_eq!(dc.prepare(KERNEL, Some(&mem)).expect("prepare"), mem.join("cgroup.procs"));
        dc.remove(KERNEL);
        assert!(mem.is_dir(), "the memory cgroup's owner removes it");
    }

    #[test]
    fn gpu_minors_come_from_the_driver_by_uuid_else_the_index() {
        let t = tempfile::tempdir().expect("tmp");
        let bus = t.path().join("0000:3b:00.0");
        std::fs::create_dir(&bus).expect("mkdir");
        std::fs::write(
            bus.join("information"),
            "Model: \t\t NVIDIA H100\nIRQ:   \t\t 42\nGPU UUID: \t GPU-AAAA0000-0000-0000-0000-000000000001\n\
             Video BIOS: \t ??.??.??.??.??\nDevice Minor: \t 3\n",
        )
        .expect("write");
        let gpu = |index: u32, uuid: &str| GpuInfo {
            index,
            uuid: uuid.into(),
            name: String::new(),
            memory_mib: 0,
            simulated: false,
        };
        let gpus = [gpu(0, "GPU-aaaa0000-0000-0000-0000-000000000001"), gpu(1, "GPU-other")];
        assert_eq!(gpu_minors(&gpus, t.path()), vec![3, 1]);
        assert_eq!(gpu_minors(&gpus, &t.path().join("absent")), vec![0, 1]);
    }

    #[test]
    fn the_cgroup2_mount_is_unified_on_a_hybrid_host() {
        let t = tempfile::tempdir().expect("tmp");
        assert_eq!(cgroup2_mount(t.path()), None);
        let unified = t.path().join("unified");
        std::fs::create_dir(&unified).expect("mkdir");
        for f in ["cgroup.subtree_control", "cgroup.procs"] {
            std::fs::write(unified.join(f), "").expect("write");
        }
        assert_eq!(cgroup2_mount(t.path()), Some(unified));
        for f in ["cgroup.subtree_control", "cgroup.procs"] {
            std::fs::write(t.path().join(f), "").expect("write");
        }
        assert_eq!(cgroup2_mount(t.path()), Some(t.path().to_owned()));
    }
}
