//! `nbos_ebpf::bench` end to end with a small loop: a child (`nbos-observe-loop`) under the real
//! CUDA shim over tests/fake-cuda, the observer attached as the daemon runs it on every other
//! loop. Every observed loop is counted exactly, so the timed loops really ran through the shim
//! (its counters file) with the observer in place. (Timings are reported by `nbos bench
//! observe`, never asserted.)

mod common;

use nbos_ebpf::bench::{run, BenchOptions, ChildCommand, ShimEnv};
use nbos_ebpf::Mode;

fn options(dir: &std::path::Path, library: std::path::PathBuf) -> BenchOptions {
    let shim = ShimEnv::unmanaged(&common::shim_library(), &library, dir).unwrap();
    let mut env = shim.env;
    env.push(("FAKE_CUDA_STATE_DIR".into(), common::fake_cuda_state_dir().into_os_string()));
    BenchOptions {
        library,
        child: ChildCommand { program: env!("CARGO_BIN_EXE_nbos-observe-loop").into(), args: Vec::new() },
        env,
        counters_dir: shim.counters_dir,
        launches: 2_000,
        sync_every: 100,
        rounds: 2,
    }
}

#[test]
fn bench_counts_every_observed_launch_and_reports_the_added_cost() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let opts = options(dir.path(), common::driver_library());
    let mut spawned = None;
    let report = run(&opts, &mut |pid| {
        spawned = Some(pid);
        Ok(())
    })
    .unwrap();
    assert!(spawned.is_some(), "on_spawn ran");
    assert_eq!(report.shim.as_deref(), Some(dir.path().join("cuda/libcuda.so.1").as_path()));
    assert!(!report.managed);
    assert_eq!((report.syncs, report.rounds), (20, 2));
    assert_eq!(report.counted_launches, 2_000, "launches come from the shim's counters file in both modes");
    assert!(report.unobserved_ns_per_launch > 0.0 && report.observed_ns_per_launch > 0.0);
    assert!(report.added_ns_per_launch.is_finite());
    // The child's exit reached the observer's subscriber (a figure, never a limit).
    assert!(report.exit_event_ms.is_finite() && report.exit_event_ms >= 0.0, "{}", report.exit_event_ms);
    match report.mode {
        Mode::Ebpf => assert!(report.probes > 0 && report.uprobe_cost_ns.is_some()),
        Mode::Procfs => {
            assert!(!common::privileged_required(), "NBOS_REQUIRE_PRIVILEGED=1 but the bench ran without eBPF");
            eprintln!("bench ran in procfs mode: no uprobe figures (not privileged)");
            assert_eq!(report.uprobe_cost_ns, None);
        }
    }
    let json = serde_json::to_value(&report).unwrap();
    for key in ["added_ns_per_launch", "unobserved_ns_per_launch", "observed_ns_per_launch", "mode", "managed"] {
        assert!(json.get(key).is_some(), "{key} missing from {json}");
    }
}

#[test]
fn bench_on_a_missing_library_names_it() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let opts = options(dir.path(), "/nonexistent/libcuda.so.1".into());
    let err = run(&opts, &mut |_| Ok(())).expect_err("must fail").to_string();
    assert!(err.contains("/nonexistent/libcuda.so.1"), "{err}");
}

#[test]
fn a_missing_child_program_is_named() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut opts = options(dir.path(), common::driver_library());
    opts.child.program = "/nonexistent/loop".into();
    let err = run(&opts, &mut |_| Ok(())).expect_err("must fail").to_string();
    assert!(err.contains("/nonexistent/loop"), "{err}");
}
