//! A kernel's home with a byte quota (`kernel.home_quota_mib`): a sparse ext4 image in
//! the kernel's directory, attached to a loop device and mounted (nosuid, nodev) at
//! `<dir>/home` inside the kernel's own mount namespace only. A write past the image's
//! size fails with ENOSPC in the kernel; the host's disk holds at most the image.
//!
//! Why a mount in the kernel's namespace and never in the daemon's: it disappears with
//! the kernel's last process (the loop device is auto-cleared then), so a killed daemon
//! leaves no mount on the host. A new kernel process mounts in its child before exec; a
//! pre-warmed one, whose namespace exists before its kernel is known, gets the mount put
//! into its namespace by a short-lived forked helper ([`mount_into`]).
//!
//! The kernel owns its directory and may replace anything in it with links: the image is
//! opened without following links and must be a root-owned plain file of its own; the
//! mount point is opened `O_NOFOLLOW` inside the kernel's namespace and mounted on by
//! descriptor.

use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::identity::KernelIdentity;
use crate::sys::mount::{Ext4Mount, MountIntoError};
use crate::sys::{loop_device, open_flags};

/// The image in the kernel's directory (root's, 0600: the kernel cannot read it).
const IMAGE: &str = ".home.ext4";
/// The mount point in the kernel's directory, its HOME.
pub const HOME: &str = "home";

/// A home image attached to a loop device, ready to be mounted in a kernel's namespace.
/// Dropping it closes the daemon's handle (the mount keeps the device).
#[derive(Debug)]
pub struct AttachedHome {
    _device: File,
    /// What to mount where.
    pub mount: Ext4Mount,
}

/// The kernel's home directory in `dir`.
pub fn home_of(dir: &Path) -> PathBuf {
    dir.join(HOME)
}

/// Makes (once) the kernel's image of `quota_bytes` in `dir`, owned inside by `id`, and
/// attaches it to a loop device. The mount point `<dir>/home` must exist.
pub fn attach(dir: &Path, id: &KernelIdentity, quota_bytes: u64) -> anyhow::Result<AttachedHome> {
    let image_path = dir.join(IMAGE);
    let image = open_or_make_image(&image_path, id, quota_bytes)?;
    let (device, device_path) = match attached_device(&image_path)? {
        // Already attached (and maybe mounted, by an earlier process of this kernel that
        // still lives): the same device, never a second one, or two ext4 instances would
        // write one image.
        Some(path) => (rw(&path)?, path),
        None => attach_loop(&image).with_context(|| format!("attaching {} to a loop device", image_path.display()))?,
    };
    let mount = Ext4Mount::new(&device_path, &home_of(dir)).context("a path with a NUL byte")?;
    Ok(AttachedHome { _device: device, mount })
}

fn rw(path: &Path) -> anyhow::Result<File> {
    std::fs::OpenOptions::new().read(true).write(true).open(path).with_context(|| format!("opening {}", path.display()))
}

/// The image, made when missing: sparse, ext4, its root directory owned by `id`.
fn open_or_make_image(path: &Path, id: &KernelIdentity, quota_bytes: u64) -> anyhow::Result<File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).custom_flags(open_flags::O_NOFOLLOW | open_flags::O_NONBLOCK);
    match options.open(path) {
        Ok(f) => {
            let meta = f.metadata().with_context(|| format!("examining {}", path.display()))?;
            anyhow::ensure!(
                meta.is_file() && meta.nlink() == 1 && meta.uid() == 0,
                "{} is not the daemon's home image (a link, or the kernel's file?); refusing to use it",
                path.display()
            );
            return Ok(f);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("opening {} (no symlinks)", path.display())),
    }
    let f = options
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating the home image {}", path.display()))?;
    let made = (|| {
        f.set_len(quota_bytes).with_context(|| format!("sizing {} to {quota_bytes} bytes", path.display()))?;
        // No journal (a kernel's home needs no crash consistency, and it would take room
        // from the quota), no reserved blocks, the root directory the kernel's.
        let out = std::process::Command::new(mke2fs())
            .args(["-q", "-F", "-t", "ext4", "-m", "0", "-O", "^has_journal", "-E"])
            .arg(format!("root_owner={}:{},nodiscard", id.uid, id.gid))
            .arg(path)
            .output()
            .context("running mke2fs (e2fsprogs; scripts/install-deps.sh installs it)")?;
        anyhow::ensure!(
            out.status.success(),
            "mke2fs {} failed ({}): {}",
            path.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        anyhow::Ok(())
    })();
    if let Err(e) = made {
        let _ = std::fs::remove_file(path);
        return Err(e.context("making the kernel's home image (kernel.home_quota_mib)"));
    }
    Ok(f)
}

