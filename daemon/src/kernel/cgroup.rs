//! Cgroups per kernel, so `kernel.memory_limit_mib` bounds the kernel's whole process
//! tree (RLIMIT_AS bounds each process alone) and `kernel.pids_max` its processes.
//!
//! Backends (youki style, one trait): cgroup v2 (`memory.max` and `pids.max` in a child
//! of the daemon's own cgroup), cgroup v1 (`memory.limit_in_bytes` under the memory
//! hierarchy, `pids.max` under the pids hierarchy), or none. The kernel process joins
//! them between fork and exec (`process.rs`), through the `cgroup.procs` files `create` returns.
//! The filesystem root is injectable so the backends are unit-tested against a temp dir.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::sys::signals;

/// A cgroup operation that failed; names the path.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A filesystem operation on a cgroup file or directory failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The cgroup file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A kernel id that cannot name a directory.
    #[error("kernel id {0:?} cannot name a cgroup")]
    BadId(String),
    /// Processes were still in the cgroup after they were killed.
    #[error("cgroup {0} still busy after killing its processes")]
    Busy(PathBuf),
}

/// What a kernel's cgroups bound; `None`: not bounded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Memory of the whole process tree, bytes (v2 `memory.max`, v1 `memory.limit_in_bytes`).
    pub memory_bytes: Option<u64>,
    /// Processes and threads of the tree (`pids.max`): a fork past it fails with EAGAIN.
    pub pids_max: Option<u64>,
}

/// Per-kernel cgroups.
pub trait KernelCgroup: Send + Sync {
    /// `v2`, `v1` or `none`.
    fn backend(&self) -> &'static str;
    /// Creates the kernel's cgroups (if missing) for the limits set and writes them;
    /// returns their `cgroup.procs` files, which the kernel process joins before exec.
    fn create(&self, kernel_id: &str, limits: &Limits) -> Result<Vec<PathBuf>, CgroupError>;
    /// Kills what is left in the kernel's cgroups and removes them; no-op when absent.
    fn remove(&self, kernel_id: &str) -> Result<(), CgroupError>;
    /// The kernel's memory cgroup directory (None when no hierarchy has memory).
    fn dir(&self, kernel_id: &str) -> Option<PathBuf>;
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> CgroupError + 'a {
    move |source| CgroupError::Io { what, path: path.to_owned(), source }
}

fn check_id(id: &str) -> Result<(), CgroupError> {
    let ok = !id.is_empty() && id != "." && id != ".." && !id.contains('/') && !id.contains('\0');
    if ok {
        Ok(())
    } else {
        Err(CgroupError::BadId(id.to_owned()))
    }
}

/// A directory of kernel cgroups in one hierarchy (v1 or v2 differ in file names only).
#[derive(Debug, Clone)]
pub struct Hierarchy {
    base: PathBuf,
    /// The memory limit's file, when this hierarchy has the memory controller.
    memory_file: Option<&'static str>,
    /// `pids.max`, when this hierarchy has the pids controller.
    pids_file: Option<&'static str>,
    backend: &'static str,
}

impl Hierarchy {
    /// cgroup v1 memory: kernels under `<memory mount>/notebookos/<id>`.
    pub fn v1(memory_mount: &Path) -> Self {
        Self {
            base: memory_mount.join("notebookos"),
            memory_file: Some("memory.limit_in_bytes"),
            pids_file: None,
            backend: "v1",
        }
    }

    /// cgroup v1 pids: kernels under `<pids mount>/notebookos/<id>`.
    pub fn v1_pids(pids_mount: &Path) -> Self {
        Self { base: pids_mount.join("notebookos"), memory_file: None, pids_file: Some("pids.max"), backend: "v1" }
    }

    /// cgroup v2: kernels under `<parent>/<id>`, `parent` having `+memory` and `+pids`
    /// (those the host has) in its subtree_control.
    pub fn v2(parent: &Path) -> Self {
        Self { base: parent.to_owned(), memory_file: Some("memory.max"), pids_file: Some("pids.max"), backend: "v2" }
    }

    /// The limits of `limits` this hierarchy enforces, as (file, value).
    fn limit_files(&self, limits: &Limits) -> Vec<(&'static str, u64)> {
        let memory = self.memory_file.zip(limits.memory_bytes);
        let pids = self.pids_file.zip(limits.pids_max);
        memory.into_iter().chain(pids).collect()
    }

