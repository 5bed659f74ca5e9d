//! `nbos bench shim`: what the CUDA shim costs, measured in one run.
//!
//! In this process: a lease server (the daemon's own code) with this process registered
//! as a kernel process, the driver (default: the fake-cuda TEST DOUBLE next to this
//! executable) opened directly, and the shim opened beside it (`RTLD_LOCAL`, loading
//! the same driver by path). Then, alternating batches of the same call through the
//! shim (lease held) and straight into the driver give the added ns per call; revoke →
//! blocked call → grant cycles give the lease acquire latency; and revoking a process
//! holding `--evict-mib` MiB gives eviction (checkpoint) and restore bandwidth.
//!
//! Build with `--release` for meaningful figures (the JSON says which build ran).

use std::ffi::{c_int, c_uint, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;

use crate::gpu::checkpoint::DriverCheckpoint;
use crate::gpu::control::GpuControl;
use crate::gpu::inventory::fake_gpu_uuid;
use crate::gpu::GpuInfo;
use crate::lease::metrics::LeaseMetrics;
use crate::lease::table::Policy;
use crate::lease::{KernelProcess, LeaseServer, LeaseServerConfig, LeaseState};

/// Options of `nbos bench shim`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// The CUDA driver (full path); default: libfake_cuda.so next to this executable.
    #[arg(long)]
    pub driver: Option<PathBuf>,
    /// The shim; default: libnbos_cuda_shim.so next to this executable.
    #[arg(long)]
    pub shim: Option<PathBuf>,
    /// Calls per timed batch.
    #[arg(long, default_value_t = 2000)]
    pub batch: u32,
    /// Batches per variant (direct, shim).
    #[arg(long, default_value_t = 200)]
    pub batches: u32,
    /// Revoke/acquire cycles. 1,000 so that p99 is not the second-worst of a handful of
    /// samples (at 200 a single VM vCPU wake-up of a few ms decides it).
    #[arg(long, default_value_t = 1000)]
    pub acquire_rounds: u32,
    /// Device memory held while measuring eviction and restore, MiB.
    #[arg(long, default_value_t = 256)]
    pub evict_mib: u64,
    /// Write every lease-acquire sample (no checkpoint) to this file as
    /// `<start CLOCK_MONOTONIC ns> <duration ns>` lines, to line slow ones up with a
    /// scheduler trace (`perf sched record -k mono`).
    #[arg(long)]
    pub acquire_trace: Option<PathBuf>,
}

/// The figures.
#[derive(Debug, Serialize)]
pub struct Report {
    /// `fake` or the real driver's version (`cuDriverGetVersion`).
    pub driver: String,
    /// `release` or `debug`.
    pub build: &'static str,
    /// Median ns per cuLaunchKernel straight into the driver.
    pub launch_direct_ns_p50: f64,
    /// Median ns per cuLaunchKernel through the shim, lease held.
    pub launch_shim_ns_p50: f64,
    /// Added ns per leased cuLaunchKernel (median difference).
    pub launch_added_ns_p50: f64,
    /// shim / direct.
    pub launch_ratio: f64,
    /// Median ns per cuMemcpyHtoDAsync_v2 (4 bytes) straight into the driver.
    pub memcpy_direct_ns_p50: f64,
    /// Median ns per cuMemcpyHtoDAsync_v2 through the shim.
    pub memcpy_shim_ns_p50: f64,
    /// Added ns per leased cuMemcpyHtoDAsync_v2.
    pub memcpy_added_ns_p50: f64,
    /// shim / direct.
    pub memcpy_ratio: f64,
    /// Blocked call → lease granted → call returned, median µs.
    pub lease_acquire_p50_us: f64,
    /// Same, 99th percentile.
    pub lease_acquire_p99_us: f64,
    /// Blocked call → restore of the checkpointed (4 KiB) memory → grant, median µs (test double only).
    pub lease_acquire_restore_p50_us: Option<f64>,
    /// Same, 99th percentile.
    pub lease_acquire_restore_p99_us: Option<f64>,
    /// Eviction (revoke + checkpoint) bandwidth, GiB/s (null without the checkpoint API).
    pub evict_gib_s: Option<f64>,
    /// Restore (blocked call → restore → grant) bandwidth, GiB/s.
    pub restore_gib_s: Option<f64>,
    /// MiB held during the eviction measurement.
    pub evict_mib: u64,
}

