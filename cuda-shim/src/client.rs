//! The shim's side of the lease protocol: registration, blocking lease requests, and
//! a reader thread that applies grants and performs revocations.
//!
//! Environment (read once per process, never on the hot path), set by the daemon:
//! `NBOS_LEASE_SOCKET` (the host's socket; unset = unmanaged pass-through),
//! `NBOS_KERNEL_ID`, `NBOS_REPLICA`.

use std::io::ErrorKind;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nbos_lease_proto::{read_message, write_message, GpuUuid, Message, ReadError};
use parking_lot::{Condvar, Mutex};

use crate::abi::{self, CUresult};
use crate::driver;
use crate::gate::{LeaseView, CALLS, GATE, MAX_DEVICES, WAITS};

/// Where the client stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Not started in this process (fresh, or a forked child).
    Fresh,
    /// No host: pass-through.
    Unmanaged,
    /// Registered with the host.
    Registered,
    /// The host refused this process, or the connection broke.
    Refused(String),
}

struct Client {
    phase: Phase,
    writer: Option<UnixStream>,
    requested: bool,
}

// Lock order: CLIENT before GATE; nothing holding GATE shared may take CLIENT.
static CLIENT: Mutex<Client> = Mutex::new(Client { phase: Phase::Fresh, writer: None, requested: false });
/// Memory limit of the process the host set, bytes (0: none); an atomic so hooks under
/// the gate can read it.
static MEMORY_LIMIT: AtomicU64 = AtomicU64::new(0);
static GRANTED: Condvar = Condvar::new();
/// The reader thread's socket fd, closed in a forked child (which has no reader thread),
/// so a child never keeps its parent's lease connection open.
static READER_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);
/// Contexts the process created, synchronised on revoke.
static CONTEXTS: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// Memory limit per GPU the host set (0: none).
pub fn memory_limit() -> u64 {
    MEMORY_LIMIT.load(Ordering::Relaxed)
}

/// The client's phase (starting it if needed).
pub fn phase() -> Phase {
    ensure_started();
    CLIENT.lock().phase.clone()
}

/// Remembers a context for synchronisation at revoke.
pub fn track_context(ctx: usize) {
    let mut v = CONTEXTS.lock();
    if ctx != 0 && !v.contains(&ctx) {
        v.push(ctx);
    }
}

/// Starts the client once per process (again in a forked child).
pub fn ensure_started() {
    let mut c = CLIENT.lock();
    if c.phase != Phase::Fresh {
        return;
    }
    install_fork_handlers();
    crate::counters::open_for_this_process();
    let Some(path) = std::env::var_os("NBOS_LEASE_SOCKET") else {
        c.phase = Phase::Unmanaged;
        let mut g = GATE.write();
        g.unmanaged = true;
        g.bound = true;
        return;
    };
    match register(&path) {
        Ok((stream, device_count, interval, memory_limit)) => {
            let reader = match stream.try_clone() {
                Ok(r) => r,
                Err(e) => {
                    c.phase = Phase::Refused(format!("socket clone: {e}"));
                    return;
                }
            };
            {
                let mut g = GATE.write();
                g.devices = (device_count as usize).min(MAX_DEVICES);
                g.bound = false;
            }
            READER_FD.store(std::os::fd::AsRawFd::as_raw_fd(&reader), Ordering::Relaxed);
            c.phase = Phase::Registered;
            c.writer = Some(stream);
            MEMORY_LIMIT.store(memory_limit, Ordering::Relaxed);
            let spawned =
                std::thread::Builder::new().name("nbos-lease".into()).spawn(move || reader_loop(reader, interval));
            if let Err(e) = spawned {
                c.phase = Phase::Refused(format!("lease thread: {e}"));
            }
        }
        Err(reason) => {
            eprintln!("nbos-cuda-shim: lease registration failed: {reason}");
            c.phase = Phase::Refused(reason);
        }
    }
}

