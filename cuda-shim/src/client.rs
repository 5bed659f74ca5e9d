//! The shim's side of the lease protocol: registration, blocking lease requests, and
//! a lease thread that performs revocations.
//!
//! Who reads the socket: frames from the host only ever answer the lease state, so the
//! read side belongs to whoever is waiting for the next one. Without a lease, the thread
//! that needs one sends `Request` and reads the `Grant` itself (the host's reply wakes the
//! very thread that is blocked: one thread hop each way, nothing handed to a third
//! thread). While a lease is held, the lease thread reads (the next frame is a `Revoke`).
//! The read side is passed between them through [`Client::read_half`] with any bytes
//! already buffered, so no frame is split or lost in a hand-over.
//!
//! Environment (read once per process, never on the hot path), set by the daemon:
//! `NBOS_LEASE_SOCKET` (the host's socket; unset = unmanaged pass-through),
//! `NBOS_KERNEL_ID`, `NBOS_REPLICA`, `NBOS_GPU_MEMORY_LIMIT_BYTES` (the kernel's own
//! device-memory limit; the host's, if smaller, still applies). The real driver's path comes
//! from the host's `Registered` reply ([`registered_driver_path`]), not from the environment.
//!
//! A grant naming a GPU whose UUID the driver does not list leaves that virtual ordinal
//! [`NOT_VISIBLE`] (calls naming it fail; no other GPU stands in) and is reported to the
//! host as `GpusNotVisible`.

use std::io::{BufReader, ErrorKind};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::time::Duration;

use nbos_lease_proto::{read_message, write_message, GpuUuid, Message, ReadError};
use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::abi::{self, CUresult};
use crate::driver;
use crate::lease_view::{LeaseView, CALLS, GATE, MAX_DEVICES, NOT_VISIBLE, WAITS};
use crate::memory_limit;

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

/// The socket's read side with what it has buffered (a frame arrives in one read).
type ReadHalf = BufReader<UnixStream>;

struct Client {
    phase: Phase,
    writer: Option<UnixStream>,
    /// A thread has sent `Request` and reads the answer; others wait on [`GRANTED`].
    requested: bool,
    /// The read side when no thread is reading it.
    read_half: Option<ReadHalf>,
    /// The read side is the lease thread's (a lease is held: the next frame is a revoke).
    reader_turn: bool,
}

// Lock order: CLIENT before GATE; nothing holding GATE shared may take CLIENT.
static CLIENT: Mutex<Client> =
    Mutex::new(Client { phase: Phase::Fresh, writer: None, requested: false, read_half: None, reader_turn: false });
/// Signalled when a lease is granted, the read side is parked, or the client failed.
static GRANTED: Condvar = Condvar::new();
/// Signalled when the read side becomes the lease thread's (or the client failed).
static READER_TURN: Condvar = Condvar::new();
/// The read side's fd, closed in a forked child when the parent had it out on a thread
/// (which does not exist in the child), so a child never keeps its parent's lease
/// connection open.
static READER_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);
/// Contexts the process created, synchronised on revoke.
static CONTEXTS: Mutex<Vec<usize>> = Mutex::new(Vec::new());
/// The real driver's path the host named in `Registered` (set once; a forked child keeps it,
/// and its driver is already loaded anyway).
static DRIVER_PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// The real driver library the host told this process to load, registering first if needed;
/// `None` when the process is not registered (unmanaged, refused, or the host named none).
pub fn registered_driver_path() -> Option<String> {
    ensure_started();
    DRIVER_PATH.get().filter(|p| !p.is_empty()).cloned()
}

/// The kernel's own device-memory limit the daemon set for this process
/// (`NBOS_GPU_MEMORY_LIMIT_BYTES`), bytes; 0 when unset.
const MEMORY_LIMIT_ENV: &str = "NBOS_GPU_MEMORY_LIMIT_BYTES";

fn own_memory_limit() -> Result<u64, String> {
    match std::env::var(MEMORY_LIMIT_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(0),
        Ok(v) if v.trim().is_empty() => Ok(0),
        // A limit the shim cannot read must not silently become no limit.
        Ok(v) => v.trim().parse().map_err(|_| format!("{MEMORY_LIMIT_ENV}={v:?} is not a number of bytes")),
        Err(e) => Err(format!("{MEMORY_LIMIT_ENV}: {e}")),
    }
}

