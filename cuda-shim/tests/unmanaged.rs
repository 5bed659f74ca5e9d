//! The shim on its own (no lease host): a transparent pass-through to the driver it is
//! told to load, exporting every entry point of `driver-api.list` under the soname
//! `libcuda.so.1`, and refusing to load a driver by anything but a full path.

use std::path::{Path, PathBuf};
use std::process::Command;

fn built(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let p = exe.parent().expect("deps dir").join(name);
    assert!(p.exists(), "{} not built", p.display());
    p
}

struct Setup {
    _dir: tempfile::TempDir,
    shim_dir: PathBuf,
    client: PathBuf,
    state: PathBuf,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let shim_dir = dir.path().join("shim");
    std::fs::create_dir(&shim_dir).expect("mkdir");
    std::fs::copy(built("libnbos_cuda_shim.so"), shim_dir.join("libcuda.so.1")).expect("copy");
    let client = dir.path().join("driver_client");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/driver_client.c");
    let out =
        Command::new("cc").args(["-O1", "-pthread", "-o"]).arg(&client).arg(src).arg("-ldl").output().expect("cc");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let state = dir.path().join("fake-state");
    Setup { _dir: dir, shim_dir, client, state }
}

fn run(s: &Setup, driver: &Path) -> (bool, String) {
    run_env(s, driver, &[])
}

fn run_env(s: &Setup, driver: &Path, env: &[(&str, &str)]) -> (bool, String) {
    let out = Command::new(&s.client)
        .arg("basic")
        .envs(env.iter().copied())
        .env("LD_LIBRARY_PATH", &s.shim_dir)
        .env("NBOS_CUDA_DRIVER", driver)
        .env_remove("NBOS_LEASE_SOCKET")
        .env("FAKE_CUDA_STATE_DIR", &s.state)
        .env("FAKE_CUDA_GPUS", "3")
        .output()
        .expect("run client");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn without_a_lease_host_the_shim_passes_everything_through() {
    let s = setup();
    let (ok, out) = run(&s, &built("libfake_cuda.so"));
    assert!(ok, "{out}");
    assert!(out.contains("COUNT 3\n"), "all physical GPUs visible: {out}");
    assert!(out.contains("SUM 6144.0"), "{out}");
}

#[test]
fn the_kernels_own_memory_limit_clamps_allocations_even_without_a_host() {
    let s = setup();
    // 10 KiB: the 16 KiB buffer of `basic` does not fit.
    let (ok, out) = run_env(&s, &built("libfake_cuda.so"), &[("NBOS_GPU_MEMORY_LIMIT_BYTES", "10240")]);
    assert!(!ok, "{out}");
    assert!(out.contains("MEMINFO 10240 10240"), "cuMemGetInfo reports the limit: {out}");
    assert!(out.contains("pAlloc(&x, 4096 * 4) = 2"), "CUDA_ERROR_OUT_OF_MEMORY: {out}");
    // A limit the shim cannot read is not taken as no limit: GPU calls are refused.
    let (ok, out) = run_env(&s, &built("libfake_cuda.so"), &[("NBOS_GPU_MEMORY_LIMIT_BYTES", "ten")]);
    assert!(!ok, "{out}");
    assert!(out.contains("COUNT 0") && out.contains("FAILED") && !out.contains("SUM"), "no GPU for it: {out}");
}

#[test]
fn a_relative_driver_path_is_refused_not_searched() {
    let s = setup();
    let (ok, out) = run(&s, Path::new("libcuda.so.1"));
    assert!(!ok, "{out}");
    // Even cuGetProcAddress_v2 answers CUDA_ERROR_NOT_INITIALIZED: there is no driver.
    assert!(out.contains("RESOLVE_FAILED cuInit 3"), "CUDA_ERROR_NOT_INITIALIZED expected: {out}");
}

#[test]
fn every_listed_entry_point_is_exported_and_the_soname_is_libcuda() {
    let list = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("driver-api.list")).expect("list");
    let names: Vec<&str> =
        list.lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.split_whitespace().next()).collect();
    assert!(names.len() > 500, "{}", names.len());
    let shim = built("libnbos_cuda_shim.so");
    let path = std::ffi::CString::new(shim.to_str().expect("utf-8")).expect("cstr");
    // SAFETY: loading our own library with RTLD_LOCAL; nothing in it runs at load time.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!h.is_null());
    for n in &names {
        let c = std::ffi::CString::new(*n).expect("cstr");
        // SAFETY: live handle, NUL-terminated name.
        assert!(!unsafe { libc::dlsym(h, c.as_ptr()) }.is_null(), "{n} not exported");
    }
    for n in [
        "cuLaunchKernel_ptsz",
        "cuMemcpyHtoDAsync_v2_ptsz",
        "cuMemcpyHtoD_v2_ptds",
        "cuGraphLaunch",
        "cuLaunchKernelEx",
    ] {
        assert!(names.contains(&n), "{n} missing from driver-api.list");
    }
    let readelf = Command::new("readelf").arg("-d").arg(&shim).output().expect("readelf");
    assert!(String::from_utf8_lossy(&readelf.stdout).contains("[libcuda.so.1]"), "soname");
}
