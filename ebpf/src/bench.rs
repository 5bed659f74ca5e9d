//! The price of observation on the production path, measured in one run.
//!
//! A child process runs a launch loop under the real CUDA shim (`LD_PRELOAD`, forwarding to the
//! driver library, writing its counters file in `NBOS_SHIM_COUNTERS_DIR`), with the environment
//! the caller gives it: the daemon's `nbos bench observe` passes exactly what kernel processes
//! get (`ShimEnvironment`, and a lease server with the daemon's activity interval);
//! [`ShimEnv::unmanaged`] builds the same without a lease server, for this crate's bench and tests.
//! The child is any executable that calls [`child_main`] (`nbos bench observe --child`, this
//! crate's `nbos-observe-loop`).
//!
//! Each round times the same loop twice in that child, once with the observer attached as the
//! daemon runs it (eBPF: launches read from the shim's counters file, uprobes on the driver
//! library's copy, memset and synchronise entry points, the exit tracepoint) and once without
//! any observer, the order alternating between rounds. The figure is the median over rounds of
//! the paired differences (observed − unobserved, ns per launch): on a shared machine the speed
//! drifts between rounds, much less within one.

use std::ffi::{c_void, CStr, CString, OsString};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::config::{ModeRequest, ObserverConfig};
use crate::{Mode, Observer, ObserverError};

/// The program that runs the child's loop ([`child_main`]).
#[derive(Clone, Debug)]
pub struct ChildCommand {
    /// The executable.
    pub program: PathBuf,
    /// Its arguments (e.g. `bench observe --child`).
    pub args: Vec<OsString>,
}

/// What to run.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// The driver library the shim forwards to and the observer probes (tests/fake-cuda's
    /// `libfake_cuda.so`, or a real `libcuda.so.1`).
    pub library: PathBuf,
    /// The child that runs the loop.
    pub child: ChildCommand,
    /// The child's environment on top of this process's: the shim's (`LD_PRELOAD`,
    /// `NBOS_CUDA_DRIVER`, `NBOS_SHIM_COUNTERS_DIR`, and `NBOS_LEASE_SOCKET` when a lease server
    /// runs). `NBOS_LEASE_SOCKET` is removed unless set here.
    pub env: Vec<(OsString, OsString)>,
    /// Where the shim writes its counters files (the observer reads them).
    pub counters_dir: PathBuf,
    /// Launches per timed loop.
    pub launches: u64,
    /// One `cuCtxSynchronize` every this many launches, as a training loop does (0: none).
    pub sync_every: u64,
    /// Rounds (pairs of loops); medians over rounds are reported.
    pub rounds: usize,
}

/// The result, printed as one JSON object by `nbos bench observe --json`.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// `ebpf`, or `procfs` when BPF could not be loaded.
    pub mode: Mode,
    /// The driver library probed.
    pub library: PathBuf,
    /// The shim the child ran under (its `LD_PRELOAD`).
    pub shim: Option<PathBuf>,
    /// Whether the child's shim was registered with a lease server (`NBOS_LEASE_SOCKET` set),
    /// as kernel processes are; `false`: unmanaged pass-through.
    pub managed: bool,
    /// Uprobes the observer attached.
    pub probes: usize,
    /// Launches per timed loop.
    pub launches: u64,
    /// Synchronisations per loop.
    pub syncs: u64,
    /// Rounds measured.
    pub rounds: usize,
    /// Median ns per launch (through the shim, counting) with no observer.
    pub unobserved_ns_per_launch: f64,
    /// Median ns per launch with the observer attached.
    pub observed_ns_per_launch: f64,
    /// What observation adds per launch: median over rounds of (observed − unobserved).
    pub added_ns_per_launch: f64,
    /// The same, percent of the unobserved median.
    pub added_pct: f64,
    /// Added ns per probed call (`added_ns_per_launch` / syncs per launch): the uprobe hit,
    /// `null` without probed calls in the loop or without eBPF.
    pub uprobe_cost_ns: Option<f64>,
    /// Launches the observer reported for the child over the last observed loop (from the
    /// shim's counters file; must equal `launches`).
    pub counted_launches: u64,
    /// The child's exit (the kernel's timestamp in eBPF mode; the sweep that found it gone in
    /// procfs mode) → its exit event received by a subscriber, ms: how late the node learns
    /// that a kernel process died.
    pub exit_event_ms: f64,
}