/// The tighter of two limits where 0 means none.
fn tighter(a: u64, b: u64) -> u64 {
    match (a, b) {
        (0, x) | (x, 0) => x,
        (a, b) => a.min(b),
    }
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
    let own_limit = match own_memory_limit() {
        Ok(l) => l,
        Err(reason) => {
            eprintln!("nbos-cuda-shim: {reason}; GPU calls are refused");
            c.phase = Phase::Refused(reason);
            return;
        }
    };
    let Some(path) = std::env::var_os("NBOS_LEASE_SOCKET") else {
        crate::counters::open_for_this_process(std::process::id());
        memory_limit::set_limit(own_limit);
        c.phase = Phase::Unmanaged;
        let mut g = GATE.write();
        g.unmanaged = true;
        g.bound = true;
        return;
    };
    match register(&path) {
        Ok((stream, device_count, interval, memory_limit, host_pid, driver_path)) => {
            let _ = DRIVER_PATH.set(driver_path);
            crate::host_pid::set(host_pid);
            crate::counters::open_for_this_process(host_pid);
            let reader = match stream.try_clone() {
                Ok(r) => r,
                Err(e) => {
                    c.phase = Phase::Refused(format!("socket clone: {e}"));
                    return;
                }
            };
            // Activity ticks: the socket's receive timeout (shared by both fds) wakes the
            // lease thread; a requester reading meanwhile just reads again.
            let tick = (interval > 0).then(|| Duration::from_millis(u64::from(interval)));
            if let Err(e) = reader.set_read_timeout(tick) {
                c.phase = Phase::Refused(format!("socket timeout: {e}"));
                return;
            }
            {
                let mut g = GATE.write();
                g.devices = (device_count as usize).min(MAX_DEVICES);
                g.bound = false;
            }
            READER_FD.store(std::os::fd::AsRawFd::as_raw_fd(&reader), Ordering::Relaxed);
            c.phase = Phase::Registered;
            c.writer = Some(stream);
            c.read_half = Some(BufReader::with_capacity(1024, reader));
            c.reader_turn = false;
            memory_limit::set_limit(tighter(own_limit, memory_limit));
            let spawned = std::thread::Builder::new().name("nbos-lease".into()).spawn(move || lease_thread(tick));
            if let Err(e) = spawned {
                fail_locked(&mut c, format!("lease thread: {e}"));
            }
        }
        Err(reason) => {
            eprintln!("nbos-cuda-shim: lease registration failed: {reason}");
            c.phase = Phase::Refused(reason);
        }
    }
}

/// What the host answered a registration with: the stream, device count, activity interval
/// (ms), memory limit (bytes), host pid and the driver library's path.
type Registration = (UnixStream, u32, u32, u64, u32, String);

