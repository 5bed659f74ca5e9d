//! The checkpoint API of the test double, with real semantics across processes.
//!
//! The process being checkpointed ("target") serves requests on the abstract Unix
//! socket `@fake-cuda-ctl-<pid>` from a thread started by `cuInit`. The caller of
//! `cuCheckpointProcess*(pid, …)` (the daemon's GPU control) connects to it, sends one
//! text line and reads one `<CUresult> [value]` line. The target's thread holds the
//! driver gate exclusively from LOCK to UNLOCK, which blocks the target's CUDA calls.
//! Only peers with the target's uid, or root, are served.

#![expect(clippy::missing_safety_doc, reason = "the CUDA driver API contract applies to every export")]

use std::collections::HashMap;
use std::ffi::c_int;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::Duration;

use parking_lot::{Mutex, RwLockWriteGuard};

use crate::config::config;
use crate::faults::{self, Fault, Op};
use crate::ledger::{self, LedgerError};
use crate::memory;
use crate::result::{self, CUresult};
use crate::state::{self, ProcessState, GATE, STATE};

/// Longest request line served (a RESTORE with 64 GPU pairs fits).
const MAX_LINE: usize = 8192;

/// `CUcheckpointLockArgs`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct LockArgs {
    /// Give up after this many ms (0: wait indefinitely).
    pub timeout_ms: u32,
    /// Reserved.
    pub reserved0: u32,
    /// Reserved.
    pub reserved1: [u64; 7],
}

/// `CUcheckpointGpuPair`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct GpuPair {
    /// UUID the process used before the checkpoint.
    pub old_uuid: [u8; 16],
    /// UUID to restore onto.
    pub new_uuid: [u8; 16],
}

/// `CUcheckpointRestoreArgs`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RestoreArgs {
    /// GPU remapping pairs (may be NULL).
    pub gpu_pairs: *const GpuPair,
    /// Number of pairs.
    pub gpu_pairs_count: u32,
    /// Reserved.
    pub reserved: [u8; 44],
    /// Reserved.
    pub reserved1: u64,
}

fn name_of(pid: u32) -> String {
    format!("fake-cuda-ctl-{pid}")
}

static SERVER_PID: Mutex<Option<u32>> = Mutex::new(None);

/// Starts this process's control thread (once per process, again in a forked child).
pub fn start_server() -> std::io::Result<()> {
    let mut started = SERVER_PID.lock();
    let pid = state::pid();
    if *started == Some(pid) {
        return Ok(());
    }
    let addr = SocketAddr::from_abstract_name(name_of(pid).as_bytes())?;
    let listener = UnixListener::bind_addr(&addr)?;
    std::thread::Builder::new().name("fake-cuda-ctl".into()).spawn(move || serve(listener))?;
    *started = Some(pid);
    Ok(())
}

/// Called in a forked child: the parent's control thread does not exist there.
pub fn forget_server_after_fork() {
    if SERVER_PID.is_locked() {
        // SAFETY: in the child only this thread runs; a lock held at fork time by another
        // parent thread would never be released.
        unsafe { SERVER_PID.force_unlock() };
    }
    *SERVER_PID.lock() = None;
}

fn peer_allowed(s: &UnixStream) -> bool {
    let mut cred = libc::ucred { pid: 0, uid: u32::MAX, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes a ucred of `len` bytes into `cred`, which we own.
    let rc = unsafe {
        libc::getsockopt(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, (&raw mut cred).cast(), &mut len)
    };
    // SAFETY: getuid has no preconditions.
    let me = unsafe { libc::getuid() };
    rc == 0 && (cred.uid == 0 || cred.uid == me)
}

fn serve(listener: UnixListener) {
    let mut held: Option<RwLockWriteGuard<'static, ()>> = None;
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        if !peer_allowed(&conn) {
            continue;
        }
        let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
        let Ok(mut w) = conn.try_clone() else { continue };
        let mut line = String::new();
        if BufReader::new((&conn).take_limited()).read_line(&mut line).is_err() {
            continue;
        }
        let (code, value) = handle(line.trim(), &mut held);
        let _ = writeln!(w, "{code} {value}");
    }
}

trait TakeLimited {
    fn take_limited(self) -> std::io::Take<Self>
    where
        Self: Sized;
}

impl<R: std::io::Read> TakeLimited for R {
    fn take_limited(self) -> std::io::Take<Self> {
        self.take(MAX_LINE as u64)
    }
}