/// Errors of the benchmark.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The library could not be loaded or lacks an entry point.
    #[error("{path}: {reason}")]
    Library {
        /// The library.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// A driver call returned an error.
    #[error("{call} returned CUDA error {code}")]
    Driver {
        /// The call.
        call: &'static str,
        /// Its CUresult.
        code: i32,
    },
    /// The child process failed or broke the protocol.
    #[error("benchmark child {program}: {reason}")]
    Child {
        /// The child's executable.
        program: PathBuf,
        /// What happened.
        reason: String,
    },
    /// The observer failed.
    #[error(transparent)]
    Observer(#[from] ObserverError),
    /// Scratch files.
    #[error("scratch directory: {0}")]
    Io(#[from] std::io::Error),
}

type LaunchFn = unsafe extern "C" fn(
    *mut c_void,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> i32;
type SyncFn = unsafe extern "C" fn() -> i32;

/// The library, opened with the handful of calls the loop needs. Never closed: the shim's fork
/// handlers and driver handle stay live for the life of the process.
struct Driver {
    launch: LaunchFn,
    sync: SyncFn,
    function: *mut c_void,
    params: Box<LaunchParams>,
}

/// `fill_f32(dst, 1.0, 1)`'s arguments, boxed so the pointers in `ptrs` stay valid.
struct LaunchParams {
    dst: u64,
    value: f32,
    n: u64,
    ptrs: [*mut c_void; 3],
}

impl Driver {
    fn open(path: &Path) -> Result<Self, BenchError> {
        let lib_err = |reason: String| BenchError::Library { path: path.to_owned(), reason };
        let c_path = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| lib_err(e.to_string()))?;
        // SAFETY: c_path is a valid NUL-terminated string; dlopen runs the library's
        // initialisers, which for a CUDA driver (real or fake) have no preconditions.
        let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            // SAFETY: dlerror returns a thread-local NUL-terminated message or null.
            let msg = unsafe { libc::dlerror() };
            let msg = if msg.is_null() {
                "dlopen failed".to_owned()
            } else {
                // SAFETY: non-null dlerror result is a valid C string until the next dl* call.
                unsafe { CStr::from_ptr(msg) }.to_string_lossy().into_owned()
            };
            return Err(lib_err(msg));
        }
        let sym = |name: &str| -> *mut c_void {
            let c = CString::new(name).unwrap_or_default();
            // SAFETY: handle is a live dlopen handle and c a valid C string.
            unsafe { libc::dlsym(handle, c.as_ptr()) }
        };
        let need = |name: &str| {
            let p = sym(name);
            if p.is_null() {
                Err(lib_err(format!("does not export {name}")))
            } else {
                Ok(p)
            }
        };
        let launch_ptr = need("cuLaunchKernel")?;
        let sync_ptr = need("cuCtxSynchronize")?;
        // SAFETY: cuLaunchKernel and cuCtxSynchronize have these signatures in cuda.h.
        let (launch, sync) = unsafe {
            (
                std::mem::transmute::<*mut c_void, LaunchFn>(launch_ptr),
                std::mem::transmute::<*mut c_void, SyncFn>(sync_ptr),
            )
        };
        let mut params = Box::new(LaunchParams { dst: 0, value: 1.0, n: 1, ptrs: [std::ptr::null_mut(); 3] });
        // Any non-null handle for a stand-in without modules; replaced below where modules exist.
        let mut function: *mut c_void = std::ptr::dangling_mut::<c_void>();
        let check =
            |call: &'static str, code: i32| if code == 0 { Ok(()) } else { Err(BenchError::Driver { call, code }) };
        // Set up a context, a module function and a 4-byte buffer where the library has them
        // (tests/fake-cuda, a real driver); a bare stand-in accepts any handle.
        let init = sym("cuInit");
        if !init.is_null() {
            // SAFETY: cuInit(unsigned) per cuda.h.
            let f = unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(u32) -> i32>(init) };
            // SAFETY: plain value argument.
            check("cuInit", unsafe { f(0) })?;
        }
        let (dev_get, ctx_create) = (sym("cuDeviceGet"), sym("cuCtxCreate_v2"));
        if !dev_get.is_null() && !ctx_create.is_null() {
            // SAFETY: signatures per cuda.h: cuDeviceGet(CUdevice*, int), cuCtxCreate_v2(CUcontext*, unsigned, CUdevice).
            let (dg, cc) = unsafe {
                (
                    std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut i32, i32) -> i32>(dev_get),
                    std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut *mut c_void, u32, i32) -> i32>(
                        ctx_create,
                    ),
                )
            };
            let mut dev = 0i32;
            let mut ctx: *mut c_void = std::ptr::null_mut();
            // SAFETY: out-pointers to locals that outlive the calls.
            check("cuDeviceGet", unsafe { dg(&mut dev, 0) })?;
            // SAFETY: as above.
            check("cuCtxCreate_v2", unsafe { cc(&mut ctx, 0, dev) })?;
        }
        let (load, get_fn, alloc) = (sym("cuModuleLoadData"), sym("cuModuleGetFunction"), sym("cuMemAlloc_v2"));
        if !load.is_null() && !get_fn.is_null() && !alloc.is_null() {
            // SAFETY: signatures per cuda.h.
            let (load, get_fn, alloc) = unsafe {
                (
                    std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> i32>(
                        load,
                    ),
                    std::mem::transmute::<
                        *mut c_void,
                        unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const libc::c_char) -> i32,
                    >(get_fn),
                    std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut u64, usize) -> i32>(alloc),
                )
            };
            let mut module: *mut c_void = std::ptr::null_mut();
            // SAFETY: out-pointer to a local; the image pointer is a valid empty C string (a fake
            // ignores it; a real driver would reject it and we report the error).
            check("cuModuleLoadData", unsafe { load(&mut module, c"".as_ptr().cast()) })?;
            // SAFETY: module from the call above, a valid C string name, out-pointer to a local.
            check("cuModuleGetFunction", unsafe { get_fn(&mut function, module, c"fill_f32".as_ptr()) })?;
            // SAFETY: out-pointer into the boxed params, which outlive the call.
            check("cuMemAlloc_v2", unsafe { alloc(&mut params.dst, 4) })?;
        }
        let p = &mut *params;
        p.ptrs = [(&raw mut p.dst).cast(), (&raw mut p.value).cast(), (&raw mut p.n).cast()];
        Ok(Self { launch, sync, function, params })
    }

    /// `launches` launches with a sync every `sync_every`; returns the elapsed nanoseconds.
    fn run_loop(&mut self, launches: u64, sync_every: u64) -> Result<u64, BenchError> {
        let start = Instant::now();
        for i in 1..=launches {
            // SAFETY: function and params were set up for fill_f32 in `open`; the boxed params
            // (and the pointers into them) live as long as `self`.
            let rc = unsafe {
                (self.launch)(
                    self.function,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    0,
                    std::ptr::null_mut(),
                    self.params.ptrs.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            };
            if rc != 0 {
                return Err(BenchError::Driver { call: "cuLaunchKernel", code: rc });
            }
            if sync_every > 0 && i % sync_every == 0 {
                // SAFETY: no arguments; the context was created in `open`.
                let rc = unsafe { (self.sync)() };
                if rc != 0 {
                    return Err(BenchError::Driver { call: "cuCtxSynchronize", code: rc });
                }
            }
        }
        Ok(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The loop side, run in the child under the shim. Reads commands on stdin, answers one line
/// each on stdout: `setup` (open `libcuda.so.1`, i.e. the preloaded shim, set up a context and a
/// kernel, warm up) → `ok`; `loop N S` (N launches, a sync every S) → elapsed ns; `exit`.
/// Prints `ready` first, before any driver call, so the parent can register the pid with a
/// lease server before the shim's first call does. Returns the process exit status.
pub fn child_main() -> i32 {
    match child_loop(std::io::stdin().lock(), std::io::stdout().lock()) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("observe bench child: {e}");
            1
        }
    }
}

fn child_loop(input: impl BufRead, mut out: impl Write) -> Result<(), BenchError> {
    writeln!(out, "ready")?;
    out.flush()?;
    let mut driver = None;
    for line in input.lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let answer = match words.as_slice() {
            ["setup"] => {
                // What cudart does: dlopen by soname, which finds the preloaded shim.
                let mut d = Driver::open(Path::new("libcuda.so.1"))?;
                d.run_loop(10_000, 100)?;
                driver = Some(d);
                "ok".to_owned()
            }
            ["loop", n, s] => {
                let (Ok(n), Ok(s)) = (n.parse(), s.parse()) else {
                    return Err(std::io::Error::other(format!("bad command {line:?}")).into());
                };
                let d = driver.as_mut().ok_or_else(|| std::io::Error::other("loop before setup"))?;
                d.run_loop(n, s)?.to_string()
            }
            ["exit"] => return Ok(()),
            _ => return Err(std::io::Error::other(format!("unknown command {line:?}")).into()),
        };
        writeln!(out, "{answer}")?;
        out.flush()?;
    }
    Ok(())
}

