//! The manifest directory `nbos_kernel.sync` exports a cell into and applies a cell from:
//! `manifest.json` (what was set, deleted, or could not be pickled) and the payload files
//! it names, checked before they are read.

use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::config::SyncConfig;
use crate::kernel::LocalKernel;

/// One object in a manifest (`nbos_kernel.sync`'s format).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// Global name.
    pub name: String,
    /// `pickle` or `module`.
    pub kind: String,
    /// Payload file in the manifest directory.
    pub file: String,
    /// Where the payload starts in `file` (a pack of many payloads); absent: the whole file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// Payload size in bytes.
    pub size: u64,
    /// Payload sha256 (hex).
    pub sha256: String,
}

/// A name that could not be exported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unpicklable {
    /// Global name.
    pub name: String,
    /// Why.
    pub error: String,
}

/// `manifest.json` of an export or an apply.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Format version (1).
    pub version: u32,
    /// The shell's execution count after the cell.
    pub execution_count: u64,
    /// Objects set (new, rebound or mutated).
    pub set: Vec<ManifestEntry>,
    /// Names deleted.
    pub deleted: Vec<String>,
    /// Names that could not be exported (executor side only).
    #[serde(default)]
    pub unpicklable: Vec<Unpicklable>,
}

/// Refuses a name that cannot be a global of the kernel (or a key of the group).
pub(super) fn check_name(name: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        !name.is_empty() && name.len() <= 256 && !name.contains(['/', '\0']),
        "invalid namespace name {name:?} in the manifest"
    );
    Ok(())
}

/// Refuses a payload file that is not a plain file name inside the manifest directory.
pub(super) fn check_file(file: &str) -> anyhow::Result<()> {
    let p = Path::new(file);
    anyhow::ensure!(
        p.components().count() == 1 && matches!(p.components().next(), Some(std::path::Component::Normal(_))),
        "manifest payload file {file:?} is not a plain file name"
    );
    Ok(())
}

/// A fresh manifest directory under the sync work directory (removed when dropped).
pub(super) fn scratch_dir(cfg: &SyncConfig, what: &str) -> anyhow::Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(&cfg.work_dir)
        .with_context(|| format!("creating the sync work directory {}", cfg.work_dir.display()))?;
    // Kernels run as another uid: they pass through (not list) to their own manifest directory.
    std::fs::set_permissions(&cfg.work_dir, std::fs::Permissions::from_mode(0o711))
        .with_context(|| format!("making the sync work directory {} 0711", cfg.work_dir.display()))?;
    tempfile::Builder::new().prefix(what).tempdir_in(&cfg.work_dir).context("creating a manifest directory")
}

/// Gives a manifest directory and what is in it to the kernel's uid, so the kernel (not
/// root) writes its export there or reads what it applies.
pub(super) fn hand_to_kernel(dir: &Path, kernel: &LocalKernel) -> anyhow::Result<()> {
    let Some(id) = kernel.identity() else { return Ok(()) };
    let chown = |p: &Path| {
        std::os::unix::fs::lchown(p, Some(id.uid), Some(id.gid))
            .with_context(|| format!("giving {} to the kernel's uid {}", p.display(), id.uid))
    };
    chown(dir)?;
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        chown(&entry.with_context(|| format!("listing {}", dir.display()))?.path())?;
    }
    Ok(())
}

/// Reads a file the kernel wrote, opened as the daemon opens every file in a kernel's
/// directories ([`crate::kernel::process::open_in_kernel_dir`]: no symlink, no hard link,
/// no FIFO), so a kernel cannot make the root daemon read (and replicate) a file it may
/// not read itself, nor block it.
pub(super) fn read_kernel_file(path: &Path) -> anyhow::Result<Vec<u8>> {
    use std::io::Read;
    let mut f = crate::kernel::process::open_in_kernel_dir(path, std::fs::OpenOptions::new().read(true))?;
    let mut data = Vec::new();
    f.read_to_end(&mut data).with_context(|| format!("reading {}", path.display()))?;
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_names_and_files_are_checked() {
        assert!(check_file("3.pkl").is_ok());
        for bad in ["../x", "/etc/passwd", "a/b", "", "."] {
            assert!(check_file(bad).is_err(), "{bad:?} accepted");
        }
        assert!(check_name("x").is_ok());
        assert!(check_name("a/b").is_err());
        assert!(check_name("").is_err());
    }
}