fn with_driver(f: impl FnOnce(&mut state::Driver) -> (CUresult, i64)) -> (CUresult, i64) {
    match STATE.lock().as_mut() {
        Some(d) => f(d),
        None => (result::NOT_INITIALIZED, 0),
    }
}

fn handle(line: &str, held: &mut Option<RwLockWriteGuard<'static, ()>>) -> (CUresult, i64) {
    let mut words = line.split_whitespace();
    match words.next() {
        Some("STATE") => with_driver(|d| (result::SUCCESS, d.process_state as i64)),
        // SAFETY: gettid has no preconditions.
        Some("TID") => (result::SUCCESS, i64::from(unsafe { libc::gettid() })),
        Some("LOCK") => {
            let ms: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
            if with_driver(|d| (0, d.process_state as i64)).1 != ProcessState::Running as i64 {
                return (result::ILLEGAL_STATE, 0);
            }
            match faults::injected(Op::Lock) {
                Some(Fault::Timeout) => return (result::TIMEOUT, 0),
                Some(_) => return (result::UNKNOWN, 0),
                None => {}
            }
            let guard = if ms == 0 { Some(GATE.write()) } else { GATE.try_write_for(Duration::from_millis(ms)) };
            let Some(guard) = guard else { return (result::TIMEOUT, 0) };
            *held = Some(guard);
            with_driver(|d| {
                d.process_state = ProcessState::Locked;
                (result::SUCCESS, 0)
            })
        }
        Some("CHECKPOINT") => with_driver(|d| {
            if d.process_state != ProcessState::Locked {
                return (result::ILLEGAL_STATE, 0);
            }
            let fault = faults::injected(Op::Checkpoint);
            match fault {
                Some(Fault::Timeout) => return (result::TIMEOUT, 0),
                Some(Fault::Fail) => return (result::UNKNOWN, 0),
                Some(Fault::Leave) | None => {}
            }
            let pid = state::pid();
            let devices: Vec<u32> = d.allocs.values().map(|a| a.device).collect();
            for (base, a) in d.allocs.iter_mut() {
                memory::checkpoint(*base, a);
            }
            // Under `leave` the capacity stays charged: the memory is still on the GPU.
            for dev in devices.into_iter().filter(|_| fault.is_none()) {
                let _ = ledger::set(&config().gpus[dev as usize], pid, 0);
            }
            d.process_state = ProcessState::Checkpointed;
            (result::SUCCESS, 0)
        }),
        Some("RESTORE") => {
            match faults::injected(Op::Restore) {
                Some(Fault::Timeout) => return (result::TIMEOUT, 0),
                Some(_) => return (result::UNKNOWN, 0),
                None => {}
            }
            let mut map: HashMap<u32, u32> = HashMap::new();
            for pair in words {
                let Some((old, new)) = pair.split_once('=') else { return (result::INVALID_VALUE, 0) };
                let (Some(old), Some(new)) = (gpu_by_hex(old), gpu_by_hex(new)) else {
                    return (result::INVALID_DEVICE, 0);
                };
                map.insert(old, new);
            }
            with_driver(|d| restore(d, &map))
        }
        Some("UNLOCK") => with_driver(|d| {
            if d.process_state != ProcessState::Locked {
                return (result::ILLEGAL_STATE, 0);
            }
            d.process_state = ProcessState::Running;
            *held = None;
            (result::SUCCESS, 0)
        }),
        _ => (result::INVALID_VALUE, 0),
    }
}

fn gpu_by_hex(h: &str) -> Option<u32> {
    config().gpus.iter().find(|g| hex(&g.uuid) == h).map(|g| g.index)
}

fn hex(u: &[u8; 16]) -> String {
    u.iter().map(|b| format!("{b:02x}")).collect()
}

