//! The test double's process-wide driver state and its two locks.
//!
//! `GATE` is the checkpoint lock: every call that touches contexts, memory or work
//! holds it shared; `cuCheckpointProcessLock` (served in this process by the control
//! thread) holds it exclusively, which blocks the process's CUDA calls as the real
//! driver does. `STATE` protects the tables and is only held inside one call.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use parking_lot::{Mutex, RwLock};

use crate::config::config;
use crate::memory::Allocation;
use crate::result::{self, CUresult};

/// The checkpoint lock (see the module docs).
pub static GATE: RwLock<()> = RwLock::new(());
/// The driver's tables.
pub static STATE: Mutex<Option<Driver>> = Mutex::new(None);

/// `CUprocessState` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ProcessState {
    /// `CU_PROCESS_STATE_RUNNING`.
    Running = 0,
    /// `CU_PROCESS_STATE_LOCKED`.
    Locked = 1,
    /// `CU_PROCESS_STATE_CHECKPOINTED`.
    Checkpointed = 2,
}

/// A context.
#[derive(Debug)]
pub struct Ctx {
    /// Its GPU ordinal (changes when a restore remaps GPUs).
    pub device: u32,
    /// Primary context of its device.
    pub primary: bool,
}

/// Everything the test double knows about this process's CUDA use.
#[derive(Debug)]
pub struct Driver {
    /// Contexts by handle.
    pub contexts: HashMap<u64, Ctx>,
    /// Primary context of each device.
    pub primary: HashMap<u32, u64>,
    /// Allocations by base address.
    pub allocs: BTreeMap<u64, Allocation>,
    /// Loaded pseudo-modules.
    pub modules: HashSet<u64>,
    /// Streams.
    pub streams: HashSet<u64>,
    /// Events and the time they were last recorded.
    pub events: HashMap<u64, Option<Instant>>,
    /// Next handle value.
    pub next_handle: u64,
    /// Checkpoint state of this process.
    pub process_state: ProcessState,
}

impl Driver {
    fn new() -> Self {
        Self {
            contexts: HashMap::new(),
            primary: HashMap::new(),
            allocs: BTreeMap::new(),
            modules: HashSet::new(),
            streams: HashSet::new(),
            events: HashMap::new(),
            // Handles are multiples of 16 starting high, so they never look like small integers.
            next_handle: 0x7000,
            process_state: ProcessState::Running,
        }
    }

    /// A fresh handle.
    pub fn handle(&mut self) -> u64 {
        self.next_handle += 16;
        self.next_handle
    }

    /// Bytes this process holds on `device`.
    pub fn bytes_on(&self, device: u32) -> u64 {
        self.allocs.values().filter(|a| a.device == device && a.backup.is_none()).map(|a| a.size as u64).sum()
    }

    /// Checks that `[ptr, ptr+len)` lies in one live (not checkpointed) allocation.
    pub fn check_range(&self, ptr: u64, len: usize) -> Result<(), CUresult> {
        let (base, a) = self.allocs.range(..=ptr).next_back().ok_or(result::ILLEGAL_ADDRESS)?;
        let end = ptr.checked_add(len as u64).ok_or(result::ILLEGAL_ADDRESS)?;
        if end > base + a.size as u64 || a.backup.is_some() {
            return Err(result::ILLEGAL_ADDRESS);
        }
        Ok(())
    }
}

thread_local! {
    static CURRENT: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// This thread's current context handle (0: none).
pub fn current() -> u64 {
    CURRENT.with(|c| c.get())
}

/// Makes `ctx` current on this thread.
pub fn set_current(ctx: u64) {
    CURRENT.with(|c| c.set(ctx));
}

/// This process's id as the host sees it, which is what the real driver records and what
/// the daemon looks processes up by (ledger entries, the control socket's name).
///
/// A kernel in a PID namespace of its own has a small pid there and a procfs that shows
/// only that namespace, so neither `getpid()` nor `/proc/self` says it. The CUDA shim
/// learns the host pid from the daemon over its authenticated lease socket and exports it
/// as `extern "C" fn nbos_shim_host_pid() -> u32`; that is used when the shim is loaded
/// and answers non-zero. Otherwise (no shim, or not registered yet) the process is taken
/// to be in the host's namespace or unmanaged, and `getpid()` is its pid.
///
/// Nothing is cached: after a fork the child must get its own pid, and the shim's answer
/// changes from 0 once it registers.
pub fn pid() -> u32 {
    // SAFETY: RTLD_DEFAULT with a NUL-terminated name only searches the loaded objects.
    let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"nbos_shim_host_pid".as_ptr()) };
    if !sym.is_null() {
        // SAFETY: the shim defines `nbos_shim_host_pid` with exactly this signature, and a
        // symbol of a loaded object stays valid while it is found by RTLD_DEFAULT.
        let host_pid = unsafe { std::mem::transmute::<*mut libc::c_void, extern "C" fn() -> u32>(sym) };
        let p = host_pid();
        if p != 0 {
            return p;
        }
    }
    std::process::id()
}

/// Runs `f` on the initialised driver, under the shared checkpoint gate, catching panics.
pub fn gated(f: impl FnOnce(&mut Driver) -> CUresult) -> CUresult {
    catch_unwind(AssertUnwindSafe(|| {
        let _gate = GATE.read();
        let mut st = STATE.lock();
        match st.as_mut() {
            Some(d) => f(d),
            None => result::NOT_INITIALIZED,
        }
    }))
    .unwrap_or(result::UNKNOWN)
}

/// Runs `f` without the gate (pure queries the real driver also answers while locked).
pub fn ungated(f: impl FnOnce() -> CUresult) -> CUresult {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(result::UNKNOWN)
}

/// `cuInit`: creates the tables, starts the checkpoint control thread, installs fork handlers.
pub fn init() -> CUresult {
    let mut st = STATE.lock();
    if st.is_none() {
        if config().gpus.is_empty() {
            return result::NO_DEVICE;
        }
        *st = Some(Driver::new());
        drop(st);
        install_fork_handlers();
        if let Err(e) = crate::checkpoint::start_server() {
            eprintln!("fake-cuda (test double): checkpoint control socket unavailable: {e}");
        }
    }
    result::SUCCESS
}

fn install_fork_handlers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: the handler is a plain extern "C" fn that lives for the program.
        unsafe { libc::pthread_atfork(None, None, Some(child)) };
    });
}

// No prepare handler: holding STATE across fork could deadlock against an interposer's
// own prepare handler (the shim waits there for in-flight calls that may need STATE).
extern "C" fn child() {
    // In the child only the forking thread exists: a lock held by any other parent thread
    // would never be released, and the state is discarded below anyway.
    if STATE.is_locked() {
        // SAFETY: the owner of the lock does not exist in this process.
        unsafe { STATE.force_unlock() };
    }
    // As with the real driver, a child does not inherit the parent's CUDA state: it
    // starts uninitialised and calls cuInit again (its copies of the parent's mappings are
    // not its allocations and are never charged to its ledger entry).
    *STATE.lock() = None;
    set_current(0);
    crate::checkpoint::forget_server_after_fork();
    crate::ledger::forget_liveness_after_fork();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_without_shim_is_getpid() {
        // The test binary does not define `nbos_shim_host_pid`.
        assert_eq!(pid(), std::process::id());
    }
}
