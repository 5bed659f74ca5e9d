//! Capacity of a simulated GPU shared between processes, as on real hardware.
//!
//! One text file per GPU (`<state dir>/<uuid>.ledger`, lines `pid bytes`, host pids),
//! updated under `flock`. Entries of processes that no longer exist are dropped on every
//! update, so a crashed test process does not leak capacity.
//!
//! Whether a process still exists is decided by a liveness file, `<state dir>/live/<pid>`,
//! that it holds `flock(LOCK_SH)`ed for as long as it lives: kernels run in PID namespaces
//! of their own, whose procfs cannot show other kernels' host pids, but a lock held by a
//! process is visible from every namespace and goes away with it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use crate::config::{config, uuid_string, FakeGpu};

/// Why the ledger refused or failed.
#[derive(Debug)]
pub enum LedgerError {
    /// Not enough free capacity on the GPU.
    OutOfMemory,
    /// The ledger file could not be used.
    Io(std::io::Error),
}

impl From<std::io::Error> for LedgerError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

fn path(gpu: &FakeGpu) -> PathBuf {
    config().state_dir.join(format!("{}.ledger", uuid_string(&gpu.uuid)))
}

/// A liveness file this process holds.
struct Held {
    /// `getpid()` when it was taken: a forked child finds its parent's here and drops them.
    os_pid: u32,
    /// The (host) pid it stands for.
    pid: u32,
    /// Open and `LOCK_SH`ed; never unlocked explicitly, so closing it is the only release.
    _file: File,
}

/// The liveness files this process holds (more than one only if its pid as reported by
/// [`crate::state::pid`] changed, e.g. once the shim registered: entries under the old pid
/// stay alive).
static LIVE: Mutex<Vec<Held>> = Mutex::new(Vec::new());

fn live_path(state_dir: &Path, pid: u32) -> PathBuf {
    state_dir.join("live").join(pid.to_string())
}

/// Makes sure this process holds `<state_dir>/live/<pid>` locked shared, creating it if
/// missing, for the rest of its life (the fd is close-on-exec, as every fd std opens).
///
/// A child forked without this library's fork handler (e.g. a raw `clone`) keeps its
/// parent's lock fd until it records memory itself or execs, so the parent's entries stay
/// alive while such a child lives: harmless (capacity is freed a little late, never
/// double-booked).
pub(crate) fn hold_liveness(state_dir: &Path, pid: u32) -> std::io::Result<()> {
    let os_pid = std::process::id();
    let mut held = LIVE.lock();
    // Closing inherited copies does not release the parent's lock (the parent still has the
    // open file description); it only stops this child from extending the parent's life.
    held.retain(|h| h.os_pid == os_pid);
    if held.iter().any(|h| h.pid == pid) {
        return Ok(());
    }
    let dir = state_dir.join("live");
    std::fs::create_dir_all(&dir)?;
    // Shared like /tmp: the daemon (root) and kernels of several uids create files here.
    // Only the owner may chmod; for everyone else this fails harmlessly.
    let _ = std::fs::set_permissions(&dir, PermissionsExt::from_mode(0o1777));
    // Read-only with O_CREAT (std refuses `create` without write access): a file left by an
    // earlier process of another uid with this pid is 0644, still openable and lockable.
    let file = OpenOptions::new().read(true).custom_flags(libc::O_CREAT).mode(0o644).open(live_path(state_dir, pid))?;
    // Past the umask, so that every uid can open it to test the lock.
    let _ = file.set_permissions(PermissionsExt::from_mode(0o644));
    loop {
        // SAFETY: the fd is owned by `file`, which stays open (in LIVE) for the process's life.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH) } == 0 {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    held.push(Held { os_pid, pid, _file: file });
    Ok(())
}

/// Called in a forked child (only its forking thread exists): drops the parent's liveness
/// files, so they do not keep the parent's entries alive while the child lives.
pub(crate) fn forget_liveness_after_fork() {
    if LIVE.is_locked() {
        // SAFETY: the lock's owner was another parent thread, which does not exist here.
        unsafe { LIVE.force_unlock() };
    }
    LIVE.lock().clear();
}

/// A process that exited holds no GPU memory, even before its parent reaps it (a zombie).
fn alive(pid: u32) -> bool {
    alive_in(&config().state_dir, pid)
}

/// Liveness of `pid` by its liveness file under `state_dir`, or by procfs for an entry
/// whose process never took one.
fn alive_in(state_dir: &Path, pid: u32) -> bool {
    // The file is not removed when its holder is found dead: entries of that pid may still be
    // in other GPUs' ledgers, and without the file they would be judged by procfs, which is
    // wrong inside a PID namespace. Files are tiny and reused when the pid is.
    let Ok(file) = File::open(live_path(state_dir, pid)) else { return proc_alive(pid) };
    loop {
        // SAFETY: the fd is owned by `file`, open for the call; closing it (on return)
        // releases a lock this takes.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            // Nobody holds it: its process is gone (a zombie's fds are already closed).
            return false;
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EWOULDBLOCK) => return true,
            Some(libc::EINTR) => continue,
            _ => return proc_alive(pid),
        }
    }
}

/// What procfs (of this process's PID namespace) and `kill(pid, 0)` say.
fn proc_alive(pid: u32) -> bool {
    if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        let state = stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next());
        return !matches!(state, Some("Z" | "X"));
    }
    let Ok(pid) = i32::try_from(pid) else { return false };
    // SAFETY: kill with signal 0 only checks for existence and permission.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

struct Locked {
    file: File,
    entries: Vec<(u32, u64)>,
}