fn register(path: &std::ffi::OsStr) -> Result<(UnixStream, u32, u32, u64), String> {
    let mut s = UnixStream::connect(path).map_err(|e| format!("connect {}: {e}", path.to_string_lossy()))?;
    let kernel_id = std::env::var("NBOS_KERNEL_ID").unwrap_or_default();
    let replica = std::env::var("NBOS_REPLICA").ok().and_then(|r| r.parse().ok()).unwrap_or(0);
    let m = Message::Register { kernel_id, replica, pid: std::process::id() };
    write_message(&mut s, &m).map_err(|e| format!("send register: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    match read_message(&mut s) {
        Ok(Message::Registered { device_count, activity_interval_ms, memory_limit_bytes }) => {
            s.set_read_timeout(None).map_err(|e| e.to_string())?;
            Ok((s, device_count, activity_interval_ms, memory_limit_bytes))
        }
        Ok(Message::Refused { reason }) => Err(format!("refused by host: {reason}")),
        Ok(other) => Err(format!("unexpected reply {other:?}")),
        Err(e) => Err(e.to_string()),
    }
}

fn send(m: &Message) -> Result<(), CUresult> {
    let mut c = CLIENT.lock();
    let Some(w) = c.writer.as_mut() else { return Err(abi::NOT_PERMITTED) };
    write_message(w, m).map_err(|_| abi::UNKNOWN)
}

/// Blocks until a lease is held (asking the host for one), or fails with a CUresult
/// when the host refused this process or is gone.
pub fn acquire() -> Result<(), CUresult> {
    ensure_started();
    let mut c = CLIENT.lock();
    loop {
        match &c.phase {
            Phase::Unmanaged => return Ok(()),
            Phase::Refused(_) => return Err(abi::NOT_PERMITTED),
            Phase::Fresh => return Err(abi::UNKNOWN),
            Phase::Registered => {}
        }
        if GATE.read().bound {
            return Ok(());
        }
        if !c.requested {
            let devices = GATE.read().devices as u32;
            let Some(w) = c.writer.as_mut() else { return Err(abi::NOT_PERMITTED) };
            if write_message(w, &Message::Request { gpus: devices }).is_err() {
                c.phase = Phase::Refused("lease connection lost".into());
                return Err(abi::UNKNOWN);
            }
            c.requested = true;
            WAITS.fetch_add(1, Ordering::Relaxed);
        }
        GRANTED.wait(&mut c);
    }
}

/// The real driver's devices and their UUIDs, enumerated once (GPUs do not change
/// under a running process), so a grant costs no driver calls.
fn devices() -> &'static [(i32, [u8; 16])] {
    static DEVICES: std::sync::OnceLock<Vec<(i32, [u8; 16])>> = std::sync::OnceLock::new();
    DEVICES.get_or_init(|| {
        type Init = unsafe extern "C" fn(u32) -> u32;
        type Count = unsafe extern "C" fn(*mut i32) -> u32;
        type Get = unsafe extern "C" fn(*mut i32, i32) -> u32;
        type Uuid = unsafe extern "C" fn(*mut [u8; 16], i32) -> u32;
        let mut out = Vec::new();
        let (Some(init), Some(count), Some(get), Some(uuid)) = (
            driver::by_name::<Init>(c"cuInit"),
            driver::by_name::<Count>(c"cuDeviceGetCount"),
            driver::by_name::<Get>(c"cuDeviceGet"),
            driver::by_name::<Uuid>(c"cuDeviceGetUuid"),
        ) else {
            return out;
        };
        let mut n = 0;
        // SAFETY: real-driver entry points with these C signatures; outputs point at locals.
        unsafe {
            init(0);
            if count(&mut n) != 0 {
                return out;
            }
        }
        for p in 0..n {
            let (mut dev, mut u) = (0, [0u8; 16]);
            // SAFETY: as above.
            if unsafe { get(&mut dev, p) } == 0 && unsafe { uuid(&mut u, dev) } == 0 {
                out.push((dev, u));
            }
        }
        out
    })
}

fn physical_ordinals(uuids: &[GpuUuid]) -> [i32; MAX_DEVICES] {
    let mut out = [-1; MAX_DEVICES];
    for (v, want) in uuids.iter().enumerate().take(MAX_DEVICES) {
        if let Some((dev, _)) = devices().iter().find(|(_, u)| u == want) {
            out[v] = *dev;
        }
    }
    out
}

