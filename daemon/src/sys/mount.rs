//! Mounting an ext4 device (a kernel's home image on its loop device) on a directory
//! reached by descriptor, in the calling process's mount namespace (between fork and
//! exec) or in another process's, through a short-lived forked helper.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

/// A device and the mount point, as C strings (a child may not allocate).
#[derive(Debug, Clone)]
pub struct Ext4Mount {
    source: CString,
    target: CString,
}

/// Why [`Ext4Mount::mount_into`] failed.
#[derive(Debug, thiserror::Error)]
pub enum MountIntoError {
    /// Opening `/proc/<pid>/ns/mnt`, forking or waiting.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The helper could not enter the namespace.
    #[error("entering the mount namespace failed")]
    Enter,
    /// The helper entered the namespace but the mount failed.
    #[error("mounting in the mount namespace failed")]
    Mount,
    /// The helper died of a signal (its wait status).
    #[error("the mount helper died ({0:#x})")]
    Died(i32),
}

impl Ext4Mount {
    /// `source` mounted (nosuid, nodev) on `target`.
    pub fn new(source: &Path, target: &Path) -> std::io::Result<Self> {
        let cstr = |p: &Path| CString::new(p.as_os_str().as_encoded_bytes());
        Ok(Self { source: cstr(source)?, target: cstr(target)? })
    }

    /// Mounts the home in the calling process's mount namespace, at the mount point
    /// reached without following a link at its last component (the directories above
    /// are the daemon's).
    ///
    /// # Safety
    /// Async-signal-safe (open, fchdir, mount, close; no allocation): for a child
    /// between fork and exec, which must chdir to its working directory afterwards.
    pub(super) unsafe fn mount_here(&self) -> std::io::Result<()> {
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

    /// Mounts inside the mount namespace of process `pid` (a pre-warmed kernel being
    /// handed its kernel): a forked helper enters the namespace and mounts there. A thread
    /// cannot: setns(2) into a mount namespace refuses a process with other threads.
    pub fn mount_into(&self, pid: u32) -> Result<(), MountIntoError> {
        let ns = File::open(format!("/proc/{pid}/ns/mnt"))?;
        let ns_fd = ns.as_raw_fd();
        // SAFETY: the child calls only async-signal-safe functions (setns, open, fchdir,
        // mount, close, _exit) on data made before the fork, and allocates nothing; it
        // never returns into Rust code.
        let child = unsafe { libc::fork() };
        if child < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        if child == 0 {
            // SAFETY: see above; the child only exits.
            unsafe {
                let code = if libc::setns(ns_fd, libc::CLONE_NEWNS) != 0 {
                    1
                } else if self.mount_here().is_err() {
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
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(err.into());
            }
        }
        match (libc::WIFEXITED(status), libc::WEXITSTATUS(status)) {
            (true, 0) => Ok(()),
            (true, 1) => Err(MountIntoError::Enter),
            (true, _) => Err(MountIntoError::Mount),
            _ => Err(MountIntoError::Died(status)),
        }
    }
}