/// A library opened by path with `RTLD_LOCAL`.
struct Lib(*mut c_void);

impl Lib {
    fn open(path: &Path) -> anyhow::Result<Self> {
        let c = CString::new(path.as_os_str().as_encoded_bytes()).context("path with NUL")?;
        // SAFETY: valid C string; RTLD_LOCAL keeps its symbols out of the global scope.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            // SAFETY: dlerror returns NULL or a message.
            let e = unsafe { libc::dlerror() };
            let msg = if e.is_null() {
                String::new()
            } else {
                // SAFETY: non-null dlerror message.
                unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
            };
            bail!("cannot load {}: {msg}", path.display());
        }
        Ok(Self(h))
    }

    fn has(&self, name: &CStr) -> bool {
        // SAFETY: live handle, NUL-terminated name.
        !unsafe { libc::dlsym(self.0, name.as_ptr()) }.is_null()
    }

    /// # Safety
    /// `F` must be the C signature of `name`.
    unsafe fn get<F: Copy>(&self, name: &CStr) -> anyhow::Result<F> {
        // SAFETY: live handle, NUL-terminated name.
        let p = unsafe { libc::dlsym(self.0, name.as_ptr()) };
        if p.is_null() {
            bail!("missing {}", name.to_string_lossy());
        }
        // SAFETY: caller guarantees F is a function pointer type of this symbol.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
    }
}

type Init = unsafe extern "C" fn(c_uint) -> u32;
type Version = unsafe extern "C" fn(*mut c_int) -> u32;
type DeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> u32;
type Retain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> u32;
type SetCurrent = unsafe extern "C" fn(*mut c_void) -> u32;
type Load = unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> u32;
type GetFn = unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const i8) -> u32;
type Alloc = unsafe extern "C" fn(*mut u64, usize) -> u32;
type Free = unsafe extern "C" fn(u64) -> u32;
type Sync = unsafe extern "C" fn() -> u32;
type HtoDAsync = unsafe extern "C" fn(u64, *const c_void, usize, *mut c_void) -> u32;
type Launch = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> u32;

/// An empty `fill_f32` for a real GPU; the fake driver ignores the image and runs its own.
const PTX: &CStr = c".version 7.0
.target sm_50
.address_size 64
.visible .entry fill_f32(.param .u64 p0, .param .f32 p1, .param .u64 p2) { ret; }
";

fn check(what: &str, r: u32) -> anyhow::Result<()> {
    if r != 0 {
        bail!("{what} returned CUresult {r}");
    }
    Ok(())
}

fn beside_exe(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating this executable")?;
    let dir = exe.parent().context("executable has no directory")?;
    Ok(dir.join(name))
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((v.len() - 1) as f64 * p).round() as usize;
    v[i.min(v.len() - 1)]
}

/// Times alternating batches of `a` and `b`, running `settle` (untimed) after each batch
/// so queued GPU work never throttles submission; returns (p50 ns per call of a, of b).
fn alternate(
    batch: u32,
    batches: u32,
    mut a: impl FnMut(),
    mut b: impl FnMut(),
    mut settle: impl FnMut(),
) -> (f64, f64) {
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for _ in 0..batches {
        let t = Instant::now();
        for _ in 0..batch {
            a();
        }
        ta.push(t.elapsed().as_nanos() as f64 / f64::from(batch));
        settle();
        let t = Instant::now();
        for _ in 0..batch {
            b();
        }
        tb.push(t.elapsed().as_nanos() as f64 / f64::from(batch));
        settle();
    }
    (percentile(&mut ta, 0.5), percentile(&mut tb, 0.5))
}

