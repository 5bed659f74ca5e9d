//! `nbos bench shim --json` runs end to end against the fake-cuda TEST DOUBLE, with the
//! shim in a child process as kernels get it, and reports every figure; bad paths are
//! clear errors. (Figures themselves are only
//! meaningful from a release build: see the closing notes, not asserted here.)

use std::path::PathBuf;
use std::process::Command;

fn built(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent().expect("deps dir").join(name)
}

#[test]
fn bench_shim_json_reports_every_figure() {
    let out = Command::new(env!("CARGO_BIN_EXE_nbos"))
        .args(["bench", "shim", "--json", "--batch", "200", "--batches", "10", "--acquire-rounds", "10"])
        .args(["--evict-mib", "8", "--shim"])
        .arg(built("libnbos_cuda_shim.so"))
        .arg("--driver")
        .arg(built("libfake_cuda.so"))
        .output()
        .expect("run nbos");
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["driver"], "fake");
    for key in [
        "launch_direct_ns_p50",
        "launch_shim_ns_p50",
        "launch_added_ns_p50",
        "memcpy_added_ns_p50",
        "lease_acquire_p50_us",
        "lease_acquire_p99_us",
        "lease_acquire_restore_p50_us",
        "evict_gib_s",
        "restore_gib_s",
    ] {
        let x = v[key].as_f64().unwrap_or_else(|| panic!("{key} missing in {v}"));
        assert!(x.is_finite(), "{key} = {x}");
    }
    assert!(v["lease_acquire_p99_us"].as_f64() >= v["lease_acquire_p50_us"].as_f64());
    assert!(v["evict_gib_s"].as_f64().is_some_and(|x| x > 0.0));
    // The shim ran as in a kernel process: its counters file saw every launch through it
    // (10 pairs of 200, plus setup's), none of the direct ones.
    assert!(v["counted_launches"].as_u64().is_some_and(|n| (2000..4000).contains(&n)), "{v}");
}

#[test]
fn bench_shim_with_a_missing_driver_is_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_nbos"))
        .args(["bench", "shim", "--json", "--driver", "/nonexistent/libcuda.so.1", "--shim"])
        .arg(built("libnbos_cuda_shim.so"))
        .output()
        .expect("run nbos");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/libcuda.so.1") && err.contains("does not exist"), "{err}");
    assert!(out.stdout.is_empty());
}