    fn create(&self, kernel_id: &str, limits: &Limits) -> Result<Option<PathBuf>, CgroupError> {
        check_id(kernel_id)?;
        let files = self.limit_files(limits);
        if files.is_empty() {
            return Ok(None);
        }
        let dir = self.base.join(kernel_id);
        std::fs::create_dir_all(&dir).map_err(io("creating cgroup", &dir))?;
        for (file, value) in files {
            let limit = dir.join(file);
            std::fs::write(&limit, value.to_string()).map_err(io("writing a limit to", &limit))?;
        }
        Ok(Some(dir.join("cgroup.procs")))
    }

    fn remove(&self, kernel_id: &str) -> Result<(), CgroupError> {
        check_id(kernel_id)?;
        let dir = self.base.join(kernel_id);
        if !dir.exists() {
            return Ok(());
        }
        let procs = dir.join("cgroup.procs");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            // Whatever the kernel forked and left behind would keep the cgroup busy.
            let text = std::fs::read_to_string(&procs).map_err(io("reading", &procs))?;
            for pid in text.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                // The pid is a member of the kernel's own cgroup, which only the kernel's
                // processes join.
                let _ = signals::kill(pid, signals::SIGKILL);
            }
            match std::fs::remove_dir(&dir) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::ResourceBusy => {
                    if Instant::now() >= deadline {
                        return Err(CgroupError::Busy(dir));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(io("removing cgroup", &dir)(e)),
            }
        }
    }
}

/// The kernel cgroups of a host: one v2 hierarchy, or v1's memory and pids hierarchies
/// (either may be missing), or none.
#[derive(Debug, Clone)]
pub struct Hierarchies {
    parts: Vec<Hierarchy>,
}

impl Hierarchies {
    /// Kernel cgroups in `parts`.
    pub fn new(parts: Vec<Hierarchy>) -> Self {
        Self { parts }
    }
}

