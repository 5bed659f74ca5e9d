//! A memory cgroup per kernel, so `kernel.memory_limit_mib` bounds the kernel's whole
//! process tree (RLIMIT_AS bounds each process alone).
//!
//! Backends (youki style, one trait): cgroup v2 (`memory.max` in a child of the daemon's
//! own cgroup), cgroup v1 (`memory.limit_in_bytes` under the memory hierarchy), or none.
//! The filesystem root is injectable so the backends are unit-tested against a temp dir.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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

/// Per-kernel memory cgroups.
pub trait MemoryCgroup: Send + Sync {
    /// `v2`, `v1` or `none`.
    fn backend(&self) -> &'static str;
    /// Creates the kernel's cgroup (if missing) and writes the limit.
    fn create(&self, kernel_id: &str, limit_bytes: u64) -> Result<(), CgroupError>;
    /// Moves a process (and so its future children) into the kernel's cgroup.
    fn add_process(&self, kernel_id: &str, pid: u32) -> Result<(), CgroupError>;
    /// Kills what is left in the kernel's cgroup and removes it; no-op when absent.
    fn remove(&self, kernel_id: &str) -> Result<(), CgroupError>;
    /// The kernel's cgroup directory (None for the `none` backend).
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
    limit_file: &'static str,
    backend: &'static str,
}

impl Hierarchy {
    /// cgroup v1: kernels under `<memory mount>/notebookos/<id>`.
    pub fn v1(memory_mount: &Path) -> Self {
        Self { base: memory_mount.join("notebookos"), limit_file: "memory.limit_in_bytes", backend: "v1" }
    }

    /// cgroup v2: kernels under `<parent>/<id>`, `parent` having `+memory` in its subtree_control.
    pub fn v2(parent: &Path) -> Self {
        Self { base: parent.to_owned(), limit_file: "memory.max", backend: "v2" }
    }
}

impl MemoryCgroup for Hierarchy {
    fn backend(&self) -> &'static str {
        self.backend
    }

    fn create(&self, kernel_id: &str, limit_bytes: u64) -> Result<(), CgroupError> {
        check_id(kernel_id)?;
        let dir = self.base.join(kernel_id);
        std::fs::create_dir_all(&dir).map_err(io("creating cgroup", &dir))?;
        let limit = dir.join(self.limit_file);
        std::fs::write(&limit, limit_bytes.to_string()).map_err(io("writing memory limit to", &limit))
    }

    fn add_process(&self, kernel_id: &str, pid: u32) -> Result<(), CgroupError> {
        check_id(kernel_id)?;
        let procs = self.base.join(kernel_id).join("cgroup.procs");
        std::fs::write(&procs, pid.to_string()).map_err(io("adding a process to", &procs))
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
            for pid in text.lines().filter_map(|l| l.trim().parse::<libc::pid_t>().ok()) {
                // SAFETY: kill(2) only reads its integer arguments; the pid is a member of
                // the kernel's own cgroup, which only the kernel's processes join.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            match std::fs::remove_dir(&dir) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    if Instant::now() >= deadline {
                        return Err(CgroupError::Busy(dir));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(io("removing cgroup", &dir)(e)),
            }
        }
    }

    fn dir(&self, kernel_id: &str) -> Option<PathBuf> {
        Some(self.base.join(kernel_id))
    }
}

/// No memory cgroup available: the limit is RLIMIT_AS alone.
#[derive(Debug, Clone, Copy)]
pub struct NoCgroup;

impl MemoryCgroup for NoCgroup {
    fn backend(&self) -> &'static str {
        "none"
    }
    fn create(&self, _: &str, _: u64) -> Result<(), CgroupError> {
        Ok(())
    }
    fn add_process(&self, _: &str, _: u32) -> Result<(), CgroupError> {
        Ok(())
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
pub fn detect(root: &Path, self_cgroup: &str) -> Box<dyn MemoryCgroup> {
    let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
    if controllers.split_whitespace().any(|c| c == "memory") {
        match setup_v2(root, self_cgroup) {
            Ok(h) => return Box::new(h),
            Err(e) => tracing::warn!(error = %e, "cgroup v2 memory controller not usable; trying v1"),
        }
    }
    let v1 = root.join("memory");
    if v1.join("memory.limit_in_bytes").exists() {
        return Box::new(Hierarchy::v1(&v1));
    }
    Box::new(NoCgroup)
}

/// Enables `+memory` for `<own>/notebookos-kernels`; fails under v2's no-internal-processes
/// rule when the daemon's own cgroup holds processes and is not the root.
fn setup_v2(root: &Path, self_cgroup: &str) -> Result<Hierarchy, CgroupError> {
    let own = self_cgroup.lines().find_map(|l| l.strip_prefix("0::")).unwrap_or("/").trim();
    let own_dir = root.join(own.trim_start_matches('/'));
    let ctl = own_dir.join("cgroup.subtree_control");
    std::fs::write(&ctl, "+memory").map_err(io("enabling +memory in", &ctl))?;
    let parent = own_dir.join("notebookos-kernels");
    std::fs::create_dir_all(&parent).map_err(io("creating cgroup", &parent))?;
    let ctl = parent.join("cgroup.subtree_control");
    std::fs::write(&ctl, "+memory").map_err(io("enabling +memory in", &ctl))?;
    Ok(Hierarchy::v2(&parent))
}

/// The backend of this host, logged once.
pub fn detect_host() -> Box<dyn MemoryCgroup> {
    let self_cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let cg = detect(Path::new("/sys/fs/cgroup"), &self_cgroup);
    if cg.backend() == "none" {
        tracing::warn!("no memory cgroup available; kernel.memory_limit_mib bounds each process (RLIMIT_AS) only");
    } else {
        tracing::info!(backend = cg.backend(), "kernel memory cgroup backend");
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
        cg.create("k1", 1 << 20).unwrap();
        let dir = t.path().join("memory/notebookos/k1");
        assert_eq!(cg.dir("k1").unwrap(), dir);
        assert_eq!(std::fs::read_to_string(dir.join("memory.limit_in_bytes")).unwrap(), "1048576");
        cg.add_process("k1", 4242).unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("cgroup.procs")).unwrap(), "4242");
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
        assert_eq!(std::fs::read_to_string(own.join("cgroup.subtree_control")).unwrap(), "+memory");
        let parent = own.join("notebookos-kernels");
        assert_eq!(std::fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap(), "+memory");
        cg.create("k2", 2 << 20).unwrap();
        assert_eq!(std::fs::read_to_string(parent.join("k2/memory.max")).unwrap(), "2097152");
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
    fn bad_ids_and_write_errors_name_the_path() {
        let t = tempfile::tempdir().unwrap();
        let cg = Hierarchy::v1(t.path());
        for bad in ["", "..", "a/b"] {
            assert!(matches!(cg.create(bad, 1), Err(CgroupError::BadId(_))));
        }
        let err = cg.add_process("nokernel", 1).unwrap_err().to_string();
        assert!(err.contains("notebookos/nokernel/cgroup.procs"), "{err}");
    }
}