/// Revokes `pid`'s current lease and waits until the host has released (and evicted) it.
/// The published status lags the shim by a moment, so first wait for the lease to show
/// as bound, then for that very lease to show as unbound.
fn revoke_and_wait(server: &LeaseServer, pid: u32) -> anyhow::Result<()> {
    let mut lease = 0;
    let bound = server.wait_until(Duration::from_secs(60), |s| {
        s.iter().any(|p| {
            let hit = p.pid == pid && p.state == LeaseState::Bound;
            if hit {
                lease = p.lease;
            }
            hit
        })
    });
    if !bound {
        bail!("lease never showed as bound: {:?}", server.status());
    }
    server.revoke(pid);
    let released = server.wait_until(Duration::from_secs(60), |s| {
        s.iter().any(|p| p.pid == pid && p.lease == lease && p.state == LeaseState::Unbound)
    });
    if !released {
        bail!("revocation did not complete: {:?}", server.status());
    }
    Ok(())
}

/// CLOCK_MONOTONIC in ns (what `perf ... -k mono` stamps its events with).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid output pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

/// Revoke, wait for the release, then time a blocked gated call until it returns:
/// (start ns, duration ns) per round.
fn acquire_cycles(
    server: &LeaseServer,
    pid: u32,
    rounds: u32,
    call: impl Fn() -> u32,
) -> anyhow::Result<Vec<(u64, u64)>> {
    let mut out = Vec::with_capacity(rounds as usize);
    for _ in 0..rounds {
        revoke_and_wait(server, pid)?;
        let t = monotonic_ns();
        check("cuCtxSynchronize", call())?;
        out.push((t, monotonic_ns().saturating_sub(t)));
    }
    Ok(out)
}

fn micros(samples: &[(u64, u64)]) -> Vec<f64> {
    samples.iter().map(|(_, d)| *d as f64 / 1e3).collect()
}

/// Runs the benchmark.
pub fn run(args: Args) -> anyhow::Result<()> {
    let report = measure(&args)?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("driver                  {} ({} build)", report.driver, report.build);
        println!(
            "cuLaunchKernel          direct {:.1} ns, shim {:.1} ns: +{:.1} ns (x{:.2})",
            report.launch_direct_ns_p50, report.launch_shim_ns_p50, report.launch_added_ns_p50, report.launch_ratio
        );
        println!(
            "cuMemcpyHtoDAsync       direct {:.1} ns, shim {:.1} ns: +{:.1} ns (x{:.2})",
            report.memcpy_direct_ns_p50, report.memcpy_shim_ns_p50, report.memcpy_added_ns_p50, report.memcpy_ratio
        );
        println!(
            "lease acquire           p50 {:.1} µs, p99 {:.1} µs (with restore: p50 {:?} µs, p99 {:?} µs)",
            report.lease_acquire_p50_us,
            report.lease_acquire_p99_us,
            report.lease_acquire_restore_p50_us,
            report.lease_acquire_restore_p99_us
        );
        match (report.evict_gib_s, report.restore_gib_s) {
            (Some(e), Some(r)) => {
                println!("evict / restore         {e:.2} / {r:.2} GiB/s ({} MiB)", report.evict_mib)
            }
            _ => println!("evict / restore         n/a (no checkpoint API in this driver)"),
        }
    }
    Ok(())
}

