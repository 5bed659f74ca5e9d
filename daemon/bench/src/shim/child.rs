//! The child process of `nbos bench shim` (`nbos bench shim --child`): a kernel process
//! under the shim that answers one line per command from the host (set up, time launches
//! and copies straight into the driver and through the shim, time a blocked gated call,
//! hold memory to evict).

use std::ffi::c_void;
use std::io::{BufRead, Write};
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use super::cuda::{
    check, Alloc, DeviceGet, Free, GetFn, HtoDAsync, Init, Launch, Lib, Load, Retain, SetCurrent, Sync, Version, PTX,
};
use crate::stats::percentile;

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Overhead {
    pub(super) direct_p50: f64,
    pub(super) shim_p50: f64,
    pub(super) added_p50: f64,
}

/// What the child reports after `setup`.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Setup {
    pub(super) version: i32,
    pub(super) fake: bool,
}

/// CLOCK_MONOTONIC in ns (what `perf ... -k mono` stamps its events with).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid output pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

/// The child's driver entry points: straight into the driver, and through the shim.
struct Calls {
    d_launch: Launch,
    d_copy: HtoDAsync,
    s_launch: Launch,
    s_copy: HtoDAsync,
    s_sync: Sync,
    s_alloc: Alloc,
    s_free: Free,
    func: *mut c_void,
    buf: u64,
    /// Memory held for the eviction measurement.
    held: u64,
}

/// The benchmark's kernel process: runs under the shim (`LD_PRELOAD`, set by the parent),
/// answers one line per command read from stdin. Nothing else goes to stdout.
pub(super) fn child_main() -> anyhow::Result<()> {
    let driver = std::env::var_os("NBOS_CUDA_DRIVER").context("NBOS_CUDA_DRIVER is not set")?;
    let mut calls: Option<Calls> = None;
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        let line = line.context("reading a command")?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let answer = match (words.as_slice(), calls.as_mut()) {
            (["exit"], _) => return Ok(()),
            (["setup"], None) => match setup(Path::new(&driver)) {
                Ok((c, s)) => {
                    calls = Some(c);
                    serde_json::to_string(&s).context("encoding the setup answer")
                }
                Err(e) => Err(e),
            },
            (["launch", batch, pairs], Some(c)) => paired(batch, pairs, c, true),
            (["memcpy", batch, pairs], Some(c)) => paired(batch, pairs, c, false),
            (["call"], Some(c)) => {
                let t = monotonic_ns();
                // SAFETY: cuCtxSynchronize through the shim with a current context; it blocks
                // until the lease is granted again.
                let r = unsafe { (c.s_sync)() };
                let d = monotonic_ns().saturating_sub(t);
                check("cuCtxSynchronize", r).map(|()| format!("{t} {d}"))
            }
            (["hold", bytes], Some(c)) => hold(bytes, c).map(|()| "ok".to_owned()),
            (["release"], Some(c)) => {
                // SAFETY: frees the allocation `hold` made (0 is a no-op for the driver).
                let r = unsafe { (c.s_free)(c.held) };
                c.held = 0;
                check("cuMemFree_v2", r).map(|()| "ok".to_owned())
            }
            _ => Err(anyhow::anyhow!("unexpected command {line:?}")),
        };
        let text = answer.unwrap_or_else(|e| format!("error {e:#}"));
        writeln!(out, "{text}").context("answering")?;
        out.flush().context("answering")?;
    }
    Ok(())
}

/// Opens the shim as cudart would (`libcuda.so.1`, found first on `LD_LIBRARY_PATH`; it
/// is the library `LD_PRELOAD` already loaded) and the driver by path, and prepares a
/// context, the kernel to launch and a 4 KiB buffer through the shim.
fn setup(driver: &Path) -> anyhow::Result<(Calls, Setup)> {
    let shim = Lib::open(Path::new("libcuda.so.1"))?;
    let direct = Lib::open(driver)?;
    let fake = direct.has(c"fakeCudaIsTestDouble");
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
    if !shim.has(c"cuGetProcAddress_v2") || shim.has(c"fakeCudaIsTestDouble") {
        bail!("libcuda.so.1 on LD_LIBRARY_PATH is not the shim");
    }
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
    // The libraries stay loaded for the process's life (the handles are never closed).
    let calls = Calls { d_launch, d_copy, s_launch, s_copy, s_sync, s_alloc, s_free, func, buf, held: 0 };
    Ok((calls, Setup { version, fake }))
}