/// The parent's handle on the child; killed on drop if it did not exit.
struct LoopChild {
    child: Child,
    program: PathBuf,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl LoopChild {
    fn spawn(opts: &BenchOptions) -> Result<Self, BenchError> {
        let program = opts.child.program.clone();
        let err = |reason: String| BenchError::Child { program: program.clone(), reason };
        let mut cmd = Command::new(&program);
        cmd.args(&opts.child.args)
            .env_remove("NBOS_LEASE_SOCKET")
            .envs(opts.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().map_err(|e| err(format!("cannot start: {e}")))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(err("no pipes".into()));
        };
        let mut c = Self { child, program: program.clone(), stdin, stdout: BufReader::new(stdout) };
        let first = c.line()?;
        if first != "ready" {
            return Err(err(format!("said {first:?} instead of \"ready\"")));
        }
        Ok(c)
    }

    fn line(&mut self) -> Result<String, BenchError> {
        let mut line = String::new();
        let n = self.stdout.read_line(&mut line)?;
        if n == 0 {
            let status = self.child.try_wait().ok().flatten();
            return Err(BenchError::Child {
                program: self.program.clone(),
                reason: format!("exited ({status:?}) without answering; its stderr is above"),
            });
        }
        Ok(line.trim_end().to_owned())
    }

    fn ask(&mut self, cmd: &str) -> Result<String, BenchError> {
        writeln!(self.stdin, "{cmd}")?;
        self.stdin.flush()?;
        self.line()
    }

    /// Asks the child to exit and reaps it.
    fn exit(&mut self) -> Result<(), BenchError> {
        writeln!(self.stdin, "exit")?;
        self.stdin.flush()?;
        let status = self.child.wait()?;
        if status.success() {
            Ok(())
        } else {
            Err(BenchError::Child { program: self.program.clone(), reason: format!("exited with {status}") })
        }
    }

    fn timed_loop(&mut self, launches: u64, sync_every: u64) -> Result<u64, BenchError> {
        let answer = self.ask(&format!("loop {launches} {sync_every}"))?;
        answer.parse().map_err(|_| BenchError::Child {
            program: self.program.clone(),
            reason: format!("answered {answer:?} to a loop"),
        })
    }
}

impl Drop for LoopChild {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "exit");
        let _ = self.stdin.flush();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the benchmark. `on_spawn(pid)` runs once the child is up and before its first driver
/// call (the daemon's bench registers the pid with its lease server there).
pub fn run(
    opts: &BenchOptions,
    on_spawn: &mut dyn FnMut(u32) -> Result<(), BenchError>,
) -> Result<BenchReport, BenchError> {
    let rounds = opts.rounds.max(1);
    let launches = opts.launches.max(1);
    let sync_every = opts.sync_every;
    // Checked first so a missing driver is reported by name, not as a CUDA error in the child.
    std::fs::metadata(&opts.library)
        .map_err(|e| BenchError::Library { path: opts.library.clone(), reason: e.to_string() })?;
    let mut child = LoopChild::spawn(opts)?;
    let pid = child.child.id();
    on_spawn(pid)?;
    let setup = child.ask("setup")?;
    if setup != "ok" {
        return Err(BenchError::Child { program: opts.child.program.clone(), reason: format!("setup: {setup}") });
    }

    let per_launch = |ns: u64| ns as f64 / launches as f64;
    let mut mode_request = ModeRequest::Auto;
    let (mut mode, mut probes, mut counted) = (Mode::Procfs, 0, 0);
    let (mut observed, mut unobserved, mut added) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let mut pair = [0.0f64; 2]; // [unobserved, observed]
                                    // Alternate which side runs first, so a drift within a round cancels over rounds.
        let order = if round % 2 == 0 { [true, false] } else { [false, true] };
        for observe in order {
            if observe {
                // As the daemon's node starts it (daemon/src/node/observer.rs `start_observer`).
                let cfg = ObserverConfig {
                    mode: mode_request,
                    libraries: vec![opts.library.clone()],
                    launch_probes: false,
                    counters_dir: Some(opts.counters_dir.clone()),
                    ..ObserverConfig::default()
                };
                let observer = Observer::start(cfg)?;
                mode = observer.mode();
                probes = observer.probe_count();
                // Once BPF failed to load, later rounds do not try again (and log again).
                if mode == Mode::Procfs {
                    mode_request = ModeRequest::Procfs;
                }
                let before = observer.snapshot(pid).map_or(0, |a| a.launches);
                pair[1] = per_launch(child.timed_loop(launches, sync_every)?);
                counted = observer.snapshot(pid).map_or(0, |a| a.launches).saturating_sub(before);
            } else {
                pair[0] = per_launch(child.timed_loop(launches, sync_every)?);
            }
        }
        unobserved.push(pair[0]);
        observed.push(pair[1]);
        added.push(pair[1] - pair[0]);
    }
    let exit_event_ms = exit_event_ms(opts, mode_request, &mut child)?;
    drop(child);
    let unobserved_ns = median(unobserved);
    let added_ns = median(added);
    let probed_per_launch = if sync_every > 0 { 1.0 / sync_every as f64 } else { 0.0 };
    let env = |key: &str| opts.env.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
    Ok(BenchReport {
        mode,
        library: opts.library.clone(),
        shim: env("LD_PRELOAD").map(PathBuf::from),
        managed: env("NBOS_LEASE_SOCKET").is_some(),
        probes,
        launches,
        syncs: launches.checked_div(sync_every).unwrap_or(0),
        rounds,
        unobserved_ns_per_launch: unobserved_ns,
        observed_ns_per_launch: median(observed),
        added_ns_per_launch: added_ns,
        added_pct: added_ns / unobserved_ns * 100.0,
        uprobe_cost_ns: (mode == Mode::Ebpf && probed_per_launch > 0.0).then(|| added_ns / probed_per_launch),
        counted_launches: counted,
        exit_event_ms,
    })
}

