//! Capacity of a simulated GPU shared between processes, as on real hardware.
//!
//! One text file per GPU (`<state dir>/<uuid>.ledger`, lines `pid bytes`), updated under
//! `flock`. Entries of processes that no longer exist are dropped on every update, so a
//! crashed test process does not leak capacity.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::PathBuf;

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

/// A process that exited holds no GPU memory, even before its parent reaps it (a zombie).
fn alive(pid: u32) -> bool {
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

/// Sets the bytes `pid` holds on `gpu` to `bytes`, failing with `OutOfMemory` when the
/// GPU's capacity would be exceeded (a decrease always succeeds).
pub fn set(gpu: &FakeGpu, pid: u32, bytes: u64) -> Result<(), LedgerError> {
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
