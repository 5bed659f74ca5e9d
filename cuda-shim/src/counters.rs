//! The per-process counters file the observer reads instead of probing every launch.
//!
//! With `NBOS_SHIM_COUNTERS_DIR` set, the first driver use creates `<dir>/<pid>` (the pid the host sees): one
//! 4096-byte page, mapped `MAP_SHARED`, whose layout is `nbos-ebpf`'s `src/shim_counters.rs`
//! (word 0 = magic `b"NBSC"` | version 1 << 32; then launches, copies, copy_bytes, memsets,
//! memset_bytes, syncs at offsets 8..56). Each gated pass-through of a counted call does a
//! relaxed atomic add on its word: no allocation, no syscall, no environment read. Without the
//! variable, or when the file cannot be made, nothing is counted and every call still works.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

/// The environment variable naming the counters directory (set by the daemon).
pub const DIR_ENV: &str = "NBOS_SHIM_COUNTERS_DIR";
/// `b"NBSC"` as a little-endian u32 (nbos-ebpf's `shim_counters::MAGIC`).
pub const MAGIC: u32 = u32::from_le_bytes(*b"NBSC");
/// Layout version (nbos-ebpf's `shim_counters::VERSION`).
pub const VERSION: u32 = 1;
/// The file's size: one page.
pub const FILE_SIZE: usize = 4096;

/// Word indices (offset / 8) of the counters.
const LAUNCHES: usize = 1;
const COPIES: usize = 2;
const COPY_BYTES: usize = 3;
const MEMSETS: usize = 4;
const MEMSET_BYTES: usize = 5;
const SYNCS: usize = 6;
const WORDS: usize = FILE_SIZE / 8;

/// The mapped page, or null when not counting.
static PAGE: AtomicPtr<AtomicU64> = AtomicPtr::new(std::ptr::null_mut());

#[inline(always)]
fn add(word: usize, n: u64) {
    debug_assert!(word < WORDS);
    let page = PAGE.load(Ordering::Relaxed);
    if page.is_null() {
        return;
    }
    // SAFETY: a non-null PAGE is a live MAP_SHARED mapping of FILE_SIZE bytes, page-aligned,
    // and word < WORDS, so the 8 bytes are inside it and 8-byte aligned; the page is only
    // ever accessed through atomics of this width. It is unmapped only in a forked child's
    // atfork handler, when that child has a single thread and PAGE was nulled first.
    unsafe { (*page.add(word)).fetch_add(n, Ordering::Relaxed) };
}

/// Counts a kernel or graph launch.
#[inline(always)]
pub fn launch() {
    add(LAUNCHES, 1);
}

/// Counts a copy of `bytes` (0 when the size is not an argument).
#[inline(always)]
pub fn copy(bytes: u64) {
    add(COPIES, 1);
    add(COPY_BYTES, bytes);
}

/// Counts a memset of `bytes`.
#[inline(always)]
pub fn memset(bytes: u64) {
    add(MEMSETS, 1);
    add(MEMSET_BYTES, bytes);
}

/// Counts a synchronisation.
#[inline(always)]
pub fn sync() {
    add(SYNCS, 1);
}

/// Creates and maps this process's counters file, `<dir>/<pid>` with `pid` as the host sees
/// it (the daemon's observer looks it up by that), when `NBOS_SHIM_COUNTERS_DIR` is set.
/// Called once per process (again in a forked child) where the lease client has started;
/// a failure is logged once and leaves counting off.
pub fn open_for_this_process(pid: u32) {
    if !PAGE.load(Ordering::Relaxed).is_null() {
        return;
    }
    let Some(dir) = std::env::var_os(DIR_ENV) else { return };
    if dir.is_empty() {
        return;
    }
    let path = std::path::Path::new(&dir).join(pid.to_string());
    match create(&path) {
        Ok(page) => PAGE.store(page, Ordering::Relaxed),
        Err(e) => eprintln!("nbos-cuda-shim: counters file {}: {e}; not counting calls", path.display()),
    }
}

fn create(path: &std::path::Path) -> std::io::Result<*mut AtomicU64> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    // SAFETY: NUL-terminated path; the returned fd is checked and closed below.
    let fd = unsafe {
        libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC | libc::O_NOFOLLOW, 0o644)
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let result = map(fd);
    // SAFETY: our own fd, closed once; the mapping (if any) stays valid after close.
    unsafe { libc::close(fd) };
    result
}

fn map(fd: libc::c_int) -> std::io::Result<*mut AtomicU64> {
    // SAFETY: `fd` is an open regular file of ours; extending it to one page touches no memory.
    if unsafe { libc::ftruncate(fd, FILE_SIZE as libc::off_t) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh shared mapping of FILE_SIZE bytes of a file that is FILE_SIZE long;
    // no existing memory is touched; MAP_FAILED is checked.
    let ptr = unsafe {
        libc::mmap(std::ptr::null_mut(), FILE_SIZE, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
    };
    if ptr == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let page = ptr.cast::<AtomicU64>();
    // SAFETY: word 0 of the fresh, page-aligned mapping; written before anyone counts (the
    // page is published through PAGE only after this), and the reader checks it with pread.
    unsafe { (*page).store(u64::from(MAGIC) | (u64::from(VERSION) << 32), Ordering::Relaxed) };
    Ok(page)
}

/// In a forked child (single-threaded, from the atfork handler): drops the parent's page so
/// the child's calls never land in the parent's file; the child makes its own on first use.
pub fn forget_after_fork() {
    let page = PAGE.swap(std::ptr::null_mut(), Ordering::Relaxed);
    if !page.is_null() {
        // SAFETY: the parent's mapping, inherited by this child, which has only this thread
        // and no longer publishes it through PAGE; unmapping affects only this process.
        unsafe { libc::munmap(page.cast(), FILE_SIZE) };
    }
}