/// How long an exit event may take before the bench gives up: far beyond any delay seen, so a
/// lost event is an error, not a figure.
const EXIT_EVENT_WAIT: Duration = Duration::from_secs(30);

/// The child's exit → its exit event received, ms, with the observer started as the daemon
/// starts it and the child watched (as the node watches its kernel processes).
fn exit_event_ms(opts: &BenchOptions, mode: ModeRequest, child: &mut LoopChild) -> Result<f64, BenchError> {
    let cfg = ObserverConfig {
        mode,
        libraries: vec![opts.library.clone()],
        launch_probes: false,
        counters_dir: Some(opts.counters_dir.clone()),
        ..ObserverConfig::default()
    };
    let observer = Observer::start(cfg)?;
    let pid = child.child.id();
    observer.watch(pid)?;
    let mut exits = observer.exit_events();
    child.exit()?;
    let deadline = Instant::now() + EXIT_EVENT_WAIT;
    loop {
        match exits.try_recv() {
            Ok(e) if e.pid == pid => {
                let received = crate::clock::monotonic_ns();
                return Ok(received.saturating_sub(e.exited_at_ns) as f64 / 1e6);
            }
            Ok(_) => continue,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            Err(_) => {
                return Err(BenchError::Child {
                    program: opts.child.program.clone(),
                    reason: format!("no exit event for pid {pid} within {EXIT_EVENT_WAIT:?} of its exit"),
                })
            }
        }
    }
}

