//! The shim's per-process counters file: exact launch counts without a uprobe per launch.
//!
//! A uprobe costs about a microsecond per hit, PyTorch launches every few microseconds, so the
//! shim counts its own calls in a shared page instead and the observer reads it. Layout of
//! `<counters_dir>/<pid>` (one page, native-endian, every field an 8-byte-aligned atomic u64
//! updated with relaxed atomic adds; the shim maps it `MAP_SHARED`):
//!
//! | offset | field |
//! |---|---|
//! | 0 | magic `u32` = [`MAGIC`], then version `u32` = [`VERSION`] |
//! | 8 | launches |
//! | 16 | copies |
//! | 24 | copy_bytes |
//! | 32 | memsets |
//! | 40 | memset_bytes |
//! | 48 | syncs |
//! | 56 | first_ns (optional: CLOCK_MONOTONIC of the first call, 0 when not stamped) |
//! | 64 | last_ns (optional: CLOCK_MONOTONIC of the latest call, 0 when not stamped) |
//!
//! The hot path is one relaxed atomic add: reading even the coarse clock costs 20-30 ns in
//! our VMs, as much as a launch through the fake driver, so the reference writer does not stamp
//! times. The observer notices a count change itself (on every poll and every query) and uses
//! that moment as the process's latest activity; a shim that stamps `last_ns` gets it used too.
//!
//! The values are written by the observed process itself, so they are trusted only about that
//! process: a wrong file can make a process look busy or idle, nothing else. The directory is
//! shared by every kernel, so a file is believed only when its owner is one of the uids of the
//! process it is named after ([`read_owned`]): one kernel cannot speak for another's pid.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::ObserverError;

/// `b"NBSC"` read as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"NBSC");
/// Layout version.
pub const VERSION: u32 = 1;
/// Size of the file (one page; the fields use the first 72 bytes).
pub const FILE_SIZE: usize = 4096;
const FIELDS: usize = 9; // header word + 8 counters

/// Counts read from a counters file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShimCounts {
    /// Kernel and graph launches.
    pub launches: u64,
    /// Copies.
    pub copies: u64,
    /// Bytes copied.
    pub copy_bytes: u64,
    /// Memsets.
    pub memsets: u64,
    /// Bytes set.
    pub memset_bytes: u64,
    /// Synchronisations.
    pub syncs: u64,
    /// First call, CLOCK_MONOTONIC ns.
    pub first_ns: u64,
    /// Latest call, CLOCK_MONOTONIC ns.
    pub last_ns: u64,
}

impl ShimCounts {
    /// All calls counted, whatever their kind: what "the count changed" means.
    pub fn calls(&self) -> u64 {
        self.launches.wrapping_add(self.copies).wrapping_add(self.memsets).wrapping_add(self.syncs)
    }
}

/// The path of `pid`'s counters file.
pub fn path_for(dir: &Path, pid: u32) -> PathBuf {
    dir.join(pid.to_string())
}

/// The writer's shared read-write mapping of its own counters file.
struct Mapping {
    ptr: *mut libc::c_void,
}

impl Mapping {
    fn new(file: &File) -> std::io::Result<Self> {
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: we ask the kernel for a fresh shared mapping of FILE_SIZE bytes of an open file
        // descriptor; no existing memory is touched. The result is checked for MAP_FAILED.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), FILE_SIZE, prot, libc::MAP_SHARED, file.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self { ptr })
    }

    /// The i-th 8-byte word of the page.
    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < FIELDS, "counters field index out of range");
        // SAFETY: the mapping is FILE_SIZE (4096) bytes, page-aligned, and i < 9, so the 8 bytes
        // at i*8 are inside it and 8-byte aligned. Other processes (the shim) write the same
        // page only through atomic operations of the same width, so viewing it as AtomicU64 is
        // sound; the reference lives no longer than `self`, which owns the mapping.
        unsafe { &*(self.ptr.cast::<u8>().add(i * 8).cast::<AtomicU64>()) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from a successful mmap of FILE_SIZE bytes and is unmapped once,
        // here; no reference from `word` outlives `self`.
        unsafe { libc::munmap(self.ptr, FILE_SIZE) };
    }
}

/// A counters file whose owner is not one the reader accepts for the pid it is named after:
/// another process's (another kernel's) file, ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Foreign {
    /// The file's owner uid.
    pub owner: u32,
    /// Device of the file, to remove this file and no other ([`remove_foreign`]).
    pub dev: u64,
    /// Inode of the file.
    pub ino: u64,
}

