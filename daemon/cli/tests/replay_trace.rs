//! Acceptance of `nbos replay --trace` (issue 34, part 5), on slices small enough for
//! `make test`, each an hour of the Sensei trace replayed at K = 60 on 3 loopback seed hosts running
//! the daemon's defaults with the `exec` autoscale provider, and compared with `nbos sim` of
//! the same cluster and slice, figure by figure, within the tolerances `nbos replay` states
//! (daemon/bench/src/replay/compare.rs; docs/simulator.md, "Replay against a real cluster"):
//!
//! - minute 6960 (7 sessions, 22 trainings): hosts added and released, no replica moves; every
//!   figure held but the two `NOT_HELD` ones. About 90 s of real time.
//! - minute 36480 (8 sessions, 23 trainings): contention, so cells find every replica's host
//!   busy and replicas move (5 measured against the simulator's 7) while the autoscaler adds
//!   hosts (4 against 5). Migrations and scale-outs are held within 2 + a quarter of the larger
//!   count; the GPU-hours bound and the delays are shown with the reason they are not held
//!   (`MOVED_BECAUSE`: a move costs its real seconds × K on the replay, and so does its variance). About 150 s.

use std::path::{Path, PathBuf};
use std::process::Command;

const NBOS: &str = env!("CARGO_BIN_EXE_nbos");
const TRACE: &str = "traces/sensei_june_60sec.csv";
/// A slice whose sessions fit a few minutes of a 2-core machine.
const SLICE: [&str; 6] = ["--start-min", "6960", "--hours", "1", "--seed", "1"];
/// A slice with replica moves and hosts added on both sides (`nbos sim`: 7 and 5).
const MOVES_SLICE: [&str; 6] = ["--start-min", "36480", "--hours", "1", "--seed", "1"];
const SPEEDUP: &str = "60";
const FIGURES: [&str; 7] = [
    "gpu_hours_bound",
    "gpu_hours_provisioned",
    "delay_p50_s",
    "delay_p95_s",
    "delay_p95_after_kernel_start_s",
    "migrations",
    "scale_outs",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn json_of(cmd: &mut Command, what: &str) -> serde_json::Value {
    let out = cmd.current_dir(repo()).output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{what}: not one JSON object ({e})"))
}

/// `nbos replay --trace` of `slice` (its `--out` in `out`): the JSON document.
fn replay(slice: &[&str], out: &Path) -> serde_json::Value {
    let python = repo().join(".venv/bin/python");
    assert!(python.exists(), "{} is missing: create the venv (make deps)", python.display());
    json_of(
        Command::new(NBOS)
            .args(["replay", "--trace", TRACE])
            .args(slice)
            .args(["--speedup", SPEEDUP, "--hosts", "3", "--json", "--python"])
            .arg(&python)
            .arg("--out")
            .arg(out)
            .env_remove("NBOS_URL"),
        "nbos replay --trace",
    )
}

/// Every figure of the comparison states its tolerance and why; one not held says why not,
/// every other one agrees.
fn assert_held_figures_agree(c: &serde_json::Value) {
    for f in FIGURES {
        let fig = &c[f];
        assert!(
            fig["tolerance"].as_f64().is_some() && fig["why"].as_str().is_some_and(|w| !w.is_empty()),
            "{f}: {fig}"
        );
        if fig["held"] == false {
            assert!(fig["not_held_because"].as_str().is_some_and(|w| !w.is_empty()), "{f}: {fig}");
            continue;
        }
        assert_eq!(
            fig["agree"], true,
            "{f}: replay {} vs sim {}, tolerance {}",
            fig["replay"], fig["sim"], fig["tolerance"]
        );
    }
    assert_eq!(c["agree"], true, "{c:#}");
}

#[test]
fn a_trace_slice_replayed_on_an_autoscaled_cluster_agrees_with_the_simulator() {
    let out = tempfile::tempdir().expect("tempdir");
    let replay = replay(&SLICE, out.path());
    let details = &replay["replay"];
    let r = &replay["policies"]["replay"];
    eprintln!("replay: {r}\ncomparison: {:#}", details["comparison"]);

    // Every training ran, and on at least 4 hosts, more added by the autoscaler.
    assert_eq!(r["completed"], r["trainings"]);
    assert_eq!(r["violations"], 0);
    assert!(r["hosts_peak"].as_u64().is_some_and(|h| h >= 4), "{r}");
    assert!(r["scale_outs"].as_u64().is_some_and(|n| n >= 1), "the exec provider added hosts: {r}");

    // The printed command simulates the same sessions: nbos sim's own workload of the slice.
    let argv: Vec<&str> =
        details["sim_command"].as_array().expect("sim_command").iter().map(|a| a.as_str().expect("str")).collect();
    assert!(argv.windows(2).any(|w| w == ["--trace", TRACE]), "{argv:?}");
    let sim = json_of(Command::new(NBOS).args(&argv).arg("--json"), "nbos sim");
    assert_eq!(sim["workload"], replay["workload"], "the same sessions on both sides");
    assert_eq!(sim["policies"]["notebookos"], details["sim"], "the comparison used that command's result");

    // The config the hosts ran, written out: the daemon's defaults with the exec provider
    // and the policy's time constants ÷ K; its trace-time twin for nbos sim --config.
    let ran = std::fs::read_to_string(out.path().join("notebookosd.toml")).expect("notebookosd.toml");
    let config = notebookosd::config::Config::parse(&ran, "notebookosd.toml").expect("the hosts' config parses");
    let defaults = notebookosd::config::Config::default();
    assert_eq!(config.autoscale.provider, notebookosd::config::AutoscaleProvider::Exec);
    assert_eq!(config.autoscale.interval, defaults.autoscale.interval / 60);
    assert_eq!(config.autoscale.peak_window, defaults.autoscale.peak_window / 60);
    assert_eq!(config.gpu.idle_release, defaults.gpu.idle_release / 60);
    assert_eq!(config.gpu.subscription_ratio, defaults.gpu.subscription_ratio);
    assert_eq!(
        (config.autoscale.rule, config.autoscale.min_hosts),
        (defaults.autoscale.rule, defaults.autoscale.min_hosts)
    );
    let sim_toml = std::fs::read_to_string(out.path().join("sim.toml")).expect("sim.toml");
    let sim_config = notebookosd::config::Config::parse(&sim_toml, "sim.toml").expect("sim.toml parses");
    assert_eq!(sim_config.autoscale.interval, defaults.autoscale.interval);
    assert_eq!(sim_config.gpu.idle_release, defaults.gpu.idle_release);

    // Figure by figure, within the stated tolerance: the simulator read the hosts' config
    // (a figure not held, `replay::compare::NOT_HELD`: a gap not yet explained, says why).
    let c = &details["comparison"];
    assert_held_figures_agree(c);
    assert_eq!(c["migrations"]["held"], true, "{c:#}");
}

#[test]
fn a_trace_slice_with_replica_moves_and_scale_outs_holds_both_counts() {
    let out = tempfile::tempdir().expect("tempdir");
    let replay = replay(&MOVES_SLICE, out.path());
    let details = &replay["replay"];
    let r = &replay["policies"]["replay"];
    eprintln!("replay: {r}\ncomparison: {:#}", details["comparison"]);
    assert_eq!(r["completed"], r["trainings"]);
    assert_eq!(r["violations"], 0);
    let c = &details["comparison"];
    // Moves and host events happen on both sides (the slice is chosen for it), and both counts
    // are held within the stated tolerance: 2 + a quarter of the larger count (a decision
    // taken one autoscale interval apart on one side moves a host's worth).
    for f in ["migrations", "scale_outs"] {
        let fig = &c[f];
        let (replayed, simulated) = (fig["replay"].as_f64().unwrap_or(0.0), fig["sim"].as_f64().unwrap_or(0.0));
        assert!(replayed >= 1.0 && simulated >= 1.0, "{f}: the slice must produce some on both sides: {fig}");
        assert_eq!(fig["held"], true, "{f} is held: {fig}");
        let tolerance = 2.0 + 0.25 * replayed.max(simulated);
        assert!((fig["tolerance"].as_f64().unwrap_or(0.0) - tolerance).abs() < 0.01, "{f}: {fig}");
        assert!((replayed - simulated).abs() <= tolerance, "{f}: replay {replayed} vs sim {simulated}");
    }
    assert_held_figures_agree(c);
}