/// The shim environment of a kernel process without a lease server (the shim then passes
/// every call through, still counting): the shim copied to `<dir>/cuda/libcuda.so.1`, first on
/// `LD_LIBRARY_PATH` and in `LD_PRELOAD`, `NBOS_CUDA_DRIVER`, and `NBOS_SHIM_COUNTERS_DIR =
/// <dir>/counters`, as the daemon's `ShimEnvironment` lays them out.
#[derive(Clone, Debug)]
pub struct ShimEnv {
    /// The environment.
    pub env: Vec<(OsString, OsString)>,
    /// The counters directory (created).
    pub counters_dir: PathBuf,
}

impl ShimEnv {
    /// Prepares it under `dir`; `driver` must be an absolute path (the shim loads it by path).
    pub fn unmanaged(shim: &Path, driver: &Path, dir: &Path) -> Result<Self, BenchError> {
        if !driver.is_absolute() {
            return Err(BenchError::Library {
                path: driver.to_owned(),
                reason: "the shim loads the driver by absolute path only".into(),
            });
        }
        let lib_dir = dir.join("cuda");
        std::fs::create_dir_all(&lib_dir)?;
        let lib = lib_dir.join("libcuda.so.1");
        std::fs::copy(shim, &lib)
            .map_err(|e| BenchError::Library { path: shim.to_owned(), reason: format!("copying the shim: {e}") })?;
        let counters_dir = dir.join("counters");
        std::fs::create_dir_all(&counters_dir)?;
        let mut ld_path = lib_dir.clone().into_os_string();
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
            ld_path.push(":");
            ld_path.push(old);
        }
        let env = vec![
            ("LD_LIBRARY_PATH".into(), ld_path),
            ("LD_PRELOAD".into(), lib.into_os_string()),
            ("NBOS_CUDA_DRIVER".into(), driver.as_os_str().to_owned()),
            ("NBOS_SHIM_COUNTERS_DIR".into(), counters_dir.clone().into_os_string()),
        ];
        Ok(Self { env, counters_dir })
    }
}