fn restore(d: &mut state::Driver, map: &HashMap<u32, u32>) -> (CUresult, i64) {
    if d.process_state != ProcessState::Checkpointed {
        return (result::ILLEGAL_STATE, 0);
    }
    let pid = state::pid();
    let target = |dev: u32| map.get(&dev).copied().unwrap_or(dev);
    let mut need: HashMap<u32, u64> = HashMap::new();
    for a in d.allocs.values() {
        *need.entry(target(a.device)).or_default() += a.size as u64;
    }
    let mut charged = Vec::new();
    for (&dev, &bytes) in &need {
        match ledger::set(&config().gpus[dev as usize], pid, bytes) {
            Ok(()) => charged.push(dev),
            Err(e) => {
                for dev in charged {
                    let _ = ledger::set(&config().gpus[dev as usize], pid, 0);
                }
                return (
                    if matches!(e, LedgerError::OutOfMemory) { result::OUT_OF_MEMORY } else { result::UNKNOWN },
                    0,
                );
            }
        }
    }
    for (base, a) in d.allocs.iter_mut() {
        memory::restore(*base, a);
        a.device = target(a.device);
    }
    for c in d.contexts.values_mut() {
        c.device = target(c.device);
    }
    d.primary = d.primary.iter().map(|(dev, h)| (target(*dev), *h)).collect();
    d.process_state = ProcessState::Locked;
    (result::SUCCESS, 0)
}

/// Sends one request to the target's control thread.
fn request(pid: c_int, line: &str) -> (CUresult, i64) {
    let Ok(pid) = u32::try_from(pid) else { return (result::INVALID_VALUE, 0) };
    let Ok(addr) = SocketAddr::from_abstract_name(name_of(pid).as_bytes()) else { return (result::UNKNOWN, 0) };
    // No control socket: the process does not exist or never initialised CUDA.
    let Ok(mut s) = UnixStream::connect_addr(&addr) else { return (result::NOT_INITIALIZED, 0) };
    if writeln!(s, "{line}").is_err() {
        return (result::UNKNOWN, 0);
    }
    let mut reply = String::new();
    if BufReader::new(s.take_limited()).read_line(&mut reply).is_err() {
        return (result::UNKNOWN, 0);
    }
    let mut w = reply.split_whitespace();
    let code = w.next().and_then(|c| c.parse().ok()).unwrap_or(result::UNKNOWN);
    let value = w.next().and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, value)
}

fn guarded(f: impl FnOnce() -> CUresult) -> CUresult {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(result::UNKNOWN)
}

#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessLock(pid: c_int, args: *const LockArgs) -> CUresult {
    guarded(|| {
        // SAFETY: optional args; when non-null they point at a CUcheckpointLockArgs.
        let timeout = if args.is_null() { 0 } else { unsafe { (*args).timeout_ms } };
        request(pid, &format!("LOCK {timeout}")).0
    })
}

#[no_mangle]
pub extern "C" fn cuCheckpointProcessCheckpoint(pid: c_int, _args: *const u64) -> CUresult {
    guarded(|| request(pid, "CHECKPOINT").0)
}

#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessRestore(pid: c_int, args: *const RestoreArgs) -> CUresult {
    guarded(|| {
        let mut line = String::from("RESTORE");
        if !args.is_null() {
            // SAFETY: non-null args point at a CUcheckpointRestoreArgs.
            let a = unsafe { *args };
            if a.gpu_pairs_count > 64 {
                return result::INVALID_VALUE;
            }
            if a.gpu_pairs_count > 0 {
                if a.gpu_pairs.is_null() {
                    return result::INVALID_VALUE;
                }
                // SAFETY: gpu_pairs points at gpu_pairs_count pairs per the API contract.
                let pairs = unsafe { std::slice::from_raw_parts(a.gpu_pairs, a.gpu_pairs_count as usize) };
                for p in pairs {
                    line.push_str(&format!(" {}={}", hex(&p.old_uuid), hex(&p.new_uuid)));
                }
            }
        }
        request(pid, &line).0
    })
}

#[no_mangle]
pub extern "C" fn cuCheckpointProcessUnlock(pid: c_int, _args: *const u64) -> CUresult {
    guarded(|| request(pid, "UNLOCK").0)
}

#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessGetState(pid: c_int, out: *mut c_int) -> CUresult {
    guarded(|| {
        if out.is_null() {
            return result::INVALID_VALUE;
        }
        let (code, v) = request(pid, "STATE");
        // SAFETY: non-null output pointer.
        unsafe { out.write(v as c_int) };
        code
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessGetRestoreThreadId(pid: c_int, tid: *mut c_int) -> CUresult {
    guarded(|| {
        if tid.is_null() {
            return result::INVALID_VALUE;
        }
        let (code, v) = request(pid, "TID");
        // SAFETY: non-null output pointer.
        unsafe { tid.write(v as c_int) };
        code
    })
}