fn open_locked(gpu: &FakeGpu) -> Result<Locked, LedgerError> {
    std::fs::create_dir_all(&config().state_dir)?;
    let mut file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path(gpu))?;
    // One simulated GPU is shared by the daemon (root) and kernels running as other uids
    // (kernel.user, kernel.uid_range): whoever creates the ledger lets all of them write it.
    // Only the owner may chmod; for everyone else this fails harmlessly.
    let _ = file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    // SAFETY: the fd is owned by `file`, alive for the call; the lock is released when it closes.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    let entries = text
        .lines()
        .filter_map(|l| {
            let (p, b) = l.split_once(' ')?;
            Some((p.parse().ok()?, b.parse().ok()?))
        })
        .filter(|&(p, b): &(u32, u64)| b > 0 && alive(p))
        .collect();
    Ok(Locked { file, entries })
}

impl Locked {
    fn save(mut self) -> Result<(), LedgerError> {
        let text: String = self.entries.iter().filter(|e| e.1 > 0).map(|(p, b)| format!("{p} {b}\n")).collect();
        self.file.set_len(0)?;
        self.file.seek(SeekFrom::Start(0))?;
        self.file.write_all(text.as_bytes())?;
        Ok(())
    }
}

/// Sets the bytes `pid` (this process, as [`crate::state::pid`] says) holds on `gpu` to
/// `bytes`, failing with `OutOfMemory` when the GPU's capacity would be exceeded (a
/// decrease always succeeds).
pub fn set(gpu: &FakeGpu, pid: u32, bytes: u64) -> Result<(), LedgerError> {
    if bytes > 0 {
        // Before the entry exists, so no other process ever judges it by procfs.
        hold_liveness(&config().state_dir, pid)?;
    }
    let mut l = open_locked(gpu)?;
    let others: u64 = l.entries.iter().filter(|e| e.0 != pid).map(|e| e.1).sum();
    let mine = l.entries.iter().find(|e| e.0 == pid).map_or(0, |e| e.1);
    if bytes > mine && others.saturating_add(bytes) > gpu.memory_bytes {
        return Err(LedgerError::OutOfMemory);
    }
    l.entries.retain(|e| e.0 != pid);
    l.entries.push((pid, bytes));
    l.save()
}

/// Bytes in use on `gpu` by all live processes.
pub fn used(gpu: &FakeGpu) -> Result<u64, LedgerError> {
    let l = open_locked(gpu)?;
    Ok(l.entries.iter().map(|e| e.1).sum())
}

/// `(pid, bytes)` of every live process holding memory on `gpu` (what NVML's
/// per-process query reports).
pub fn processes(gpu: &FakeGpu) -> Result<Vec<(u32, u64)>, LedgerError> {
    let l = open_locked(gpu)?;
    Ok(l.entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Above any `pid_max`, so procfs alone would call it dead.
    const FAKE_PID: u32 = 0x7fff_fff0;

    fn read_byte(fd: libc::c_int) -> isize {
        let mut b = 0u8;
        // SAFETY: reads at most one byte into `b`, which we own.
        unsafe { libc::read(fd, (&raw mut b).cast(), 1) }
    }

    #[test]
    fn liveness_file_tracks_its_holder() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut ready = [0; 2];
        let mut go = [0; 2];
        // SAFETY: each call writes two fds into an array of two we own.
        assert_eq!(unsafe { libc::pipe(ready.as_mut_ptr()) }, 0);
        // SAFETY: as above.
        assert_eq!(unsafe { libc::pipe(go.as_mut_ptr()) }, 0);
        // SAFETY: the child only takes the liveness file, writes to a pipe and _exits.
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork: {}", std::io::Error::last_os_error());
        if child == 0 {
            let ok = hold_liveness(dir.path(), FAKE_PID).is_ok();
            if ok {
                // SAFETY: writes one byte from a live buffer to our pipe.
                unsafe { libc::write(ready[1], [1u8].as_ptr().cast(), 1) };
                // Wait for the parent to close `go` (EOF) before exiting.
                // SAFETY: closes our copy of the write end so EOF can arrive.
                unsafe { libc::close(go[1]) };
                read_byte(go[0]);
            }
            // SAFETY: ends the child without running the test harness's destructors.
            unsafe { libc::_exit(i32::from(!ok)) };
        }
        // SAFETY: closes the parent's copies of the ends it does not use.
        unsafe {
            libc::close(ready[1]);
            libc::close(go[0]);
        }
        assert_eq!(read_byte(ready[0]), 1, "child took its liveness file");
        assert!(!proc_alive(FAKE_PID));
        assert!(alive_in(dir.path(), FAKE_PID), "alive while the child holds the lock");
        // SAFETY: closing the write end tells the child to exit.
        unsafe { libc::close(go[1]) };
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is ours.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        // SAFETY: closes the last pipe fd we own.
        unsafe { libc::close(ready[0]) };
        assert!(live_path(dir.path(), FAKE_PID).exists());
        assert!(!alive_in(dir.path(), FAKE_PID), "dead once the holder exited");
    }

    #[test]
    fn own_liveness_file_is_alive_and_shared() {
        let dir = tempfile::tempdir().expect("tempdir");
        let me = crate::state::pid();
        hold_liveness(dir.path(), me).expect("hold");
        hold_liveness(dir.path(), me).expect("hold again is a no-op");
        assert!(alive_in(dir.path(), me));
        let live = dir.path().join("live");
        let mode = |p: &Path| std::fs::metadata(p).expect("metadata").permissions().mode() & 0o7777;
        assert_eq!(mode(&live), 0o1777);
        assert_eq!(mode(&live_path(dir.path(), me)), 0o644);
    }

    #[test]
    fn without_liveness_file_procfs_decides() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(alive_in(dir.path(), std::process::id()));
        assert!(!alive_in(dir.path(), FAKE_PID));
    }
}
