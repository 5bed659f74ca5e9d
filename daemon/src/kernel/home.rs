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

use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::identity::KernelIdentity;

/// The image in the kernel's directory (root's, 0600: the kernel cannot read it).
const IMAGE: &str = ".home.ext4";
/// The mount point in the kernel's directory, its HOME.
pub const HOME: &str = "home";

// <linux/loop.h>: not in the libc crate.
const LOOP_SET_FD: libc::c_ulong = 0x4C00;
const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
const LOOP_SET_STATUS64: libc::c_ulong = 0x4C04;
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
/// Detach the device when its last user (the mount) is gone.
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// `struct loop_info64`.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// A home image attached to a loop device, ready to be mounted in a kernel's namespace.
/// Dropping it closes the daemon's handle (the mount keeps the device).
#[derive(Debug)]
pub struct AttachedHome {
    _device: File,
    /// What to mount where.
    pub mount: HomeMount,
}

/// The loop device and the mount point, as C strings (a child may not allocate).
#[derive(Debug, Clone)]
pub struct HomeMount {
    source: CString,
    target: CString,
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
    let cstr = |p: &Path| CString::new(p.as_os_str().as_encoded_bytes()).context("a path with a NUL byte");
    Ok(AttachedHome { _device: device, mount: HomeMount { source: cstr(&device_path)?, target: cstr(&home_of(dir))? } })
}

fn rw(path: &Path) -> anyhow::Result<File> {
    std::fs::OpenOptions::new().read(true).write(true).open(path).with_context(|| format!("opening {}", path.display()))
}

/// The image, made when missing: sparse, ext4, its root directory owned by `id`.
fn open_or_make_image(path: &Path, id: &KernelIdentity, quota_bytes: u64) -> anyhow::Result<File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
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
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number.
        let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if n < 0 {
            return Err(std::io::Error::last_os_error()).context("finding a free loop device (/dev/loop-control)");
        }
        let path = PathBuf::from(format!("/dev/loop{n}"));
        let device = rw(&path)?;
        // SAFETY: LOOP_SET_FD reads one file descriptor, which `image` keeps open.
        if unsafe { libc::ioctl(device.as_raw_fd(), LOOP_SET_FD, image.as_raw_fd()) } != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EBUSY) {
                continue;
            }
            return Err(err).with_context(|| format!("attaching to {}", path.display()));
        }
        // SAFETY: an all-zero loop_info64 is valid (plain integers and byte arrays).
        let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
        info.lo_flags = LO_FLAGS_AUTOCLEAR;
        // SAFETY: LOOP_SET_STATUS64 reads one loop_info64, which outlives the call.
        if unsafe { libc::ioctl(device.as_raw_fd(), LOOP_SET_STATUS64, &info) } != 0 {
            let err = std::io::Error::last_os_error();
            // SAFETY: LOOP_CLR_FD takes no argument; it detaches what we attached.
            unsafe { libc::ioctl(device.as_raw_fd(), LOOP_CLR_FD) };
            return Err(err).with_context(|| format!("making {} auto-clear", path.display()));
        }
        return Ok((device, path));
    }
    anyhow::bail!("no free loop device after 8 tries")
}

impl HomeMount {
    /// Mounts the home in the calling process's mount namespace, at the mount point
    /// reached without following a link at its last component (the directories above
    /// are the daemon's).
    ///
    /// # Safety
    /// Async-signal-safe (open, fchdir, mount, close; no allocation): for a child
    /// between fork and exec, which must chdir to its working directory afterwards.
    pub unsafe fn mount_here(&self) -> std::io::Result<()> {
        // SAFETY: open, fchdir, mount and close read only C strings this struct owns, which
        // outlive the calls; the descriptor is ours and closed once.
        unsafe {
            let fd =
                libc::open(self.target.as_ptr(), libc::O_PATH | libc::O_NOFOLLOW | libc::O_DIRECTORY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // On the directory the descriptor holds, whatever its path says by now.
            let rc = if libc::fchdir(fd) != 0 {
                -1
            } else {
                libc::mount(
                    self.source.as_ptr(),
                    c".".as_ptr(),
                    c"ext4".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    std::ptr::null(),
                )
            };
            let err = std::io::Error::last_os_error();
            libc::close(fd);
            if rc != 0 {
                return Err(err);
            }
            Ok(())
        }
    }
}

/// Mounts `home` inside the mount namespace of process `pid` (a pre-warmed kernel being
/// handed its kernel): a forked helper enters the namespace and mounts there. A thread
/// cannot: setns(2) into a mount namespace refuses a process with other threads.
pub fn mount_into(pid: u32, home: &AttachedHome) -> anyhow::Result<()> {
    let ns_path = format!("/proc/{pid}/ns/mnt");
    let ns = File::open(&ns_path).with_context(|| format!("opening {ns_path}"))?;
    let ns_fd = ns.as_raw_fd();
    // SAFETY: the child calls only async-signal-safe functions (setns, open, fchdir,
    // mount, close, _exit) on data made before the fork, and allocates nothing; it
    // never returns into Rust code.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(std::io::Error::last_os_error()).context("forking the home mount helper");
    }
    if child == 0 {
        // SAFETY: see above; the child only exits.
        unsafe {
            let code = if libc::setns(ns_fd, libc::CLONE_NEWNS) != 0 {
                1
            } else if home.mount.mount_here().is_err() {
                2
            } else {
                0
            };
            libc::_exit(code);
        }
    }
    let mut status = 0;
    // SAFETY: waits for our own child, writing its status into `status`.
    while unsafe { libc::waitpid(child, &mut status, 0) } < 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err).context("waiting for the home mount helper");
        }
    }
    match (libc::WIFEXITED(status), libc::WEXITSTATUS(status)) {
        (true, 0) => Ok(()),
        (true, 1) => anyhow::bail!("entering the mount namespace of pid {pid} failed"),
        (true, _) => anyhow::bail!("mounting the home in the mount namespace of pid {pid} failed"),
        _ => anyhow::bail!("the home mount helper for pid {pid} died ({status:#x})"),
    }
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
