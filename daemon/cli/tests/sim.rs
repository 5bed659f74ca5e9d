//! `nbos sim` end to end: a small window of the Sensei trace and a session template,
//! under every policy. The same seed gives the same JSON (wall time aside), and every
//! policy keeps its promises: no GPU committed twice (the simulator's independent
//! ledger reports violations), every training runs (or, in a window, is counted as cut or
//! not started at its end), bound >= floor, provisioned >= bound. The command line: help,
//! out-of-range values, trace rows no host can run, `--seeds`, `--each-window`.

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

fn nbos_sim(args: &[&str]) -> std::process::Output {
    Command::new(NBOS).arg("sim").args(args).current_dir(repo()).output().expect("run nbos sim")
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
        assert_eq!(
            u("completed") + u("cut") + u("not_started"),
            u("trainings"),
            "{what} {name}: every training counted"
        );
        if v["workload"]["name"].as_str().is_some_and(|n| !n.contains(" h)")) {
            assert_eq!(u("completed"), u("trainings"), "{what} {name}: without a window every training runs");
        }
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
fn a_window_ends_at_its_end_for_every_policy() {
    let v = sim(&["--trace", "traces/sensei_june_60sec.csv", "--start-min", "33720", "--hours", "4"]);
    let mut cut = 0;
    for (name, p) in v["policies"].as_object().expect("policies") {
        let h = p["sim_hours"].as_f64().expect("sim_hours");
        assert!(h > 3.0 && h <= 4.0, "{name}: simulated {h} h of a 4 h window");
        cut += p["cut"].as_u64().expect("cut");
    }
    assert!(cut > 0, "4 busy hours end with trainings running: {v}");
}

#[test]
fn seeds_report_each_figures_mean_and_interval() {
    let base = ["--trace", "traces/sensei_june_60sec.csv", "--start-min", "33720", "--hours", "2", "--seed", "5"];
    let v = sim(&[&base[..], &["--seeds", "3"]].concat());
    assert_eq!(v["seeds"]["n"], 3);
    assert_eq!(v["policies"], sim(&base)["policies"], "policies holds the first seed's results");
    for name in ["reservation", "fcfs-batch", "middle-ground", "notebookos-paper", "notebookos"] {
        let figures = v["seeds"][name].as_object().unwrap_or_else(|| panic!("seeds.{name}: {v}"));
        for key in ["gpu_hours_provisioned", "delay_p95_s", "delay_p99_s", "sim_hours", "migrations"] {
            let f = &figures[key];
            let (m, lo, hi) = (f["mean"].as_f64(), f["lo"].as_f64(), f["hi"].as_f64());
            let (Some(m), Some(lo), Some(hi)) = (m, lo, hi) else { panic!("seeds.{name}.{key}: {f}") };
            assert!(lo <= m && m <= hi, "seeds.{name}.{key}: {f}");
        }
        if name != "reservation" {
            let s = &figures["saved_gpu_hours"];
            assert!(s["lo"].as_f64() <= s["mean"].as_f64() && s["mean"].as_f64() <= s["hi"].as_f64(), "{name}: {s}");
        }
        // Different seeds generate different sessions: provisioning differs between them.
        let g = &figures["gpu_hours_provisioned"];
        assert!(g["hi"].as_f64() > g["lo"].as_f64(), "{name}: no spread over 3 seeds: {g}");
    }
}

#[test]
fn each_window_reports_every_whole_window_and_the_spread() {
    let dir = tempfile::tempdir().expect("tmp");
    let csv = dir.path().join("t.csv");
    // A job every 3 minutes from minute 0 to 177: the third hour is not whole.
    let mut rows = String::from("job_id,num_gpu,submit_time,duration\n");
    for i in 0..60u32 {
        rows.push_str(&format!("{i},{},{},{}\n", 1 + i % 4, i * 3, 5 + i % 50));
    }
    std::fs::write(&csv, rows).expect("write");
    let out = nbos_sim(&["--trace", csv.to_str().expect("utf-8"), "--hours", "1", "--each-window", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let windows = v["windows"].as_array().expect("windows");
    let starts: Vec<u64> = windows.iter().filter_map(|w| w["start_min"].as_u64()).collect();
    assert_eq!(starts, [0, 60], "whole windows only: the trace ends at minute 178");
    for w in windows {
        for (name, p) in w["policies"].as_object().expect("policies") {
            assert!(p["sim_hours"].as_f64().is_some_and(|h| h <= 1.0), "{name}: {p}");
        }
        let saved = w["policies"]["reservation"]["gpu_hours_provisioned"]
            .as_f64()
            .zip(w["policies"]["notebookos"]["gpu_hours_provisioned"].as_f64());
        let want = saved.map(|(r, n)| ((r - n) * 1000.0).round() / 1000.0);
        assert_eq!(w["saved_gpu_hours"].as_f64(), want);
    }
    let s = &v["spread"]["saved_gpu_hours"];
    let saved: Vec<f64> = windows.iter().filter_map(|w| w["saved_gpu_hours"].as_f64()).collect();
    assert_eq!(s["min"].as_f64(), saved.iter().copied().reduce(f64::min));
    assert_eq!(s["max"].as_f64(), saved.iter().copied().reduce(f64::max));
    for k in ["notebookos_delay_p95_s", "notebookos_delay_p99_s"] {
        assert!(v["spread"][k]["median"].as_f64().is_some(), "{k}: {v}");
    }
    // The densest hour by GPU-minutes inside it starts at some job's submission, and
    // --busiest replays that hour.
    let busiest = v["busiest"]["start_min"].as_u64().expect("busiest");
    assert!(busiest.is_multiple_of(3), "{}", v["busiest"]);
    let out = nbos_sim(&["--trace", csv.to_str().expect("utf-8"), "--hours", "1", "--busiest", "--json"]);
    let b: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let name = b["workload"]["name"].as_str().expect("name");
    assert!(name.contains(&format!("(minutes {busiest}..")), "{name}");
}

#[test]
fn help_lists_only_the_simulators_flags() {
    let out = nbos_sim(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in ["--trace", "--hours", "--seeds", "--each-window", "--busiest", "--gpus-per-host"] {
        assert!(help.contains(flag), "sim --help lacks {flag}:\n{help}");
    }
    for flag in ["--url", "--token-file", "--ca-cert", "--client-cert", "--operator-token-file"] {
        assert!(!help.contains(flag), "sim --help lists the client's {flag}:\n{help}");
    }
    // The subcommands that connect still list them.
    let out = Command::new(NBOS).args(["status", "--help"]).output().expect("run");
    assert!(String::from_utf8_lossy(&out.stdout).contains("--url"));
}

#[test]
fn out_of_range_values_get_one_message_in_either_form() {
    for (flag, value, says) in [
        ("--hours", "-1", "must be a number greater than 0"),
        ("--hours", "0", "must be a number greater than 0"),
        ("--seeds", "0", "must be a whole number, 1 or more"),
        ("--seeds", "-2", "must be a whole number, 1 or more"),
        ("--gpus-per-host", "0", "must be a whole number, 1 or more"),
        ("--provision-s", "-1", "must be a whole number, 0 or more"),
        ("--start-min", "-60", "must be a whole number, 0 or more"),
        ("--subscription-ratio", "0.5", "must be a number, 1 or more"),
        ("--paper-max-ratio", "-3", "must be a number, 1 or more"),
        ("--scaling-interval-s", "0", "must be a whole number, 1 or more"),
        ("--session-gap-min", "-1", "must be a number, 0 or more"),
        ("--synthetic-hours", "0", "must be a number greater than 0"),
    ] {
        let spaced = nbos_sim(&["--synthetic", flag, value]);
        let joined = nbos_sim(&["--synthetic", &format!("{flag}={value}")]);
        let e = String::from_utf8_lossy(&spaced.stderr);
        assert_eq!(spaced.status.code(), Some(2), "{flag} {value}: {e}");
        assert!(e.contains(&format!("invalid value '{value}' for '{flag}")) && e.contains(says), "{flag} {value}: {e}");
        assert_eq!(e, String::from_utf8_lossy(&joined.stderr), "{flag}={value} says the same");
    }
}

#[test]
fn trace_rows_no_host_can_run_are_refused_by_their_line() {
    let dir = tempfile::tempdir().expect("tmp");
    for (row, flags, says) in [
        ("2,0,1,5", &[][..], "line 3: `num_gpu` is 0"),
        ("2,1,1,0", &[][..], "line 3: `duration` is 0"),
        ("2,16,1,5", &[][..], "line 3: `num_gpu` is 16, more than a host's 8 GPUs"),
        ("2,4,1,5", &["--gpus-per-host", "2"][..], "line 3: `num_gpu` is 4, more than a host's 2 GPUs"),
    ] {
        let csv = dir.path().join("t.csv");
        std::fs::write(&csv, format!("job_id,num_gpu,submit_time,duration\n1,1,0,5\n{row}\n")).expect("write");
        let out = nbos_sim(&[&["--trace", csv.to_str().expect("utf-8")][..], flags].concat());
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && e.contains(says), "{row} {flags:?}: {e}");
    }
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
        (&["--paper-max-ratio", "0.5"][..], "must be a number, 1 or more"),
        (&["--provision-s", "1", "--provision-jitter-s", "5"][..], "must not exceed the provisioning time"),
        (&["--scaling-interval-s", "0"][..], "must be a whole number, 1 or more"),
    ] {
        let out = Command::new(NBOS).args(["sim", "--synthetic"]).args(flags).output().expect("run");
        assert!(!out.status.success(), "{flags:?} accepted");
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(e.contains(says) && !e.contains("panicked"), "{flags:?}: {e}");
    }
}

/// `--sweep DIR`: every policy's point and a grid of notebookos', both plots, and the point
/// shipped is one of notebookos' (the one meeting every target, else the lowest p95 within
/// cost and p99), named in the markdown and marked in the plots.
#[test]
fn the_sweep_writes_its_points_plots_and_the_point_it_ships() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = nbos_sim(&[
        "--template",
        "traces/templates/Template-8Session-39.53IAT-22.95Dur.json",
        "--sweep",
        dir.path().to_str().expect("utf-8"),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("sweep.json")).expect("sweep.json"))
            .expect("JSON");
    let points = doc["points"].as_array().expect("points");
    for want in ["reservation", "fcfs-batch", "middle-ground", "notebookos-paper"] {
        assert_eq!(points.iter().filter(|p| p["policy"] == want).count(), 1, "{want} once");
    }
    let ours: Vec<&serde_json::Value> = points.iter().filter(|p| p["policy"] == "notebookos").collect();
    assert!(ours.len() >= 20, "a grid of notebookos' parameters: {}", ours.len());
    assert!(ours.iter().any(|p| p["label"].as_str().is_some_and(|l| l.contains("rule=paper"))));
    if let Some(shipped) = doc["shipped"].as_object() {
        assert_eq!(shipped["policy"], "notebookos");
        let label = shipped["label"].as_str().expect("label");
        let md = std::fs::read_to_string(dir.path().join("sweep.md")).expect("sweep.md");
        assert!(md.contains(&format!("**{label}**")), "{md}");
        let svg = std::fs::read_to_string(dir.path().join("cost_p95.svg")).expect("svg");
        assert!(svg.contains(&format!("shipped: {label}")));
        let reservation = doc["reservation_gpu_hours"].as_f64().expect("reservation");
        assert!(shipped["gpu_hours"].as_f64().expect("cost") <= 0.75 * reservation + 1e-9, "{shipped:?}");
    }
    for svg in ["cost_p95.svg", "cost_p99.svg"] {
        let text = std::fs::read_to_string(dir.path().join(svg)).expect(svg);
        assert!(text.matches("<circle").count() > ours.len(), "{svg}: a dot per point");
    }
}
