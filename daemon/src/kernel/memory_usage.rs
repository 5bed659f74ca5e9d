//! How much host memory each kernel of this host uses now, for placement (a host reports
//! it in its load record) and the `notebookos_host_memory_replicas_bytes` gauge.
//!
//! A kernel uses the larger of two measures: its memory cgroup's usage (`memory.current`
//! in v2, `memory.usage_in_bytes` in v1: the whole process tree, page cache included, as
//! its limit counts it) and the resident memory of its processes and all their
//! descendants (a notebook's `multiprocessing` workers too). Both are needed: a kernel
//! taken from the pre-warm pool imported Python and its modules before it joined its
//! cgroup, and those pages stay charged where they were (measured here: 12 MiB in the
//! cgroup of a kernel whose tree holds 52 MiB resident); a kernel without a cgroup
//! has only the second.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::registry::Kernels;
use crate::sys::procfs;

/// The memory cgroup's usage, bytes (None when the cgroup or its file is absent).
pub fn cgroup_usage_bytes(dir: &Path) -> Option<u64> {
    ["memory.current", "memory.usage_in_bytes"]
        .iter()
        .find_map(|f| std::fs::read_to_string(dir.join(f)).ok())
        .and_then(|t| t.trim().parse().ok())
}

/// `roots` and every descendant of theirs (`children` lists a process's children), each once.
pub fn process_tree(roots: &[u32], children: impl Fn(u32) -> Vec<u32>) -> BTreeSet<u32> {
    let mut tree = BTreeSet::new();
    let mut stack: Vec<u32> = roots.to_vec();
    while let Some(pid) = stack.pop() {
        if tree.insert(pid) {
            stack.extend(children(pid));
        }
    }
    tree
}

/// One kernel's memory now, bytes: the larger of its cgroup's usage and its process tree's
/// resident memory. Blocking (file reads).
fn measure(cgroup_dir: Option<&Path>, pids: &[u32]) -> u64 {
    let cgroup = cgroup_dir.and_then(cgroup_usage_bytes).unwrap_or(0);
    let resident: u64 = process_tree(pids, procfs::children).into_iter().filter_map(procfs::rss_bytes).sum();
    cgroup.max(resident)
}

impl Kernels {
    /// Host memory each kernel uses now, bytes, by kernel id: the larger of its cgroup's
    /// usage and its process tree's resident memory (0 while it has no process). The
    /// files are read on a blocking thread: the caller is the host's heartbeat loop.
    pub async fn memory_bytes(&self) -> BTreeMap<String, u64> {
        let targets: Vec<(String, Option<PathBuf>, Vec<u32>)> =
            self.all().await.into_iter().map(|k| (k.id.clone(), self.cgroup_dir(&k.id), k.pids())).collect();
        if targets.is_empty() {
            return BTreeMap::new();
        }
        let read = move || {
            targets.into_iter().map(|(id, dir, pids)| (id, measure(dir.as_deref(), &pids))).collect::<BTreeMap<_, _>>()
        };
        tokio::task::spawn_blocking(read).await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "measuring the kernels' memory failed");
            BTreeMap::new()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_is_its_roots_and_all_their_descendants_once() {
        let parents = [(10, 1), (11, 10), (12, 11), (13, 10), (20, 1), (21, 20), (11, 10)];
        let children = |pid: u32| parents.iter().filter(|(_, p)| *p == pid).map(|(c, _)| *c).collect::<Vec<_>>();
        assert_eq!(process_tree(&[10], children), BTreeSet::from([10, 11, 12, 13]));
        assert_eq!(process_tree(&[10, 11], children), BTreeSet::from([10, 11, 12, 13]));
        assert_eq!(process_tree(&[99], children), BTreeSet::from([99]), "a root with no children");
        assert!(process_tree(&[], children).is_empty());
    }

    #[test]
    fn cgroup_usage_reads_v2_then_v1() {
        let t = tempfile::tempdir().expect("tempdir");
        assert_eq!(cgroup_usage_bytes(t.path()), None);
        std::fs::write(t.path().join("memory.usage_in_bytes"), "4096\n").expect("write");
        assert_eq!(cgroup_usage_bytes(t.path()), Some(4096));
        std::fs::write(t.path().join("memory.current"), "123456789\n").expect("write");
        assert_eq!(cgroup_usage_bytes(t.path()), Some(123_456_789));
    }

    #[test]
    fn this_process_has_resident_memory() {
        let me = std::process::id();
        let rss = procfs::rss_bytes(me).expect("this process is alive");
        assert!(rss > 1 << 20, "{rss}");
        let child = std::process::Command::new("sleep").arg("5").spawn().expect("spawn sleep");
        let tree = process_tree(&[me], procfs::children);
        assert!(tree.contains(&me) && tree.contains(&child.id()), "{tree:?} has this process and its child");
        assert!(measure(None, &[me]) >= rss, "the tree holds at least this process");
        let mut child = child;
        let _ = child.kill();
        let _ = child.wait();
    }
}