fn register(path: &std::ffi::OsStr) -> Result<Registration, String> {
    let mut s = UnixStream::connect(path).map_err(|e| format!("connect {}: {e}", path.to_string_lossy()))?;
    let kernel_id = std::env::var("NBOS_KERNEL_ID").unwrap_or_default();
    let replica = std::env::var("NBOS_REPLICA").ok().and_then(|r| r.parse().ok()).unwrap_or(0);
    // Our pid as we see it; the host checks it against the socket's peer (in its namespace,
    // or ours when we are in a PID namespace of our own) and answers with its own view.
    let m = Message::Register { kernel_id, replica, pid: std::process::id() };
    write_message(&mut s, &m).map_err(|e| format!("send register: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    match read_message(&mut s) {
        Ok(Message::Registered { device_count, activity_interval_ms, memory_limit_bytes, host_pid, driver_path }) => {
            s.set_read_timeout(None).map_err(|e| e.to_string())?;
            Ok((s, device_count, activity_interval_ms, memory_limit_bytes, host_pid, driver_path))
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
        // Another thread is asking, or the lease thread still has the read side (it is
        // finishing a revocation and parks it next): wait for either to finish.
        if c.requested || c.reader_turn || c.read_half.is_none() {
            GRANTED.wait(&mut c);
            continue;
        }
        let devices = GATE.read().devices as u32;
        let Some(w) = c.writer.as_mut() else { return Err(abi::NOT_PERMITTED) };
        if write_message(w, &Message::Request { gpus: devices }).is_err() {
            fail_locked(&mut c, "lease connection lost".into());
            return Err(abi::UNKNOWN);
        }
        WAITS.fetch_add(1, Ordering::Relaxed);
        let Some(mut r) = c.read_half.take() else { return Err(abi::UNKNOWN) };
        c.requested = true;
        // Read the answer on this thread, without the client lock (ungated calls of other
        // threads go on meanwhile).
        let answer = MutexGuard::unlocked(&mut c, || await_grant(&mut r));
        c.requested = false;
        match answer {
            Ok(()) => {
                c.read_half = Some(r);
                c.reader_turn = true;
                READER_TURN.notify_one();
                GRANTED.notify_all();
                return Ok(());
            }
            Err(reason) => {
                drop(r);
                fail_locked(&mut c, reason);
                return Err(abi::NOT_PERMITTED);
            }
        }
    }
}

/// How long a thread that asked for a lease polls the socket before it sleeps in `read`.
/// A free GPU is granted within tens of µs; a thread that slept must then be scheduled
/// again, and on a busy host that means behind whatever else runs there (traced on the
/// 2-core dev VM while other builds ran: the grant written 20 µs after the request, the
/// woken thread running 0.4–4.5 ms later). Polling longer competes for the CPU with the
/// host when it has work to do (a restore): 50 µs beat 100 and 200 µs on both the plain
/// and the restoring acquire (`cuda-shim/README.md`).
const GRANT_POLL: Duration = Duration::from_micros(50);

/// Returns once `r` has a frame to read, or `budget` has passed (then `read` blocks).
fn poll_readable(r: &ReadHalf, budget: Duration) {
    if !r.buffer().is_empty() {
        return;
    }
    let fd = std::os::fd::AsRawFd::as_raw_fd(r.get_ref());
    let start = std::time::Instant::now();
    loop {
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd; a zero timeout never blocks.
        let ready = unsafe { libc::poll(&mut pfd, 1, 0) };
        // Readable, or an error or hang-up that the read reports.
        if ready != 0 || start.elapsed() >= budget {
            return;
        }
        std::hint::spin_loop();
    }
}

/// Reads frames until the host grants a lease, and applies the grant to the gate.
fn await_grant(r: &mut ReadHalf) -> Result<(), String> {
    poll_readable(r, GRANT_POLL);
    loop {
        match read_message(r) {
            Ok(Message::Grant { lease, gpus }) => {
                apply_grant(lease, &gpus);
                return Ok(());
            }
            // Nothing is held, so nothing needs stopping: acknowledge at once.
            Ok(Message::Revoke { lease }) => {
                let _ = send(&Message::Released { lease });
            }
            Ok(Message::Refused { reason }) => return Err(format!("host ended the lease connection: {reason}")),
            Ok(_) => {}
            Err(ReadError::Io(e)) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => return Err(format!("lease connection: {e}")),
        }
    }
}

/// Applies a grant to the gate, then tells the host about any GPU of it that the driver
/// does not list (calls naming those fail; see [`physical_ordinals`]). Called without
/// the client lock (the report takes it).
fn apply_grant(lease: u64, gpus: &[GpuUuid]) {
    // The driver's device list is read outside the gate's write lock (its first use
    // enumerates the driver); the device count is fixed at registration.
    let count = GATE.read().devices;
    let (physical, missing) = physical_ordinals(gpus, count);
    {
        let mut g = GATE.write();
        let view: &mut LeaseView = &mut g;
        view.physical = physical;
        view.lease = lease;
        view.bound = true;
    }
    if !missing.is_empty() {
        let names: Vec<String> = missing.iter().map(uuid_text).collect();
        eprintln!(
            "nbos-cuda-shim: lease {lease} names GPU(s) {} that this process's driver does not list; \
             calls on them fail with CUDA_ERROR_INVALID_DEVICE",
            names.join(", ")
        );
        let _ = send(&Message::GpusNotVisible { lease, gpus: missing });
    }
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as `nvidia-smi -L` prints a UUID.
fn uuid_text(u: &GpuUuid) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!("GPU-{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
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

/// The physical ordinal of each of the process's `count` virtual ordinals under a
/// grant of `uuids`, and the granted UUIDs the driver does not list. A virtual ordinal
/// without a visible GPU (not listed, or the grant named fewer GPUs) is [`NOT_VISIBLE`]:
/// never the driver's GPU of the same number, which may be another kernel's.
fn physical_ordinals(uuids: &[GpuUuid], count: usize) -> ([i32; MAX_DEVICES], Vec<GpuUuid>) {
    ordinals_among(devices(), uuids, count)
}

/// [`physical_ordinals`] given the driver's `(ordinal, UUID)` list.
fn ordinals_among(listed: &[(i32, [u8; 16])], uuids: &[GpuUuid], count: usize) -> ([i32; MAX_DEVICES], Vec<GpuUuid>) {
    let mut out = [NOT_VISIBLE; MAX_DEVICES];
    let mut missing = Vec::new();
    for (v, want) in uuids.iter().enumerate().take(MAX_DEVICES) {
        match listed.iter().find(|(_, u)| u == want) {
            Some((dev, _)) => out[v] = *dev,
            None if v < count => missing.push(*want),
            None => {}
        }
    }
    (out, missing)
}

/// Stops submissions (exclusive gate), waits for all work of every context, unbinds.
fn revoke() {
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
}

/// The lease thread: reads the socket while a lease is held (revocations, activity
/// ticks), and parks the read side for the next requester when it is revoked.
fn lease_thread(tick: Option<Duration>) {
    let mut reported = 0u64;
    // Activity goes out once per interval, not after every frame.
    let mut last_report = std::time::Instant::now();
    loop {
        let mut r = {
            let mut c = CLIENT.lock();
            loop {
                if c.phase != Phase::Registered {
                    return;
                }
                if c.reader_turn {
                    if let Some(r) = c.read_half.take() {
                        break r;
                    }
                }
                READER_TURN.wait(&mut c);
            }
        };
        let outcome = read_while_leased(&mut r, tick, &mut reported, &mut last_report);
        let mut c = CLIENT.lock();
        match outcome {
            Ok(lease) => {
                // Park the read side before acknowledging, so the next gated call finds it
                // at once and asks for a lease itself.
                c.read_half = Some(r);
                c.reader_turn = false;
                GRANTED.notify_all();
                drop(c);
                let _ = send(&Message::Released { lease });
            }
            Err(reason) => {
                drop(r);
                fail_locked(&mut c, reason);
                return;
            }
        }
    }
}

/// Reads while a lease is held; returns the lease revoked (after stopping submissions and
/// synchronising), or why the connection ended.
fn read_while_leased(
    r: &mut ReadHalf,
    tick: Option<Duration>,
    reported: &mut u64,
    last_report: &mut std::time::Instant,
) -> Result<u64, String> {
    loop {
        match read_message(r) {
            Ok(Message::Revoke { lease }) => {
                revoke();
                return Ok(lease);
            }
            // Not asked for while a lease is held; take the host's word for the GPUs.
            Ok(Message::Grant { lease, gpus }) => apply_grant(lease, &gpus),
            Ok(Message::Refused { reason }) => return Err(format!("host ended the lease connection: {reason}")),
            Ok(_) => {}
            Err(ReadError::Io(e)) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => return Err(format!("lease connection: {e}")),
        }
        let calls = CALLS.load(Ordering::Relaxed);
        let due = tick.is_some_and(|t| last_report.elapsed() >= t);
        if due && calls != *reported && GATE.read().bound {
            *reported = calls;
            *last_report = std::time::Instant::now();
            let _ = send(&Message::Activity { calls, waits: WAITS.load(Ordering::Relaxed) });
        }
    }
}

/// The connection is gone (the caller dropped the read side): later gated calls fail,
/// waiting ones wake up, the lease thread ends.
fn fail_locked(c: &mut Client, reason: String) {
    if c.phase == Phase::Registered {
        c.phase = Phase::Refused(reason);
    }
    c.writer = None;
    c.read_half = None;
    // The read side is closed now (here or by the thread that had it): its fd number may be
    // reused, so a forked child must never close it.
    READER_FD.store(-1, Ordering::Relaxed);
    GRANTED.notify_all();
    READER_TURN.notify_all();
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
    c.reader_turn = false;
    let fd = READER_FD.swap(-1, Ordering::Relaxed);
    match c.read_half.take() {
        Some(parked) => drop(parked),
        // SAFETY: the parent had the read side out on a thread that does not exist in the
        // child; this fd is the child's copy of it and nothing else here uses it.
        None if fd >= 0 => unsafe {
            libc::close(fd);
        },
        None => {}
    }
    drop(c);
    CONTEXTS.lock().clear();
    crate::counters::forget_after_fork();
    crate::memory_limit::forget_after_fork();
    *GATE.write() = LeaseView::INITIAL;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_granted_gpu_the_driver_does_not_list_is_not_visible_and_reported() {
        let (a, b, gone) = ([1u8; 16], [2u8; 16], [9u8; 16]);
        let listed = [(0, a), (1, b)];
        let (physical, missing) = ordinals_among(&listed, &[b, gone], 2);
        assert_eq!(physical[..2], [1, NOT_VISIBLE]);
        assert_eq!(missing, vec![gone]);
        // A grant naming fewer GPUs than the process sees leaves the rest unusable too.
        let (physical, missing) = ordinals_among(&listed, &[a], 2);
        assert_eq!(physical[..2], [0, NOT_VISIBLE]);
        assert!(missing.is_empty());
    }

    #[test]
    fn the_kernels_limit_and_the_hosts_combine_to_the_tighter() {
        assert_eq!(tighter(0, 0), 0);
        assert_eq!(tighter(5, 0), 5);
        assert_eq!(tighter(0, 7), 7);
        assert_eq!(tighter(5, 7), 5);
        assert_eq!(uuid_text(&[0xfa; 16]), "GPU-fafafafa-fafa-fafa-fafa-fafafafafafa");
    }
}
