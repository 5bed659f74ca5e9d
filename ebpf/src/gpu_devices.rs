//! The device files whose ioctls the optional `sys_enter` probe counts.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::error::ObserverError;

/// The kernel's `dev_t` layout (`MKDEV`: 12-bit major above a 20-bit minor), which is what
/// `inode->i_rdev` holds; user space's `st_rdev` uses glibc's different encoding.
pub(crate) fn kernel_dev(major: u32, minor: u32) -> u32 {
    (major << 20) | (minor & 0xf_ffff)
}

/// The kernel device numbers of `configured`, or of every `/dev/nvidia*` when empty. A
/// configured path that is not a character device is an error naming it.
pub(crate) fn resolve(configured: &[PathBuf]) -> Result<Vec<u32>, ObserverError> {
    if configured.is_empty() {
        let mut found = Vec::new();
        if let Ok(entries) = std::fs::read_dir("/dev") {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with("nvidia") {
                    if let Ok(dev) = char_device(&e.path()) {
                        found.push(dev);
                    }
                }
            }
        }
        return Ok(found);
    }
    configured.iter().map(|p| char_device(p)).collect()
}

fn char_device(path: &Path) -> Result<u32, ObserverError> {
    let err = |reason: String| ObserverError::Device { path: path.to_owned(), reason };
    let meta = std::fs::metadata(path).map_err(|e| err(e.to_string()))?;
    if !meta.file_type().is_char_device() {
        return Err(err("not a character device".into()));
    }
    let rdev = meta.rdev();
    Ok(kernel_dev(libc::major(rdev), libc::minor(rdev)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_null_is_major_1_minor_3_in_kernel_layout() {
        assert_eq!(resolve(&[PathBuf::from("/dev/null")]).unwrap(), vec![(1 << 20) | 3]);
    }

    #[test]
    fn a_regular_file_or_missing_path_is_refused_by_name() {
        let err = resolve(&[PathBuf::from("/etc/hostname")]).unwrap_err().to_string();
        assert!(err.contains("/etc/hostname") && err.contains("not a character device"), "{err}");
        let err = resolve(&[PathBuf::from("/dev/nvidia-none")]).unwrap_err().to_string();
        assert!(err.contains("/dev/nvidia-none"), "{err}");
    }
}