/// mke2fs from PATH, else where Debian and Fedora put it (a daemon's PATH may lack sbin).
fn mke2fs() -> PathBuf {
    ["/usr/sbin/mke2fs", "/sbin/mke2fs"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("mke2fs"))
}

/// The loop device `image` is attached to, if any (`/sys/block/loop*/loop/backing_file`).
fn attached_device(image: &Path) -> anyhow::Result<Option<PathBuf>> {
    let image = std::path::absolute(image).context("the home image's path")?;
    let Ok(entries) = std::fs::read_dir("/sys/block") else { return Ok(None) };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.as_encoded_bytes().starts_with(b"loop") {
            continue;
        }
        let Ok(backing) = std::fs::read_to_string(entry.path().join("loop/backing_file")) else { continue };
        if Path::new(backing.trim_end()) == image {
            return Ok(Some(Path::new("/dev").join(name)));
        }
    }
    Ok(None)
}

/// A free loop device with `image` as its backing file, auto-cleared when unused.
fn attach_loop(image: &File) -> anyhow::Result<(File, PathBuf)> {
    let control = rw(Path::new("/dev/loop-control"))?;
    // Another process may take the free device between the two calls: try again.
    for _ in 0..8 {
        let n = loop_device::free_device(&control).context("finding a free loop device (/dev/loop-control)")?;
        let path = PathBuf::from(format!("/dev/loop{n}"));
        let device = rw(&path)?;
        match loop_device::attach(&device, image) {
            Ok(()) => return Ok((device, path)),
            Err(e) if e.kind() == std::io::ErrorKind::ResourceBusy => continue,
            Err(e) => return Err(e).with_context(|| format!("attaching to {}", path.display())),
        }
    }
    anyhow::bail!("no free loop device after 8 tries")
}

/// Mounts `home` inside the mount namespace of process `pid` (a pre-warmed kernel being
/// handed its kernel), through a forked helper ([`Ext4Mount::mount_into`]).
pub fn mount_into(pid: u32, home: &AttachedHome) -> anyhow::Result<()> {
    home.mount.mount_into(pid).map_err(|e| match e {
        MountIntoError::Io(e) => anyhow::Error::new(e).context(format!("the home mount helper for pid {pid}")),
        MountIntoError::Enter => anyhow::anyhow!("entering the mount namespace of pid {pid} failed"),
        MountIntoError::Mount => anyhow::anyhow!("mounting the home in the mount namespace of pid {pid} failed"),
        MountIntoError::Died(status) => anyhow::anyhow!("the home mount helper for pid {pid} died ({status:#x})"),
    })
}

/// Removes the kernel directories (named by kernel id) in `kernels_dir` that a previous
/// daemon left: no kernel is adopted across restarts. Their images go with them (a loop
/// device still in use by a process of an old kernel keeps the deleted file until then).
pub fn remove_left_over(kernels_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(kernels_dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_str().is_some_and(super::id::is_kernel_id) {
            continue;
        }
        // remove_dir_all follows no symlink the kernel may have left there.
        if let Err(e) = std::fs::remove_dir_all(entry.path()) {
            tracing::warn!(dir = %entry.path().display(), error = %e, "could not remove a left-over kernel directory");
        }
    }
}
