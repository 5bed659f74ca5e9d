//! The price of observation: a launch-heavy loop through our CUDA shim (optional) and a driver
//! library, with the observer detached, with uprobes on every entry point, and in the production
//! design (uprobes on the rarer calls only, launches counted by the shim's counters file),
//! measured in one run. The uprobes sit on the driver library, so calls made through the shim
//! hit them exactly as a kernel process's calls do.
//!
//! The shim does not write the counters file yet: the bench writes it beside each launch the
//! way the shim is to (`ShimCountersWriter`), so that cost is in the figures.

use std::ffi::{c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use crate::config::{ModeRequest, ObserverConfig};
use crate::shim_counters::ShimCountersWriter;
use crate::{Mode, Observer, ObserverError};

/// What to run.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// The driver library to call and probe (tests/fake-cuda's `libfake_cuda.so`, or a real
    /// `libcuda.so.1`).
    pub library: PathBuf,
    /// Call through this CUDA shim (`libnbos_cuda_shim.so`, run unmanaged with
    /// `NBOS_CUDA_DRIVER = library`) instead of calling the driver directly.
    pub shim: Option<PathBuf>,
    /// Launches per timed loop.
    pub launches: u64,
    /// One `cuCtxSynchronize` every this many launches, as a training loop does.
    pub sync_every: u64,
    /// Rounds of the four loops (see [`run`]); medians over rounds are reported.
    pub rounds: usize,
}

/// The result, printed as one JSON object by `nbos bench observe --json`.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// `ebpf`, or `procfs` when BPF could not be loaded (then no uprobe figures).
    pub mode: Mode,
    /// The driver library probed.
    pub library: PathBuf,
    /// The shim the loops called through; `null`: straight into the driver.
    pub shim: Option<PathBuf>,
    /// Launches per timed loop.
    pub launches: u64,
    /// Synchronisations per loop.
    pub syncs: u64,
    /// Rounds measured.
    pub rounds: usize,
    /// Median ns per launch with no observer and no counting.
    pub bare_ns_per_launch: f64,
    /// What the shim's counters-file update adds per launch (paid with or without observer).
    pub shim_counter_ns_per_launch: f64,
    /// Median ns per launch with the shim's counting and no observer: the baseline.
    pub detached_ns_per_launch: f64,
    /// Median ns per launch with the observer attached in the production design.
    pub designed_ns_per_launch: f64,
    /// Added wall time of the attached observer (production design) over the detached
    /// baseline, percent: the price of observation on a launch-heavy loop.
    pub launch_loop_overhead_pct: f64,
    /// Median ns per launch with uprobes on every entry point, launches included.
    pub all_probes_ns_per_launch: Option<f64>,
    /// Added cost of one uprobe hit (all-probes minus bare, per probed call).
    pub uprobe_cost_ns: Option<f64>,
    /// Added wall time with uprobes on every launch, percent of the baseline.
    pub all_probes_overhead_pct: Option<f64>,
    /// Launches the observer counted in the last all-probes loop (must equal `launches`).
    pub all_probes_counted_launches: Option<u64>,
    /// Launches the observer reported in the last designed loop (from the counters file).
    pub designed_counted_launches: u64,
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

/// The library, opened with the handful of calls the loop needs.
struct Driver {
    handle: *mut c_void,
    /// `dlclose` on drop: not for the shim, whose fork handlers and driver handle stay live.
    close: bool,
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
    fn open(path: &Path, close: bool) -> Result<Self, BenchError> {
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
        Ok(Self { handle, close, launch, sync, function, params })
    }

