//! Simulated device memory: one anonymous `mmap` per allocation, whose address is the
//! device pointer. Checkpoint copies the contents out and makes the range inaccessible
//! (so a stray access while "off the GPU" faults as it would on hardware); restore
//! brings them back at the same address, which keeps device pointers valid.

/// One device allocation.
#[derive(Debug)]
pub struct Allocation {
    /// Bytes requested.
    pub size: usize,
    /// Bytes mapped (page-rounded).
    pub mapped: usize,
    /// Ordinal of the GPU holding it.
    pub device: u32,
    /// Contents while checkpointed.
    pub backup: Option<Vec<u8>>,
}

/// Maps `size` bytes of zeroed "device memory"; returns its address.
pub fn map(size: usize) -> Option<(u64, usize)> {
    let page = 4096usize;
    let mapped = size.max(1).checked_add(page - 1)? / page * page;
    // SAFETY: anonymous private mapping with no address hint; the kernel picks a free range.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            mapped,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    Some((p as u64, mapped))
}

/// Unmaps an allocation.
pub fn unmap(base: u64, a: &Allocation) {
    // SAFETY: `base`/`mapped` is exactly a range returned by `map` and still owned by `a`.
    unsafe { libc::munmap(base as *mut libc::c_void, a.mapped) };
}

/// Moves the contents to host backup and drops the pages.
pub fn checkpoint(base: u64, a: &mut Allocation) {
    if a.backup.is_some() {
        return;
    }
    // SAFETY: the range is mapped read-write (not checkpointed yet) and owned by `a`;
    // the driver gate is held exclusively, so no kernel or copy touches it concurrently.
    let contents = unsafe { std::slice::from_raw_parts(base as *const u8, a.size) }.to_vec();
    // SAFETY: as above; DONTNEED on a private anonymous mapping just frees its pages.
    unsafe {
        libc::madvise(base as *mut libc::c_void, a.mapped, libc::MADV_DONTNEED);
        libc::mprotect(base as *mut libc::c_void, a.mapped, libc::PROT_NONE);
    }
    a.backup = Some(contents);
}

/// Brings checkpointed contents back at the same address.
pub fn restore(base: u64, a: &mut Allocation) {
    let Some(contents) = a.backup.take() else { return };
    // SAFETY: the range is ours (mapped by `map`, PROT_NONE since checkpoint).
    unsafe { libc::mprotect(base as *mut libc::c_void, a.mapped, libc::PROT_READ | libc::PROT_WRITE) };
    // SAFETY: now read-write, `size` bytes long, and nothing else accesses it (gate held exclusively).
    unsafe { std::ptr::copy_nonoverlapping(contents.as_ptr(), base as *mut u8, a.size) };
}
