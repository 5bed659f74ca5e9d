//! Which exports hold the lease gate, checked by behaviour for every entry point of
//! `driver-api.list` (so a new driver version's additions are covered as soon as the list
//! is regenerated): in a process the host refused, a gated call answers
//! `CUDA_ERROR_NOT_PERMITTED` before reaching any driver, an ungated one does not.
//!
//! Gated must be every call that submits work, touches device memory or waits for the
//! GPU; ungated are only the documented exceptions (`cuda-shim/README.md`, "Which calls
//! are gated"). One test in this file: it sets the process's environment before the shim
//! is loaded.

use std::ffi::{c_void, CString};
use std::path::{Path, PathBuf};

const NOT_PERMITTED: u32 = 800;

fn built(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let p = exe.parent().expect("deps dir").join(name);
    assert!(p.exists(), "{} not built", p.display());
    p
}

/// The documented ungated exports (README "Which calls are gated").
fn documented_ungated(name: &str) -> bool {
    const CALLS: &[&str] = &[
        "cuInit",
        "cuDriverGetVersion",
        "cuGetErrorString",
        "cuGetErrorName",
        "cuGetExportTable",
        "cuGetProcAddress",
        "cuGetProcAddress_v2",
        "cuDeviceGetCount",
    ];
    const DEVICE_QUERIES: &[&str] =
        &["cuDeviceGet", "cuDeviceCanAccessPeer", "cuDeviceComputeCapability", "cuDeviceTotalMem"];
    CALLS.contains(&name)
        || name.starts_with("cuCheckpointProcess")
        || DEVICE_QUERIES.iter().any(|p| name.starts_with(p))
}

/// Calls that submit work, move or touch device memory, or wait for the GPU: never ungated.
fn must_be_gated(name: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "cuMemcpy",
        "cuMemset",
        "cuLaunch",
        "cuGraphLaunch",
        "cuGraphUpload",
        "cuMemPrefetch",
        "cuMemAlloc",
        "cuMemFree",
        "cuMemCreate",
        "cuMemMap",
        "cuMemRelease",
        "cuMemGetInfo",
        "cuStreamSynchronize",
        "cuStreamWaitEvent",
        "cuStreamWriteValue",
        "cuStreamWaitValue",
        "cuStreamBatchMemOp",
        "cuEventSynchronize",
        "cuEventRecord",
        "cuCtxSynchronize",
        "cuCtxCreate",
        "cuDevicePrimaryCtx",
        "cuModuleLoad",
        "cuLibraryLoad",
    ];
    PREFIXES.iter().any(|p| name.starts_with(p))
}

fn entry_points() -> Vec<String> {
    let list = Path::new(env!("CARGO_MANIFEST_DIR")).join("driver-api.list");
    let text = std::fs::read_to_string(&list).expect("driver-api.list");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

type AnyCall = unsafe extern "C" fn(
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
) -> u32;

#[test]
fn every_call_that_submits_work_or_touches_device_memory_holds_the_lease_gate() {
    let dir = tempfile::tempdir().expect("tempdir");
    // No host at this socket (the process is refused a lease) and no driver behind the
    // shim: a gated call stops at the gate, an ungated one finds no driver.
    // SAFETY (environment): set before the shim is loaded, in this file's only test.
    std::env::set_var("NBOS_LEASE_SOCKET", dir.path().join("no-host.sock"));
    std::env::set_var("NBOS_CUDA_DRIVER", dir.path().join("no-driver/libcuda.so.1"));
    std::env::remove_var("NBOS_SHIM_COUNTERS_DIR");
    let shim = CString::new(built("libnbos_cuda_shim.so").into_os_string().into_encoded_bytes()).expect("path");
    // SAFETY: loads the shim by full path; RTLD_LOCAL keeps its symbols to this handle.
    let handle = unsafe { libc::dlopen(shim.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!handle.is_null(), "dlopen of the shim failed");

    // Arguments: every one points at zeroed scratch memory (no output pointer is NULL, so
    // no hook stops at its NULL check before the gate); nothing reads them past the gate.
    let mut scratch = vec![0u64; 4096];
    let a = scratch.as_mut_ptr() as usize;
    let (mut gated, mut ungated) = (Vec::new(), Vec::new());
    let names = entry_points();
    assert!(names.len() > 500, "driver-api.list has every 12.x/13.x entry point: {}", names.len());
    for name in &names {
        let c = CString::new(name.as_str()).expect("name");
        // SAFETY: live handle, NUL-terminated name.
        let sym = unsafe { libc::dlsym(handle, c.as_ptr()) };
        assert!(!sym.is_null(), "the shim does not export {name}");
        // SAFETY: every driver entry point returns a CUresult and takes at most 16 scalar or
        // small by-value arguments; under the SysV ABI surplus integer arguments are
        // ignored by the callee. In a refused process a gated call returns before reading
        // any argument; an ungated one finds no driver to pass them to (`cuGetProcAddress`
        // reads the empty symbol name at `a`).
        let r = unsafe {
            let f: AnyCall = std::mem::transmute::<*mut c_void, AnyCall>(sym);
            f(a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a)
        };
        if r == NOT_PERMITTED {
            gated.push(name.clone());
        } else {
            ungated.push(name.clone());
        }
    }
    scratch.fill(0);

    let undocumented: Vec<_> = ungated.iter().filter(|n| !documented_ungated(n)).collect();
    assert!(undocumented.is_empty(), "ungated, but not a documented exception: {undocumented:?}");
    let wrongly: Vec<_> = gated.iter().filter(|n| documented_ungated(n)).collect();
    assert!(wrongly.is_empty(), "documented as ungated, but gated: {wrongly:?}");
    let critical: Vec<_> = names.iter().filter(|n| must_be_gated(n)).collect();
    let open: Vec<_> = critical.iter().filter(|n| !gated.contains(n)).collect();
    assert!(open.is_empty(), "work/memory calls without the gate: {open:?}");
    for must in
        ["cuMemcpyHtoD_v2", "cuMemcpy3DPeerAsync_ptsz", "cuMemsetD2D8_v2_ptds", "cuLaunchHostFunc", "cuGraphLaunch"]
    {
        assert!(critical.iter().any(|n| *n == must), "{must} is in the list and checked");
    }
    let family = |p: &str| critical.iter().filter(|n| n.starts_with(p)).count();
    eprintln!(
        "gated {} of {} exports; cuMemcpy* {}, cuMemset* {}, cuLaunch* {}",
        gated.len(),
        names.len(),
        family("cuMemcpy"),
        family("cuMemset"),
        family("cuLaunch")
    );
}