/// Stops submissions (exclusive gate), waits for all work of every context, unbinds.
fn revoke(lease: u64) {
    type Push = unsafe extern "C" fn(usize) -> u32;
    type Sync = unsafe extern "C" fn() -> u32;
    type Pop = unsafe extern "C" fn(*mut usize) -> u32;
    let mut g = GATE.write();
    if let (Some(push), Some(sync), Some(pop)) = (
        driver::by_name::<Push>(c"cuCtxPushCurrent_v2"),
        driver::by_name::<Sync>(c"cuCtxSynchronize"),
        driver::by_name::<Pop>(c"cuCtxPopCurrent_v2"),
    ) {
        for &ctx in CONTEXTS.lock().iter() {
            let mut popped = 0usize;
            // SAFETY: real-driver entry points; ctx is a context this process created.
            unsafe {
                if push(ctx) == 0 {
                    sync();
                    pop(&mut popped);
                }
            }
        }
    }
    g.bound = false;
    drop(g);
    let _ = send(&Message::Released { lease });
}

fn reader_loop(mut s: UnixStream, interval_ms: u32) {
    let tick = (interval_ms > 0).then(|| Duration::from_millis(u64::from(interval_ms)));
    let _ = s.set_read_timeout(tick);
    let mut reported = 0u64;
    // Activity goes out once per interval, not after every frame: a report right after
    // a grant would wake the host while the granted thread is being woken.
    let mut last_report = std::time::Instant::now();
    loop {
        match read_message(&mut s) {
            Ok(Message::Grant { lease, gpus }) => {
                let physical = physical_ordinals(&gpus);
                {
                    let mut g = GATE.write();
                    let view: &mut LeaseView = &mut g;
                    view.physical = physical;
                    view.lease = lease;
                    view.bound = true;
                }
                CLIENT.lock().requested = false;
                GRANTED.notify_all();
            }
            Ok(Message::Revoke { lease }) => revoke(lease),
            Ok(Message::Refused { reason }) => {
                fail(format!("host ended the lease connection: {reason}"));
                return;
            }
            Ok(_) => {}
            Err(ReadError::Io(e)) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => {
                fail(format!("lease connection: {e}"));
                return;
            }
        }
        let calls = CALLS.load(Ordering::Relaxed);
        let due = tick.is_some_and(|t| last_report.elapsed() >= t);
        if due && calls != reported && GATE.read().bound {
            reported = calls;
            last_report = std::time::Instant::now();
            let _ = send(&Message::Activity { calls, waits: WAITS.load(Ordering::Relaxed) });
        }
    }
}

fn fail(reason: String) {
    // The reader thread is about to close its socket: forget the fd number first.
    READER_FD.store(-1, Ordering::Relaxed);
    let mut c = CLIENT.lock();
    if c.phase == Phase::Registered {
        c.phase = Phase::Refused(reason);
    }
    c.writer = None;
    drop(c);
    GRANTED.notify_all();
}

fn install_fork_handlers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: plain extern "C" handlers that live for the program.
        unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    });
}

extern "C" fn prepare() {
    // Wait for in-flight gated calls (and any revocation) to finish, and hold the locks
    // across fork so the child never inherits them mid-update.
    std::mem::forget(GATE.write());
    std::mem::forget(CLIENT.lock());
    std::mem::forget(CONTEXTS.lock());
}

extern "C" fn parent() {
    // SAFETY: `prepare` took these on this thread and forgot the guards.
    unsafe {
        CONTEXTS.force_unlock();
        CLIENT.force_unlock();
        GATE.force_unlock_write();
    }
}

extern "C" fn child() {
    // SAFETY: as in `parent`; in the child only this thread exists.
    unsafe {
        CONTEXTS.force_unlock();
        CLIENT.force_unlock();
        GATE.force_unlock_write();
    }
    // The child is a new process for the host: it registers again on its next call
    // (the host accepts it as a descendant of a registered kernel process). The
    // parent's connection stays the parent's: closing our copy does not affect it.
    let mut c = CLIENT.lock();
    c.phase = Phase::Fresh;
    c.writer = None;
    c.requested = false;
    drop(c);
    let fd = READER_FD.swap(-1, Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: this fd is the child's copy of the parent's reader socket; the reader
        // thread that owns it in the parent does not exist here, so nothing else uses it.
        unsafe { libc::close(fd) };
    }
    CONTEXTS.lock().clear();
    crate::counters::forget_after_fork();
    *GATE.write() = LeaseView { bound: false, lease: 0, devices: 0, physical: [-1; MAX_DEVICES], unmanaged: false };
}