/// The real, effective, saved and file-system uids of a live (or zombie) process; `None`
/// when there is no such process.
pub fn process_uids(pid: u32) -> Option<[u32; 4]> {
    let status = procfs::process::Process::new(i32::try_from(pid).ok()?).ok()?.status().ok()?;
    Some([status.ruid, status.euid, status.suid, status.fuid])
}

/// Reads `pid`'s counters whoever owns the file: for a tool reading files it made itself
/// (benchmarks, tests). `None` when there is no file or it is not a version-1 counters file.
/// The observer, which reads files kernels wrote, checks the owner ([`read_owned`]).
pub fn read(dir: &Path, pid: u32) -> Option<ShimCounts> {
    read_owned(dir, pid, |_| true).ok().flatten().map(|(c, _)| c)
}

/// Reads `pid`'s counters and the file's owner, when `owner_ok` accepts that owner;
/// `Err(Foreign)` when it does not. `Ok(None)`: no file, or not a version-1 counters file.
///
/// Read with `pread`, not a mapping: the file belongs to the observed (untrusted) process, which
/// could truncate it while we read a mapping, and a mapped page past the end of the file is a
/// SIGBUS that would kill the daemon. A short read is simply "no counters". The kernel copies
/// the 8-byte-aligned words out of the page cache whole on the hosts we run on; a counter
/// changing during the copy is read either before or after the change.
pub fn read_owned(
    dir: &Path,
    pid: u32,
    owner_ok: impl FnOnce(u32) -> bool,
) -> Result<Option<(ShimCounts, u32)>, Foreign> {
    use std::os::unix::fs::FileExt;
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::fs::OpenOptionsExt;
    let path = path_for(dir, pid);
    // The directory is writable by every kernel: never follow a link a kernel put there,
    // never block on a FIFO (O_NONBLOCK), and read plain files only.
    let Ok(file) = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(&path) else {
        return Ok(None);
    };
    // fstat of the open file: the owner of what is read, whatever the name points to later.
    let Ok(meta) = file.metadata() else { return Ok(None) };
    if !meta.is_file() {
        tracing::debug!(path = %path.display(), "counters path is not a plain file, ignored");
        return Ok(None);
    }
    if !owner_ok(meta.uid()) {
        return Err(Foreign { owner: meta.uid(), dev: meta.dev(), ino: meta.ino() });
    }
    let owner = meta.uid();
    let mut bytes = [0u8; FIELDS * 8];
    if let Err(e) = file.read_exact_at(&mut bytes, 0) {
        tracing::debug!(path = %path.display(), error = %e, "counters file too short, ignored");
        return Ok(None);
    }
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
        u64::from_ne_bytes(w)
    };
    let header = word(0);
    if header != u64::from(MAGIC) | (u64::from(VERSION) << 32) {
        tracing::debug!(path = %path.display(), header, "not a version-1 counters file, ignored");
        return Ok(None);
    }
    let w = word;
    let counts = ShimCounts {
        launches: w(1),
        copies: w(2),
        copy_bytes: w(3),
        memsets: w(4),
        memset_bytes: w(5),
        syncs: w(6),
        first_ns: w(7),
        last_ns: w(8),
    };
    Ok(Some((counts, owner)))
}

/// Removes `pid`'s counters file if it is still the file `foreign` describes (a file its
/// process cannot have written: another kernel's, or a previous process's of a reused pid),
/// so the real owner can create its own. Returns whether it was removed.
pub fn remove_foreign(dir: &Path, pid: u32, foreign: &Foreign) -> bool {
    use std::os::unix::fs::MetadataExt;
    let path = path_for(dir, pid);
    // lstat, then unlink by name: the name can change in between only by its owner (the
    // directory is sticky), and then the owner removed or replaced its own foreign file.
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.dev() == foreign.dev && m.ino() == foreign.ino => std::fs::remove_file(&path).is_ok(),
        _ => false,
    }
}

/// Pids that have a counters file in `dir`.
pub fn list(dir: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect()
}

/// The writer's side, as the shim keeps it: a mapped counters file with cheap atomic updates.
pub struct ShimCountersWriter {
    map: Mapping,
    path: PathBuf,
}

// SAFETY: the mapping is only accessed through atomics, and the pointer stays valid until drop.
unsafe impl Send for ShimCountersWriter {}
// SAFETY: as above; every access through `&self` is an atomic operation.
unsafe impl Sync for ShimCountersWriter {}