/// `pairs` pairs of timed loops of `batch` launches (or 4-byte copies), direct and through
/// the shim back to back (the order alternating), as JSON [`Overhead`].
fn paired(batch: &str, pairs: &str, c: &Calls, launches: bool) -> anyhow::Result<String> {
    let batch: u32 = batch.parse().context("batch")?;
    let pairs: u32 = pairs.parse().context("pairs")?;
    anyhow::ensure!(batch > 0 && pairs > 0, "--batch and --batches must be at least 1");
    let (mut p0, mut p1, mut p2) = (c.buf, 0f32, 0u64);
    let mut params = [(&raw mut p0).cast::<c_void>(), (&raw mut p1).cast(), (&raw mut p2).cast()];
    let pp = params.as_mut_ptr();
    let host = [0u8; 4];
    let null: *mut c_void = std::ptr::null_mut();
    let no_extra: *mut *mut c_void = std::ptr::null_mut();
    let (func, buf) = (c.func, c.buf);
    let (d_launch, s_launch, d_copy, s_copy, s_sync) = (c.d_launch, c.s_launch, c.d_copy, c.s_copy, c.s_sync);
    // ns per call of one loop, then an untimed synchronisation.
    let time = |through_shim: bool| {
        let t = Instant::now();
        for _ in 0..batch {
            // SAFETY: a valid launch (live function, parameters, context) or a 4-byte copy
            // into the live 4 KiB buffer, into the driver or through the shim (lease held).
            unsafe {
                match (launches, through_shim) {
                    (true, false) => d_launch(func, 1, 1, 1, 1, 1, 1, 0, null, pp, no_extra),
                    (true, true) => s_launch(func, 1, 1, 1, 1, 1, 1, 0, null, pp, no_extra),
                    (false, false) => d_copy(buf, host.as_ptr().cast(), 4, null),
                    (false, true) => s_copy(buf, host.as_ptr().cast(), 4, null),
                }
            };
        }
        let ns = t.elapsed().as_nanos() as f64 / f64::from(batch);
        // SAFETY: cuCtxSynchronize with a current context, lease held.
        unsafe { s_sync() };
        ns
    };
    let (mut direct, mut shim, mut added) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..pairs {
        let (d, s) = if i % 2 == 0 {
            let d = time(false);
            (d, time(true))
        } else {
            let s = time(true);
            (time(false), s)
        };
        direct.push(d);
        shim.push(s);
        added.push(s - d);
    }
    let o = Overhead {
        direct_p50: percentile(&mut direct, 50.0),
        shim_p50: percentile(&mut shim, 50.0),
        added_p50: percentile(&mut added, 50.0),
    };
    serde_json::to_string(&o).context("encoding the figures")
}

/// Allocates `bytes` through the shim and fills them (the fake driver computes it).
fn hold(bytes: &str, c: &mut Calls) -> anyhow::Result<()> {
    let bytes: u64 = bytes.parse().context("bytes")?;
    let size = usize::try_from(bytes).context("bytes")?;
    let mut big = 0u64;
    // SAFETY: valid output pointer; size within the configured fake GPU.
    check("cuMemAlloc_v2", unsafe { (c.s_alloc)(&mut big, size) })?;
    c.held = big;
    let (mut b0, mut b1, mut b2) = (big, 1.0f32, bytes / 4);
    let mut fill = [(&raw mut b0).cast::<c_void>(), (&raw mut b1).cast(), (&raw mut b2).cast()];
    let null: *mut c_void = std::ptr::null_mut();
    // SAFETY: fill_f32 over the whole allocation, through the shim.
    check("cuLaunchKernel", unsafe {
        (c.s_launch)(c.func, 1, 1, 1, 1, 1, 1, 0, null, fill.as_mut_ptr(), std::ptr::null_mut())
    })
}
