//! dlopen(3) of a library by full path, with dlerror(3)'s reason when it fails, and
//! dlclose(3).

use std::ffi::{c_int, c_void, CStr, CString};
use std::path::Path;
use std::ptr::NonNull;

/// Opens the library at `path` with `flags` (`RTLD_*`): its handle, or why not.
pub fn open(path: &Path, flags: c_int) -> Result<NonNull<c_void>, String> {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    let handle = unsafe { libc::dlopen(c.as_ptr(), flags) };
    NonNull::new(handle).ok_or_else(last_error)
}

/// Closes a handle [`open`] returned; the caller gives it up (the library stays loaded
/// while other handles to it are open).
pub fn close(handle: NonNull<c_void>) {
    // SAFETY: the handle came from dlopen and is closed once: the caller no longer has it.
    unsafe { libc::dlclose(handle.as_ptr()) };
}

/// dlerror's message for the last failure on this thread.
fn last_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated message.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        return "unknown error".to_owned();
    }
    // SAFETY: non-null, NUL-terminated, valid until the next dl* call on this thread.
    unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_opens_and_a_file_that_is_none_says_why() {
        let dir = tempfile::tempdir().expect("tempdir");
        let not_one = dir.path().join("libnot.so");
        std::fs::write(&not_one, "not ELF").expect("write");
        let why = open(&not_one, libc::RTLD_LAZY | libc::RTLD_LOCAL).expect_err("not a library");
        assert!(why.contains("libnot.so"), "{why}");
        let libc_so = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
        if libc_so.exists() {
            close(open(libc_so, libc::RTLD_LAZY | libc::RTLD_LOCAL).expect("libc opens"));
        }
    }
}