impl ShimCountersWriter {
    /// Creates (or truncates) `<dir>/<pid>` and maps it.
    pub fn create(dir: &Path, pid: u32) -> Result<Self, ObserverError> {
        let path = path_for(dir, pid);
        let err = |source| ObserverError::Counters { path: path.clone(), source };
        let mut file =
            OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).map_err(err)?;
        let mut page = vec![0u8; FILE_SIZE];
        page[..4].copy_from_slice(&MAGIC.to_ne_bytes());
        page[4..8].copy_from_slice(&VERSION.to_ne_bytes());
        file.write_all(&page).map_err(err)?;
        let map = Mapping::new(&file).map_err(err)?;
        Ok(Self { map, path })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Counts a launch.
    pub fn record_launch(&self) {
        self.map.word(1).fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a copy of `bytes`.
    pub fn record_copy(&self, bytes: u64) {
        self.map.word(2).fetch_add(1, Ordering::Relaxed);
        self.map.word(3).fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts a memset of `bytes`.
    pub fn record_memset(&self, bytes: u64) {
        self.map.word(4).fetch_add(1, Ordering::Relaxed);
        self.map.word(5).fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts a synchronisation.
    pub fn record_sync(&self) {
        self.map.word(6).fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The directory is writable by every kernel: a FIFO or a link named like a counters
    /// file is ignored at once (an open of a FIFO would block the observer forever).
    #[test]
    fn a_fifo_or_a_symlink_in_place_of_a_counters_file_is_ignored_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = path_for(dir.path(), 4243);
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo(3) reads a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
        assert!(read(dir.path(), 4243).is_none());
        let w = ShimCountersWriter::create(dir.path(), 4244).unwrap();
        w.record_launch();
        std::os::unix::fs::symlink(path_for(dir.path(), 4244), path_for(dir.path(), 4245)).unwrap();
        assert!(read(dir.path(), 4245).is_none(), "a symlink to a real counters file");
        assert!(read(dir.path(), 4244).is_some(), "the real one still reads");
    }

    #[test]
    fn written_counts_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let w = ShimCountersWriter::create(dir.path(), 4242).unwrap();
        for _ in 0..5 {
            w.record_launch();
        }
        w.record_copy(1 << 20);
        w.record_sync();
        let c = read(dir.path(), 4242).unwrap();
        assert_eq!((c.launches, c.copies, c.copy_bytes, c.syncs, c.memsets), (5, 1, 1 << 20, 1, 0));
        assert_eq!((c.first_ns, c.last_ns), (0, 0), "the reference writer stamps no time");
        assert_eq!(list(dir.path()), vec![4242]);
    }

    /// The observed process may truncate its file at any moment: reading must never fault
    /// (a mapping would take SIGBUS and kill the daemon), only see no counters.
    #[test]
    fn a_file_truncated_while_being_read_is_no_counters_not_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let w = ShimCountersWriter::create(dir.path(), 7).unwrap();
        w.record_launch();
        let path = w.path().to_owned();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let truncator = {
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                let f = OpenOptions::new().write(true).open(&path).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    f.set_len(0).unwrap();
                    f.set_len(FILE_SIZE as u64).unwrap();
                }
            })
        };
        for _ in 0..20_000 {
            if let Some(c) = read(dir.path(), 7) {
                assert!(c.launches <= 1, "{c:?}");
            }
        }
        stop.store(true, Ordering::Relaxed);
        truncator.join().unwrap();
    }

    /// Another uid's file named after a process is not that process's counters: refused,
    /// and removable (only that very file).
    #[test]
    fn a_file_owned_by_another_uid_than_the_process_is_refused_and_removable() {
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id();
        let w = ShimCountersWriter::create(dir.path(), me).unwrap();
        w.record_launch();
        let own = process_uids(me).unwrap();
        assert!(read(dir.path(), me).is_some(), "this process's own file");
        let owner = own[1];
        assert!(
            matches!(read_owned(dir.path(), me, |o| o == owner), Ok(Some((c, o))) if c.launches == 1 && o == owner)
        );
        let foreign = read_owned(dir.path(), me, |o| o != owner).unwrap_err();
        assert_eq!(foreign.owner, owner);
        assert!(!remove_foreign(dir.path(), me, &Foreign { ino: foreign.ino + 1, ..foreign }), "another inode");
        assert!(remove_foreign(dir.path(), me, &foreign));
        assert!(!path_for(dir.path(), me).exists());
        assert_eq!(process_uids(u32::MAX), None);
    }

    #[test]
    fn foreign_or_short_files_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(path_for(dir.path(), 1), vec![0u8; FILE_SIZE]).unwrap();
        std::fs::write(path_for(dir.path(), 2), b"NBSC").unwrap();
        assert_eq!(read(dir.path(), 1), None);
        assert_eq!(read(dir.path(), 2), None);
        assert_eq!(read(dir.path(), 3), None);
    }
}
