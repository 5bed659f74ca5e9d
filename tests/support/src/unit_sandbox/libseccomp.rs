//! libseccomp (the library systemd builds its filters with), loaded at run time: the tests
//! that use it need only the runtime library (`libseccomp.so.2`, on every Debian system),
//! and building the workspace needs no `libseccomp-dev` (the GPU host builds the tests too).

use std::ffi::{c_char, c_int, c_void, CString};
use std::io::{Read, Seek};
use std::os::fd::AsRawFd;

use anyhow::Context;

/// `SCMP_ACT_ALLOW`.
pub const ALLOW: u32 = 0x7fff_0000;
/// `SCMP_ACT_KILL_PROCESS`.
pub const KILL_PROCESS: u32 = 0x8000_0000;

/// `SCMP_ACT_ERRNO(errno)`.
pub fn errno(e: c_int) -> u32 {
    0x0005_0000 | (e as u32 & 0xffff)
}

/// `enum scmp_compare`.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub enum Op {
    NotEqual = 1,
    Less = 2,
    Equal = 4,
    Greater = 6,
    MaskedEqual = 7,
}

/// `struct scmp_arg_cmp`: argument `arg` compared by `op` with `a` (`MaskedEqual`: `arg & a == b`).
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct Arg {
    arg: u32,
    op: Op,
    a: u64,
    b: u64,
}

impl Arg {
    pub fn new(arg: u32, op: Op, value: u64) -> Self {
        Self { arg, op, a: value, b: 0 }
    }

    /// `arg & mask == value`.
    pub fn masked(arg: u32, mask: u64, value: u64) -> Self {
        Self { arg, op: Op::MaskedEqual, a: mask, b: value }
    }
}

type Init = unsafe extern "C" fn(u32) -> *mut c_void;
type Release = unsafe extern "C" fn(*mut c_void);
type AttrSet = unsafe extern "C" fn(*mut c_void, c_int, u32) -> c_int;
type Resolve = unsafe extern "C" fn(*const c_char) -> c_int;
type RuleAdd = unsafe extern "C" fn(*mut c_void, u32, c_int, u32, *const Arg) -> c_int;
type Export = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;

/// `SCMP_FLTATR_CTL_NNP`.
const CTL_NNP: c_int = 3;

/// One filter being built (`scmp_filter_ctx`) and the library it came from.
pub struct Filter {
    lib: libloading::Library,
    ctx: *mut c_void,
}

impl Filter {
    /// A filter for the native architecture whose default is `default_action`; it does not
    /// set no_new_privs itself (the unit's own directive decides).
    pub fn new(default_action: u32) -> anyhow::Result<Self> {
        // SAFETY: loading libseccomp runs no code of ours; its initialisers are the library's.
        let lib = unsafe { libloading::Library::new("libseccomp.so.2") }
            .context("loading libseccomp.so.2 (Debian package libseccomp2)")?;
        // SAFETY: seccomp_init(3)'s signature.
        let init: libloading::Symbol<Init> = unsafe { lib.get(b"seccomp_init\0") }.context("seccomp_init")?;
        // SAFETY: seccomp_init with an action value; NULL on failure, checked below.
        let ctx = unsafe { init(default_action) };
        anyhow::ensure!(!ctx.is_null(), "seccomp_init failed");
        let this = Self { lib, ctx };
        // SAFETY: seccomp_attr_set(3)'s signature, on our live context.
        let set: libloading::Symbol<AttrSet> =
            unsafe { this.lib.get(b"seccomp_attr_set\0") }.context("seccomp_attr_set")?;
        // SAFETY: as above.
        anyhow::ensure!(unsafe { set(this.ctx, CTL_NNP, 0) } == 0, "seccomp_attr_set(CTL_NNP)");
        Ok(this)
    }

    /// Adds `action` for system call `name` when `args` hold; false where this architecture
    /// lacks the call (systemd skips those too).
    pub fn rule(&mut self, action: u32, name: &str, args: &[Arg]) -> anyhow::Result<bool> {
        let cname = CString::new(name)?;
        // SAFETY: seccomp_syscall_resolve_name(3)'s signature.
        let resolve: libloading::Symbol<Resolve> =
            unsafe { self.lib.get(b"seccomp_syscall_resolve_name\0") }.context("seccomp_syscall_resolve_name")?;
        // SAFETY: a live NUL-terminated name.
        let nr = unsafe { resolve(cname.as_ptr()) };
        if nr == -1 {
            return Ok(false);
        }
        // SAFETY: seccomp_rule_add_exact_array(3)'s signature.
        let add: libloading::Symbol<RuleAdd> =
            unsafe { self.lib.get(b"seccomp_rule_add_exact_array\0") }.context("seccomp_rule_add_exact_array")?;
        let count = u32::try_from(args.len())?;
        // SAFETY: our live context and `count` live comparisons.
        Ok(unsafe { add(self.ctx, action, nr, count, args.as_ptr()) } == 0)
    }

    /// The filter as BPF, as the kernel takes it.
    pub fn export(&self) -> anyhow::Result<Vec<libc::sock_filter>> {
        let mut file = tempfile::tempfile().context("a file for the BPF export")?;
        // SAFETY: seccomp_export_bpf(3)'s signature.
        let export: libloading::Symbol<Export> =
            unsafe { self.lib.get(b"seccomp_export_bpf\0") }.context("seccomp_export_bpf")?;
        // SAFETY: our live context and an open descriptor.
        let rc = unsafe { export(self.ctx, file.as_raw_fd()) };
        anyhow::ensure!(rc == 0, "seccomp_export_bpf: {rc}");
        let mut bytes = Vec::new();
        file.rewind().context("rewind")?;
        file.read_to_end(&mut bytes).context("reading the BPF export")?;
        let size = std::mem::size_of::<libc::sock_filter>();
        anyhow::ensure!(!bytes.is_empty() && bytes.len() % size == 0, "a BPF export of {} bytes", bytes.len());
        Ok(bytes
            .chunks_exact(size)
            .map(|c| libc::sock_filter {
                code: u16::from_ne_bytes([c[0], c[1]]),
                jt: c[2],
                jf: c[3],
                k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect())
    }
}

impl Drop for Filter {
    fn drop(&mut self) {
        // SAFETY: seccomp_release(3)'s signature; the context is ours and released once.
        if let Ok(release) = unsafe { self.lib.get::<Release>(b"seccomp_release\0") } {
            // SAFETY: as above.
            unsafe { release(self.ctx) };
        }
    }
}
