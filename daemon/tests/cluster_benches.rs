//! Smoke runs of the benches that start their own loopback hosts: `nbos bench migration` and
//! `nbos bench kernel-start` (both account setups), each with the fewest samples it takes.
//! What is checked is what a reader of docs/simulator.md and docs/prewarm.md relies on: one
//! JSON object with the documented keys, figures that make sense (positive, p50 ≤ p99 ≤
//! max), the moves and pool takes the figures claim, and the simulator's cost file section
//! that `--costs-out` writes. Never a speed: the figures are the benches' to report.
//! (`nbos bench election` and `cell` have theirs in cluster_cells.rs and gateway_api.rs.)

mod required;

use std::path::Path;
use std::process::Command;

use nbos_test_support::bins;

/// Runs `nbos <args>`, which must succeed and print one JSON object.
fn bench_json(args: &[&str], costs: Option<&Path>) -> serde_json::Value {
    let mut cmd = Command::new(bins::nbos());
    cmd.args(args).arg("--json").arg("--python").arg(bins::python());
    if let Some(c) = costs {
        cmd.arg("--costs-out").arg(c);
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("nbos {args:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "nbos {args:?} failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one JSON object: {stdout}");
    serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

/// `v[key]`, a finite number above 0.
fn positive(v: &serde_json::Value, key: &str) -> f64 {
    let x = v[key].as_f64().unwrap_or_else(|| panic!("{key} missing in {v}"));
    assert!(x.is_finite() && x > 0.0, "{key} = {x} in {v}");
    x
}

/// A scratch copy of the shipped cost file, so `--costs-out` rewrites a section of a real one.
fn costs_copy(dir: &Path) -> std::path::PathBuf {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/sim/costs.json");
    let copy = dir.join("costs.json");
    std::fs::copy(&shipped, &copy).unwrap_or_else(|e| panic!("{}: {e}", shipped.display()));
    copy
}

fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn bench_migration_moves_a_replica_per_sample_and_writes_the_state_transfer_costs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let costs = costs_copy(dir.path());
    let before = read_json(&costs);
    let v = bench_json(&["bench", "migration", "--samples", "1", "--state-mib", "1,2"], Some(&costs));
    let sizes = v["sizes"].as_array().unwrap_or_else(|| panic!("no sizes in {v}"));
    assert_eq!(sizes.iter().map(|s| s["state_mib"].as_u64()).collect::<Vec<_>>(), [Some(1), Some(2)], "{v}");
    for s in sizes {
        assert_eq!(s["samples"], 1, "{s}");
        let (p50, p99, max) =
            (positive(s, "migration_p50_ms"), positive(s, "migration_p99_ms"), positive(s, "migration_max_ms"));
        assert!(p50 <= p99 && p99 <= max, "{s}");
    }
    for key in ["fit_base_ms", "fit_per_mib_ms"] {
        let x = v[key].as_f64().unwrap_or_else(|| panic!("{key} missing in {v}"));
        assert!(x.is_finite() && x >= 0.0, "{key} = {x}");
    }
    assert!(v["pool_hits"].as_f64().is_some_and(|h| h >= 0.0), "{v}");
    // The simulator's section, from this run; the rest of the file as it was.
    let after = read_json(&costs);
    let st = &after["state_transfer"];
    assert_eq!(
        (st["move_base_ms"].clone(), st["per_mib_ms"].clone()),
        (v["fit_base_ms"].clone(), v["fit_per_mib_ms"].clone())
    );
    assert_eq!(st["points"].as_array().map(Vec::len), Some(2), "{st}");
    assert!(st["bench_start"] == "prewarmed" || st["bench_start"] == "cold", "{st}");
    assert_eq!(after["replica_start"], before["replica_start"], "another section was touched");
}

#[test]
fn bench_kernel_start_reports_both_setups_with_and_without_the_pool() {
    let dir = tempfile::tempdir().expect("tempdir");
    let costs = costs_copy(dir.path());
    let v = bench_json(&["bench", "kernel-start", "--samples", "1", "--pool", "1"], Some(&costs));
    assert_eq!((v["samples"].as_u64(), v["pool"].as_u64()), (Some(1), Some(1)), "{v}");
    for setup in ["replica", "cluster_kernel"] {
        let t = &v[setup];
        for key in ["cold_p50_ms", "cold_p99_ms", "pool_p50_ms", "pool_p99_ms", "speedup_p50"] {
            positive(t, key);
        }
        assert!(positive(t, "cold_p50_ms") <= positive(t, "cold_p99_ms"), "{setup}: {t}");
        assert!(positive(t, "pool_p50_ms") <= positive(t, "pool_p99_ms"), "{setup}: {t}");
        // Each pooled sample waited for a full pool first: the kernel's replicas took from it.
        assert!(t["pool_hits"].as_f64().is_some_and(|h| h >= 1.0), "{setup}: the pool served no start: {t}");
    }
    let rs = &read_json(&costs)["replica_start"];
    assert_eq!(
        (rs["cold_ms"].clone(), rs["prewarmed_ms"].clone()),
        (v["replica"]["cold_p50_ms"].clone(), v["replica"]["pool_p50_ms"].clone())
    );
}

#[test]
fn bench_kernel_start_as_the_owner_reports_both_accounts() {
    if !nix_is_root() {
        required::cannot_run(
            "bench_kernel_start_as_the_owner_reports_both_accounts",
            "--run-as owner makes an account and switches to it: root only",
        );
        return;
    }
    let v = bench_json(&["bench", "kernel-start", "--samples", "1", "--pool", "1", "--run-as", "owner"], None);
    assert_eq!(v["samples"], 1, "{v}");
    for mode in ["kernel_user", "owner"] {
        let t = &v[mode];
        for key in ["cold_p50_ms", "cold_p99_ms", "pool_p50_ms", "pool_p99_ms"] {
            positive(t, key);
        }
        assert!(t["pool_hits"].as_u64().is_some_and(|h| h >= 1), "{mode}: the pool served no start: {t}");
    }
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}