fn measure(args: &Args) -> anyhow::Result<Report> {
    let shim_path = match &args.shim {
        Some(p) => p.clone(),
        None => beside_exe("libnbos_cuda_shim.so")?,
    };
    let driver_path = match &args.driver {
        Some(p) => p.clone(),
        None => beside_exe("libfake_cuda.so")?,
    };
    for p in [&shim_path, &driver_path] {
        if !p.exists() {
            bail!("{} does not exist (build the workspace, or pass --shim/--driver)", p.display());
        }
    }
    let dir = tempfile::tempdir().context("creating a scratch directory")?;
    let socket = dir.path().join("lease.sock");
    let gpu_mib = args.evict_mib * 2 + 64;
    // Set before any thread exists (the CLI is single-threaded until here); the shim and
    // the fake driver read them once when loaded.
    std::env::set_var("NBOS_LEASE_SOCKET", &socket);
    std::env::set_var("NBOS_KERNEL_ID", "bench");
    std::env::set_var("NBOS_CUDA_DRIVER", &driver_path);
    std::env::set_var("FAKE_CUDA_STATE_DIR", dir.path().join("fake-state"));
    std::env::set_var("FAKE_CUDA_GPUS", "2");
    std::env::set_var("FAKE_CUDA_GPU_MEMORY_MIB", gpu_mib.to_string());

    let direct = Lib::open(&driver_path)?;
    let fake = direct.has(c"fakeCudaIsTestDouble");
    let metrics = LeaseMetrics::default();
    // A real driver cannot checkpoint the process calling it; there only the protocol is timed.
    let api: Option<Box<dyn crate::gpu::checkpoint::CheckpointApi>> =
        if fake { Some(Box::new(DriverCheckpoint::load(&driver_path)?)) } else { None };
    let control = GpuControl::new(api, metrics.clone());
    let gpus: Vec<GpuInfo> = (0..2)
        .map(|index| GpuInfo {
            index,
            uuid: fake_gpu_uuid(index),
            name: "bench".into(),
            memory_mib: gpu_mib,
            simulated: fake,
        })
        .collect();
    let cfg = LeaseServerConfig {
        socket,
        policy: Policy { idle_grace: Duration::from_secs(3600), idle_release: Duration::from_secs(3600) },
        activity_interval: Duration::ZERO,
        memory_limit_bytes: 0,
    };
    let server = LeaseServer::start(cfg, gpus, control, metrics).context("starting the lease server")?;
    let pid = std::process::id();
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    server.register_process(KernelProcess { kernel_id: "bench".into(), replica: 0, pid, uid, gpus: 1 });
    let shim = Lib::open(&shim_path)?;

    // SAFETY: every type below is the C signature of the named driver entry point.
    let (
        d_launch,
        d_copy,
        s_init,
        s_version,
        s_dev,
        s_retain,
        s_set,
        s_load,
        s_getfn,
        s_alloc,
        s_free,
        s_sync,
        s_launch,
        s_copy,
    ) = unsafe {
        (
            direct.get::<Launch>(c"cuLaunchKernel")?,
            direct.get::<HtoDAsync>(c"cuMemcpyHtoDAsync_v2")?,
            shim.get::<Init>(c"cuInit")?,
            shim.get::<Version>(c"cuDriverGetVersion")?,
            shim.get::<DeviceGet>(c"cuDeviceGet")?,
            shim.get::<Retain>(c"cuDevicePrimaryCtxRetain")?,
            shim.get::<SetCurrent>(c"cuCtxSetCurrent")?,
            shim.get::<Load>(c"cuModuleLoadData")?,
            shim.get::<GetFn>(c"cuModuleGetFunction")?,
            shim.get::<Alloc>(c"cuMemAlloc_v2")?,
            shim.get::<Free>(c"cuMemFree_v2")?,
            shim.get::<Sync>(c"cuCtxSynchronize")?,
            shim.get::<Launch>(c"cuLaunchKernel")?,
            shim.get::<HtoDAsync>(c"cuMemcpyHtoDAsync_v2")?,
        )
    };
    let (mut dev, mut ctx, mut module, mut func, mut buf, mut version) =
        (0, std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut(), 0u64, 0);
    // SAFETY: driver API calls with valid output pointers to locals.
    unsafe {
        check("cuInit", s_init(0))?;
        check("cuDriverGetVersion", s_version(&mut version))?;
        check("cuDeviceGet", s_dev(&mut dev, 0))?;
        check("cuDevicePrimaryCtxRetain", s_retain(&mut ctx, dev))?;
        check("cuCtxSetCurrent", s_set(ctx))?;
        check("cuModuleLoadData", s_load(&mut module, PTX.as_ptr().cast()))?;
        check("cuModuleGetFunction", s_getfn(&mut func, module, c"fill_f32".as_ptr()))?;
        check("cuMemAlloc_v2", s_alloc(&mut buf, 4096))?;
    }
    let (mut p0, mut p1, mut p2) = (buf, 0f32, 0u64);
    let mut params = [(&raw mut p0).cast::<c_void>(), (&raw mut p1).cast(), (&raw mut p2).cast()];
    let pp = params.as_mut_ptr();
    let host = [0u8; 4];
    let null: *mut c_void = std::ptr::null_mut();
    let no_extra: *mut *mut c_void = std::ptr::null_mut();
    let (launch_direct, launch_shim) = alternate(
        args.batch,
        args.batches,
        // SAFETY: a valid launch (live function, parameters, context) straight into the driver.
        || unsafe {
            d_launch(func, 1, 1, 1, 1, 1, 1, 0, null, pp, no_extra);
        },
        // SAFETY: the same launch through the shim.
        || unsafe {
            s_launch(func, 1, 1, 1, 1, 1, 1, 0, null, pp, no_extra);
        },
        // SAFETY: cuCtxSynchronize with a current context, lease held.
        || unsafe {
            s_sync();
        },
    );
    let (copy_direct, copy_shim) = alternate(
        args.batch,
        args.batches,
        // SAFETY: a 4-byte copy into a live 4 KiB allocation, straight into the driver.
        || unsafe {
            d_copy(buf, host.as_ptr().cast(), 4, null);
        },
        // SAFETY: the same copy through the shim.
        || unsafe {
            s_copy(buf, host.as_ptr().cast(), 4, null);
        },
        // SAFETY: as above.
        || unsafe {
            s_sync();
        },
    );

    // Lease protocol alone (memory left resident), then with checkpoint and restore of
    // the process's (small) device memory in every cycle.
    // SAFETY: cuCtxSynchronize through the shim, with a current context; it blocks until
    // the lease is granted again.
    let sync = || unsafe { s_sync() };
    server.set_checkpointing(false);
    let samples = acquire_cycles(&server, pid, args.acquire_rounds, sync)?;
    if let Some(path) = &args.acquire_trace {
        let text: String = samples.iter().map(|(t, d)| format!("{t} {d}\n")).collect();
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    let mut acquire = micros(&samples);
    server.set_checkpointing(true);
    let mut acquire_restore =
        if fake { micros(&acquire_cycles(&server, pid, args.acquire_rounds, sync)?) } else { Vec::new() };

    let (mut evict_gib_s, mut restore_gib_s) = (None, None);
    if fake {
        let bytes = args.evict_mib << 20;
        let mut big = 0u64;
        // SAFETY: valid output pointer; size within the configured fake GPU.
        check("cuMemAlloc_v2", unsafe { s_alloc(&mut big, bytes as usize) })?;
        let (mut b0, mut b1, mut b2) = (big, 1.0f32, bytes / 4);
        let mut fill = [(&raw mut b0).cast::<c_void>(), (&raw mut b1).cast(), (&raw mut b2).cast()];
        // SAFETY: fill_f32 over the whole allocation (the fake driver computes it).
        check("cuLaunchKernel", unsafe { s_launch(func, 1, 1, 1, 1, 1, 1, 0, null, fill.as_mut_ptr(), no_extra) })?;
        let (mut ev, mut re) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let t = Instant::now();
            revoke_and_wait(&server, pid)?;
            ev.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            // SAFETY: gated call; blocks until restored and granted.
            check("cuCtxSynchronize", unsafe { s_sync() })?;
            re.push(t.elapsed().as_secs_f64());
        }
        let gib = bytes as f64 / f64::from(1u32 << 30);
        evict_gib_s = Some(gib / percentile(&mut ev, 0.5));
        restore_gib_s = Some(gib / percentile(&mut re, 0.5));
        // SAFETY: frees our allocation.
        check("cuMemFree_v2", unsafe { s_free(big) })?;
    }
    drop(server);
    Ok(Report {
        driver: if fake { "fake".into() } else { format!("{}.{}", version / 1000, (version % 1000) / 10) },
        build: if cfg!(debug_assertions) { "debug" } else { "release" },
        launch_direct_ns_p50: launch_direct,
        launch_shim_ns_p50: launch_shim,
        launch_added_ns_p50: launch_shim - launch_direct,
        launch_ratio: launch_shim / launch_direct,
        memcpy_direct_ns_p50: copy_direct,
        memcpy_shim_ns_p50: copy_shim,
        memcpy_added_ns_p50: copy_shim - copy_direct,
        memcpy_ratio: copy_shim / copy_direct,
        lease_acquire_p50_us: percentile(&mut acquire, 0.5),
        lease_acquire_p99_us: percentile(&mut acquire, 0.99),
        lease_acquire_restore_p50_us: fake.then(|| percentile(&mut acquire_restore, 0.5)),
        lease_acquire_restore_p99_us: fake.then(|| percentile(&mut acquire_restore, 0.99)),
        evict_gib_s,
        restore_gib_s,
        evict_mib: args.evict_mib,
    })
}