    /// `launches` launches with a sync every `sync_every`, optionally counting each in the
    /// shim's counters as the shim would; returns the elapsed nanoseconds.
    fn run_loop(
        &mut self,
        launches: u64,
        sync_every: u64,
        shim: Option<&ShimCountersWriter>,
    ) -> Result<u64, BenchError> {
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
            if let Some(s) = shim {
                s.record_launch();
            }
            if sync_every > 0 && i % sync_every == 0 {
                // SAFETY: no arguments; the context was created in `open`.
                let rc = unsafe { (self.sync)() };
                if rc != 0 {
                    return Err(BenchError::Driver { call: "cuCtxSynchronize", code: rc });
                }
                if let Some(s) = shim {
                    s.record_sync();
                }
            }
        }
        Ok(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if self.close {
            // SAFETY: handle came from a successful dlopen and is closed once; no function
            // pointer from it is used after drop.
            unsafe { libc::dlclose(self.handle) };
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Runs the benchmark. Each round runs four loops of `launches` launches:
/// 1. bare: no observer, no counting;
/// 2. detached: the shim's counting (which the shim does whether or not an observer runs), no observer;
/// 3. designed: as 2, with the observer attached in the production design (uprobes on the
///    rarer calls, launches read from the counters file);
/// 4. all probes: as 1, with uprobes on every entry point, launches included.
///
/// Figures are medians over rounds of differences paired within a round (3 - 2, 2 - 1, 4 - 1),
/// because on a shared machine the speed drifts between rounds.
pub fn run(opts: &BenchOptions) -> Result<BenchReport, BenchError> {
    let BenchOptions { library, shim: shim_lib, launches, sync_every, rounds } = opts.clone();
    let rounds = rounds.max(1);
    let launches = launches.max(1);
    let mut driver = match &shim_lib {
        None => Driver::open(&library, true)?,
        Some(shim_path) => {
            let shim_err = |reason: String| BenchError::Library { path: shim_path.clone(), reason };
            if std::env::var_os("NBOS_LEASE_SOCKET").is_some() {
                return Err(shim_err("NBOS_LEASE_SOCKET is set: the bench runs the shim unmanaged, unset it".into()));
            }
            if !library.is_absolute() {
                return Err(BenchError::Library {
                    path: library.clone(),
                    reason: "the shim loads the driver by absolute path only".into(),
                });
            }
            // Checked before dlopen so a missing driver is reported by name, not as a CUDA error.
            std::fs::metadata(&library)
                .map_err(|e| BenchError::Library { path: library.clone(), reason: e.to_string() })?;
            // The shim reads NBOS_CUDA_DRIVER when it first loads the driver, on our first call.
            std::env::set_var("NBOS_CUDA_DRIVER", &library);
            Driver::open(shim_path, false)?
        }
    };
    let counters = tempfile_dir()?;
    let shim = ShimCountersWriter::create(counters.path(), std::process::id())?;
    // Warm up caches, page tables and the fake's state.
    driver.run_loop(launches.min(10_000), sync_every, None)?;

    let per_launch = |ns: u64| ns as f64 / launches as f64;
    let mut mode = Mode::Ebpf;
    let (mut bare, mut detached, mut designed, mut all) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut counter_cost, mut designed_added, mut all_added) = (Vec::new(), Vec::new(), Vec::new());
    let (mut all_counted, mut designed_counted) = (None, 0);
    for _ in 0..rounds {
        let b = per_launch(driver.run_loop(launches, sync_every, None)?);
        let d = per_launch(driver.run_loop(launches, sync_every, Some(&shim))?);

        let designed_cfg = ObserverConfig {
            mode: if mode == Mode::Ebpf { ModeRequest::Auto } else { ModeRequest::Procfs },
            libraries: vec![library.clone()],
            launch_probes: false,
            counters_dir: Some(counters.path().to_owned()),
            ..ObserverConfig::default()
        };
        let observer = Observer::start(designed_cfg)?;
        mode = observer.mode();
        let before = observer.snapshot(std::process::id()).map_or(0, |a| a.launches);
        let w = per_launch(driver.run_loop(launches, sync_every, Some(&shim))?);
        designed_counted = observer.snapshot(std::process::id()).map_or(0, |a| a.launches).saturating_sub(before);
        drop(observer);

        if mode == Mode::Ebpf {
            let all_cfg = ObserverConfig {
                mode: ModeRequest::Ebpf,
                libraries: vec![library.clone()],
                counters_dir: None,
                ..ObserverConfig::default()
            };
            let observer = Observer::start(all_cfg)?;
            let a = per_launch(driver.run_loop(launches, sync_every, None)?);
            all_counted = observer.snapshot(std::process::id()).map(|x| x.launches);
            all.push(a);
            all_added.push(a - b);
        }
        bare.push(b);
        detached.push(d);
        designed.push(w);
        counter_cost.push(d - b);
        designed_added.push(w - d);
    }
    let detached_ns = median(detached);
    let all_added = (!all_added.is_empty()).then(|| median(all_added));
    let calls_per_launch = 1.0 + if sync_every > 0 { 1.0 / sync_every as f64 } else { 0.0 };
    Ok(BenchReport {
        mode,
        library,
        shim: shim_lib,
        launches,
        syncs: launches.checked_div(sync_every).unwrap_or(0),
        rounds,
        bare_ns_per_launch: median(bare),
        shim_counter_ns_per_launch: median(counter_cost),
        detached_ns_per_launch: detached_ns,
        designed_ns_per_launch: median(designed),
        launch_loop_overhead_pct: median(designed_added) / detached_ns * 100.0,
        all_probes_ns_per_launch: (!all.is_empty()).then(|| median(all)),
        uprobe_cost_ns: all_added.map(|d| d / calls_per_launch),
        all_probes_overhead_pct: all_added.map(|d| d / detached_ns * 100.0),
        all_probes_counted_launches: all_counted,
        designed_counted_launches: designed_counted,
    })
}

/// A scratch directory for the counters file, removed on drop.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempfile_dir() -> Result<ScratchDir, BenchError> {
    let dir = std::env::temp_dir().join(format!("nbos-bench-observe-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(ScratchDir(dir))
}
