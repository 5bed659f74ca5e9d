//! `nbos sim` end to end: a small window of the Sensei trace and a session template,
//! under every policy. The same seed gives the same JSON (wall time aside), and every
//! policy keeps its promises: no GPU committed twice (the simulator's independent
//! ledger reports violations), every training runs, bound >= floor, provisioned >= bound.

use std::path::PathBuf;
use std::process::Command;

const NBOS: &str = env!("CARGO_BIN_EXE_nbos");

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn sim(args: &[&str]) -> serde_json::Value {
    let out =
        Command::new(NBOS).arg("sim").args(args).arg("--json").current_dir(repo()).output().expect("run nbos sim");
    assert!(out.status.success(), "nbos sim {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let mut v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert!(v["wall_s"].as_f64().is_some_and(|w| w >= 0.0), "wall_s: {v}");
    // The only key allowed to differ between runs.
    v.as_object_mut().expect("object").remove("wall_s");
    v
}

fn check_invariants(v: &serde_json::Value, what: &str) {
    let policies = v["policies"].as_object().expect("policies");
    let names: Vec<&str> = policies.keys().map(String::as_str).collect();
    for want in ["reservation", "fcfs-batch", "middle-ground", "notebookos-paper", "notebookos"] {
        assert!(names.contains(&want), "{what}: no {want} in {names:?}");
    }
    for (name, p) in policies {
        let f = |k: &str| p[k].as_f64().unwrap_or_else(|| panic!("{what} {name}: no {k}"));
        let u = |k: &str| p[k].as_u64().unwrap_or_else(|| panic!("{what} {name}: no {k}"));
        assert_eq!(u("violations"), 0, "{what} {name}: {p}");
        assert_eq!(u("completed"), u("trainings"), "{what} {name}: every training runs");
        assert!(u("trainings") > 0);
        // Rounded to 3 decimals: allow the rounding.
        assert!(f("gpu_hours_bound") + 0.002 >= f("floor_gpu_hours"), "{what} {name}: bound >= floor: {p}");
        assert!(f("gpu_hours_provisioned") + 0.002 >= f("gpu_hours_bound"), "{what} {name}: provisioned >= bound");
        assert!(f("gpu_hours_bound") + 0.002 >= f("gpu_hours_committed"));
        for k in ["delay_p50_s", "delay_p95_s", "delay_p99_s", "delay_max_s"] {
            assert!(f(k) >= 0.0);
        }
        assert!(f("delay_p50_s") <= f("delay_p95_s") && f("delay_p95_s") <= f("delay_p99_s"));
        assert!(f("delay_p99_s") <= f("delay_max_s"));
        for k in ["delayed_over_1s", "delayed_over_10s", "migrations", "scale_outs", "scale_ins"] {
            let _ = u(k);
        }
        assert!(u("delayed_over_10s") <= u("delayed_over_1s"));
        if !name.starts_with("notebookos") {
            assert_eq!(u("migrations"), 0, "{what} {name}: single-replica policies never migrate");
        }
    }
}

#[test]
fn trace_window_is_deterministic_and_keeps_invariants() {
    let args = ["--trace", "traces/sensei_june_60sec.csv", "--start-min", "33720", "--hours", "4", "--seed", "7"];
    let a = sim(&args);
    let b = sim(&args);
    assert_eq!(a, b, "same seed, same JSON");
    check_invariants(&a, "trace window");
    let c = sim(&["--trace", "traces/sensei_june_60sec.csv", "--start-min", "33720", "--hours", "4", "--seed", "8"]);
    assert_ne!(a["workload"], c["workload"], "another seed generates other sessions");
}

#[test]
fn templates_and_synthetic_keep_invariants() {
    for t in ["Template-8Session-39.53IAT-22.95Dur.json", "four-sessions-varied-training.json", "fcfs_test.json"] {
        let path = format!("traces/templates/{t}");
        let a = sim(&["--template", &path]);
        assert_eq!(a, sim(&["--template", &path]), "{t}: same JSON");
        check_invariants(&a, t);
    }
    let s = sim(&["--synthetic", "--sessions", "60", "--synthetic-hours", "6", "--seed", "3"]);
    check_invariants(&s, "synthetic");
}

#[test]
fn out_dir_files_are_byte_identical_for_a_seed() {
    let dirs = [tempfile::tempdir().expect("tmp"), tempfile::tempdir().expect("tmp")];
    for d in &dirs {
        let out = Command::new(NBOS)
            .args(["sim", "--template", "traces/templates/Template-8Session-39.53IAT-22.95Dur.json", "--out"])
            .arg(d.path())
            .current_dir(repo())
            .output()
            .expect("run");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains("notebookos-paper"));
    }
    for f in ["report.md", "results.json", "hosts.svg", "gpus_bound.svg", "delay_cdf.svg"] {
        let a = std::fs::read(dirs[0].path().join(f)).expect("written");
        let b = std::fs::read(dirs[1].path().join(f)).expect("written");
        assert!(!a.is_empty());
        assert_eq!(a, b, "{f} differs between runs");
    }
    let md = std::fs::read_to_string(dirs[0].path().join("report.md")).expect("md");
    assert!(md.contains("![delay CDF](delay_cdf.svg)"));
}

#[test]
fn bad_inputs_are_named() {
    let dir = tempfile::tempdir().expect("tmp");
    let csv = dir.path().join("t.csv");
    std::fs::write(&csv, "job_id,num_gpu,submit_time,duration\n1,1,0,5\n2,one,1,5\n").expect("write");
    let out = Command::new(NBOS).args(["sim", "--trace"]).arg(&csv).output().expect("run");
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("line 3") && e.contains("num_gpu"), "{e}");
    let out = Command::new(NBOS).args(["sim", "--synthetic", "--policy", "gandiva"]).output().expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown policy"));
    let out = Command::new(NBOS).args(["sim"]).output().expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--trace"));
    // Model values that make no cluster are refused with what is wrong, not a panic.
    for (flags, says) in [
        (&["--paper-max-ratio", "0.5"][..], "max ratio must be >= 1"),
        (&["--provision-s", "1", "--provision-jitter-s", "5"][..], "must not exceed the provisioning time"),
        (&["--scaling-interval-s", "0"][..], "scaling interval"),
    ] {
        let out = Command::new(NBOS).args(["sim", "--synthetic"]).args(flags).output().expect("run");
        assert!(!out.status.success(), "{flags:?} accepted");
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(e.contains(says) && !e.contains("panicked"), "{flags:?}: {e}");
    }
}
