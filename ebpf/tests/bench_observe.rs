//! `nbos_ebpf::bench` end to end through the CUDA shim and tests/fake-cuda with a small loop:
//! every observed loop is counted exactly, so the timed loops really ran through the probed
//! driver with the probes and counters in place.
//! (Timings are reported by `nbos bench observe`, never asserted.)

mod common;

use nbos_ebpf::bench::{run, BenchOptions};
use nbos_ebpf::Mode;

#[test]
fn bench_counts_every_observed_launch_and_reports_the_mode() {
    std::env::set_var("FAKE_CUDA_STATE_DIR", common::fake_cuda_state_dir());
    let opts = BenchOptions {
        library: common::driver_library(),
        shim: Some(shim_library()),
        launches: 2_000,
        sync_every: 100,
        rounds: 1,
    };
    let report = run(&opts).unwrap();
    assert_eq!(report.shim.as_deref(), Some(shim_library().as_path()));
    assert_eq!(report.syncs, 20);
    assert_eq!(report.designed_counted_launches, 2_000);
    assert!(report.detached_ns_per_launch > 0.0 && report.designed_ns_per_launch > 0.0);
    match report.mode {
        Mode::Ebpf => {
            assert_eq!(report.all_probes_counted_launches, Some(2_000));
            assert!(report.uprobe_cost_ns.is_some() && report.all_probes_overhead_pct.is_some());
        }
        Mode::Procfs => {
            assert!(!common::privileged_required(), "NBOS_REQUIRE_PRIVILEGED=1 but the bench ran without eBPF");
            eprintln!("bench ran in procfs mode: no uprobe figures (not privileged)");
            assert_eq!(report.uprobe_cost_ns, None);
        }
    }
    let json = serde_json::to_value(&report).unwrap();
    for key in ["uprobe_cost_ns", "launch_loop_overhead_pct", "mode"] {
        assert!(json.get(key).is_some(), "{key} missing from {json}");
    }
}

#[test]
fn bench_on_a_missing_library_names_it() {
    for shim in [None, Some(shim_library())] {
        let opts =
            BenchOptions { library: "/nonexistent/libcuda.so.1".into(), shim, launches: 10, sync_every: 0, rounds: 1 };
        let err = run(&opts).expect_err("must fail").to_string();
        assert!(err.contains("/nonexistent/libcuda.so.1"), "{err}");
    }
}

/// `libnbos_cuda_shim.so` (cuda-shim is a dev-dependency), next to the test binary.
fn shim_library() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [deps.join("libnbos_cuda_shim.so"), deps.parent().unwrap().join("libnbos_cuda_shim.so")]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!("libnbos_cuda_shim.so not found near {} (cargo build -p nbos-cuda-shim)", deps.display())
        })
}
