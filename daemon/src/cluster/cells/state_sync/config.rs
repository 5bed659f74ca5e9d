//! [`SyncConfig`]: namespace sync settings (from `[cluster]`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

/// Name prefixes of the manifest directories made under [`SyncConfig::work_dir`]
/// (`manifest::scratch_dir`): an export's and an apply's.
pub(super) const EXPORT_PREFIX: &str = "export-";
pub(super) const APPLY_PREFIX: &str = "apply-";

/// Namespace sync settings (from `[cluster]`).
#[derive(Debug, Clone)]
pub struct SyncConfig {
    /// Payloads up to this size go through the raft log (`cluster.sync_inline_max_bytes`).
    pub inline_max_bytes: u64,
    /// Scratch space for manifest directories (under the state directory).
    pub work_dir: PathBuf,
    /// How long one export or apply may take in the kernel.
    pub kernel_timeout: Duration,
    /// Election records kept per kernel group (the most recent cells'); older ones are
    /// deleted with each cell's commit. A late proposal can only concern a recent cell:
    /// the front-end sends one kernel's cells in order over one connection per host.
    pub elect_history: usize,
}

impl SyncConfig {
    /// Defaults: 1 MiB inline, 10 minutes per export/apply, 256 election records.
    pub fn new(work_dir: PathBuf) -> Self {
        Self { inline_max_bytes: 1 << 20, work_dir, kernel_timeout: Duration::from_secs(600), elect_history: 256 }
    }

    /// Removes the manifest directories a previous run of the daemon left in the work
    /// directory: a daemon killed (or stopped fail-stop) during an export or an apply never
    /// removes its scratch directory, and each holds a cell's payloads, so over months of
    /// restarts they would fill the state disk. Called at start, before any replica runs;
    /// other entries are left alone. Returns how many were removed.
    pub fn remove_leftovers(&self) -> anyhow::Result<usize> {
        let entries = match std::fs::read_dir(&self.work_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e).with_context(|| format!("listing {}", self.work_dir.display())),
        };
        let mut removed = 0;
        for entry in entries {
            let entry = entry.with_context(|| format!("listing {}", self.work_dir.display()))?;
            let name = entry.file_name();
            let ours = name.to_str().is_some_and(|n| n.starts_with(EXPORT_PREFIX) || n.starts_with(APPLY_PREFIX));
            // `file_type` does not follow a symlink: one is removed as a link, never followed.
            let dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if !ours {
                continue;
            }
            let path = entry.path();
            let result = if dir { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
            result.with_context(|| format!("removing {}", path.display()))?;
            removed += 1;
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_killed_daemons_manifest_directories_are_removed_and_nothing_else() {
        let tmp = tempfile::tempdir().expect("tmp");
        let cfg = SyncConfig::new(tmp.path().join("sync"));
        assert_eq!(cfg.remove_leftovers().expect("no work directory yet"), 0);
        for d in ["export-a1B2c3", "apply-x9Y8z7"] {
            std::fs::create_dir_all(cfg.work_dir.join(d)).expect("dir");
            std::fs::write(cfg.work_dir.join(d).join("payloads.pack"), [0u8; 4096]).expect("pack");
        }
        std::fs::write(cfg.work_dir.join("notes.txt"), b"an operator's file").expect("other");
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).expect("outside");
        std::fs::write(outside.join("keep"), b"x").expect("keep");
        std::os::unix::fs::symlink(&outside, cfg.work_dir.join("export-link")).expect("symlink");

        assert_eq!(cfg.remove_leftovers().expect("remove"), 3);
        let mut left: Vec<String> = std::fs::read_dir(&cfg.work_dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["notes.txt"]);
        assert!(outside.join("keep").exists(), "a symlink is removed, not followed");
    }
}