impl KernelCgroup for Hierarchies {
    fn backend(&self) -> &'static str {
        self.parts.first().map_or("none", |h| h.backend)
    }

    fn create(&self, kernel_id: &str, limits: &Limits) -> Result<Vec<PathBuf>, CgroupError> {
        let mut procs = Vec::new();
        for h in &self.parts {
            procs.extend(h.create(kernel_id, limits)?);
        }
        Ok(procs)
    }

    fn remove(&self, kernel_id: &str) -> Result<(), CgroupError> {
        // Every hierarchy, even after one failed; the first error is reported.
        let mut first = Ok(());
        for h in &self.parts {
            if let Err(e) = h.remove(kernel_id) {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    fn dir(&self, kernel_id: &str) -> Option<PathBuf> {
        self.parts.iter().find(|h| h.memory_file.is_some()).map(|h| h.base.join(kernel_id))
    }
}

/// Names each kernel's cgroups `<kernel id>.<tag>`, the tag naming the host (its kernels
/// directory): several hosts on one machine (tests, the demo) host replicas of the same
/// kernel id, and one host removing its kernel's cgroups, which kills what is in them, must
/// not kill another host's replica.
pub struct Scoped {
    inner: Box<dyn KernelCgroup>,
    tag: String,
}

impl Scoped {
    /// `inner`'s cgroups, named with `tag`.
    pub fn new(inner: Box<dyn KernelCgroup>, tag: String) -> Self {
        Self { inner, tag }
    }

    fn name(&self, kernel_id: &str) -> Result<String, CgroupError> {
        check_id(kernel_id)?;
        Ok(format!("{kernel_id}.{}", self.tag))
    }
}

impl KernelCgroup for Scoped {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn create(&self, kernel_id: &str, limits: &Limits) -> Result<Vec<PathBuf>, CgroupError> {
        self.inner.create(&self.name(kernel_id)?, limits)
    }
    fn remove(&self, kernel_id: &str) -> Result<(), CgroupError> {
        self.inner.remove(&self.name(kernel_id)?)
    }
    fn dir(&self, kernel_id: &str) -> Option<PathBuf> {
        self.inner.dir(&self.name(kernel_id).ok()?)
    }
}

/// No cgroup available: the memory limit is RLIMIT_AS alone, and no pids limit.
#[derive(Debug, Clone, Copy)]
pub struct NoCgroup;

impl KernelCgroup for NoCgroup {
    fn backend(&self) -> &'static str {
        "none"
    }
    fn create(&self, _: &str, _: &Limits) -> Result<Vec<PathBuf>, CgroupError> {
        Ok(Vec::new())
    }
    fn remove(&self, _: &str) -> Result<(), CgroupError> {
        Ok(())
    }
    fn dir(&self, _: &str) -> Option<PathBuf> {
        None
    }
}

/// Picks the backend for the cgroup filesystem at `root` (normally `/sys/fs/cgroup`);
/// `self_cgroup` is the text of `/proc/self/cgroup`.
pub fn detect(root: &Path, self_cgroup: &str) -> Box<dyn KernelCgroup> {
    let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
    let v2: Vec<&str> = controllers.split_whitespace().filter(|c| *c == "memory" || *c == "pids").collect();
    if !v2.is_empty() {
        match setup_v2(root, self_cgroup, &v2) {
            Ok(h) => return Box::new(Hierarchies::new(vec![h])),
            Err(e) => tracing::warn!(error = %e, "cgroup v2 memory/pids controllers not usable; trying v1"),
        }
    }
    let mut parts = Vec::new();
    let memory = root.join("memory");
    if memory.join("memory.limit_in_bytes").exists() {
        parts.push(Hierarchy::v1(&memory));
    }
    let pids = root.join("pids");
    if pids.join("cgroup.procs").exists() {
        parts.push(Hierarchy::v1_pids(&pids));
    }
    if parts.is_empty() {
        Box::new(NoCgroup)
    } else {
        Box::new(Hierarchies::new(parts))
    }
}

/// Enables the `controllers` for `<own>/notebookos-kernels`; fails under v2's
/// no-internal-processes rule when the daemon's own cgroup holds processes and is not the root.
fn setup_v2(root: &Path, self_cgroup: &str, controllers: &[&str]) -> Result<Hierarchy, CgroupError> {
    let own = self_cgroup.lines().find_map(|l| l.strip_prefix("0::")).unwrap_or("/").trim();
    let own_dir = root.join(own.trim_start_matches('/'));
    let parent = own_dir.join("notebookos-kernels");
    for dir in [&own_dir, &parent] {
        if dir == &parent {
            std::fs::create_dir_all(&parent).map_err(io("creating cgroup", &parent))?;
        }
        let ctl = dir.join("cgroup.subtree_control");
        for c in controllers {
            std::fs::write(&ctl, format!("+{c}")).map_err(io("enabling a controller in", &ctl))?;
        }
    }
    Ok(Hierarchy::v2(&parent))
}

/// The backend of this host, logged once.
pub fn detect_host() -> Box<dyn KernelCgroup> {
    let self_cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let cg = detect(Path::new("/sys/fs/cgroup"), &self_cgroup);
    if cg.backend() == "none" {
        tracing::warn!(
            "no cgroup available; kernel.memory_limit_mib bounds nothing unless kernel.limit_address_space (RLIMIT_AS per process), kernel.pids_max nothing"
        );
    } else {
        tracing::info!(backend = cg.backend(), "kernel cgroup backend");
    }
    cg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_writes_limit_and_pid_and_removes() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("memory")).unwrap();
        std::fs::write(t.path().join("memory/memory.limit_in_bytes"), "").unwrap();
        let cg = detect(t.path(), "");
        assert_eq!(cg.backend(), "v1");
        let mem = Limits { memory_bytes: Some(1 << 20), pids_max: None };
        let procs = cg.create("k1", &mem).unwrap();
        let dir = t.path().join("memory/notebookos/k1");
        assert_eq!(procs, vec![dir.join("cgroup.procs")]);
        assert_eq!(cg.dir("k1").unwrap(), dir);
        assert_eq!(std::fs::read_to_string(dir.join("memory.limit_in_bytes")).unwrap(), "1048576");
        // No live pid in the fake procs file (remove() SIGKILLs members).
        std::fs::write(dir.join("cgroup.procs"), "").unwrap();
        // On cgroupfs rmdir ignores the control files; in a temp dir they keep it non-empty,
        // which shows that a failed rmdir names the path.
        let err = cg.remove("k1").unwrap_err().to_string();
        assert!(err.contains("removing cgroup") && err.contains("notebookos/k1"), "{err}");
        std::fs::remove_file(dir.join("memory.limit_in_bytes")).unwrap();
        std::fs::remove_file(dir.join("cgroup.procs")).unwrap();
        // Without cgroup.procs the read fails, naming the file.
        let err = cg.remove("k1").unwrap_err().to_string();
        assert!(err.contains("notebookos/k1/cgroup.procs"), "{err}");
        assert!(cg.remove("missing").is_ok());
    }

    #[test]
    fn v2_enables_memory_and_uses_memory_max() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("cgroup.controllers"), "cpu io memory pids\n").unwrap();
        std::fs::create_dir_all(t.path().join("system.slice/nbos.service")).unwrap();
        let cg = detect(t.path(), "0::/system.slice/nbos.service\n");
        assert_eq!(cg.backend(), "v2");
        let own = t.path().join("system.slice/nbos.service");
        // A plain file keeps the last write; cgroupfs would hold both.
        assert_eq!(std::fs::read_to_string(own.join("cgroup.subtree_control")).unwrap(), "+pids");
        let parent = own.join("notebookos-kernels");
        assert_eq!(std::fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap(), "+pids");
        let procs = cg.create("k2", &Limits { memory_bytes: Some(2 << 20), pids_max: Some(64) }).unwrap();
        assert_eq!(std::fs::read_to_string(parent.join("k2/memory.max")).unwrap(), "2097152");
        assert_eq!(std::fs::read_to_string(parent.join("k2/pids.max")).unwrap(), "64");
        assert_eq!(procs, vec![parent.join("k2/cgroup.procs")], "one cgroup holds both limits");
        assert_eq!(cg.dir("k2").unwrap(), parent.join("k2"));
    }

    #[test]
    fn v2_unusable_falls_back_and_none_when_nothing() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("cgroup.controllers"), "memory\n").unwrap();
        // The own cgroup does not exist: enabling +memory fails, no v1 either.
        assert_eq!(detect(t.path(), "0::/gone\n").backend(), "none");
        assert_eq!(detect(&t.path().join("nothing"), "").backend(), "none");
    }

    #[test]
    fn v1_pids_is_a_hierarchy_of_its_own_and_only_limits_set_make_cgroups() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("memory")).unwrap();
        std::fs::write(t.path().join("memory/memory.limit_in_bytes"), "").unwrap();
        std::fs::create_dir_all(t.path().join("pids")).unwrap();
        std::fs::write(t.path().join("pids/cgroup.procs"), "").unwrap();
        let cg = detect(t.path(), "");
        assert_eq!(cg.backend(), "v1");
        // Only a pids limit: no memory cgroup is made.
        let procs = cg.create("k", &Limits { memory_bytes: None, pids_max: Some(4096) }).unwrap();
        let pids = t.path().join("pids/notebookos/k");
        assert_eq!(procs, vec![pids.join("cgroup.procs")]);
        assert_eq!(std::fs::read_to_string(pids.join("pids.max")).unwrap(), "4096");
        assert!(!t.path().join("memory/notebookos/k").exists());
        // Both: both hierarchies.
        let procs = cg.create("k2", &Limits { memory_bytes: Some(1 << 20), pids_max: Some(8) }).unwrap();
        assert_eq!(procs.len(), 2, "{procs:?}");
        assert!(cg.create("k3", &Limits::default()).unwrap().is_empty(), "no limit, no cgroup");
    }

    #[test]
    fn scoped_cgroups_of_two_hosts_do_not_share_a_kernel_ids_cgroup() {
        let t = tempfile::tempdir().unwrap();
        let host = |tag: &str| Scoped::new(Box::new(Hierarchies::new(vec![Hierarchy::v1_pids(t.path())])), tag.into());
        let (a, b) = (host("aaaa"), host("bbbb"));
        let limits = Limits { memory_bytes: None, pids_max: Some(5) };
        assert_eq!(a.create("k", &limits).unwrap(), vec![t.path().join("notebookos/k.aaaa/cgroup.procs")]);
        assert_eq!(b.create("k", &limits).unwrap(), vec![t.path().join("notebookos/k.bbbb/cgroup.procs")]);
        assert!(matches!(a.create("../x", &limits), Err(CgroupError::BadId(_))));
    }

    #[test]
    fn bad_ids_and_write_errors_name_the_path() {
        let t = tempfile::tempdir().unwrap();
        let cg = Hierarchies::new(vec![Hierarchy::v1(t.path())]);
        let mem = Limits { memory_bytes: Some(1), pids_max: None };
        for bad in ["", "..", "a/b"] {
            assert!(matches!(cg.create(bad, &mem), Err(CgroupError::BadId(_))));
        }
        // The hierarchy's directory is a file: the error names the cgroup.
        std::fs::write(t.path().join("notebookos"), "").unwrap();
        let err = cg.create("k", &mem).unwrap_err().to_string();
        assert!(err.contains("creating cgroup") && err.contains("notebookos/k"), "{err}");
    }
}
