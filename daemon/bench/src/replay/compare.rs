//! A trace replay against the simulator, figure by figure: the `nbos sim` command that
//! simulates the same cluster and slice ([`sim_argv`], the one place that builds it), its
//! result, and per figure the tolerance and why (docs/simulator.md, "Replay against a real
//! cluster").
//!
//! Every real cost is K times larger in trace time, so each tolerance is a real-time
//! budget × K, plus what the model cannot know about timing on a real cluster:
//!
//! - GPU-hours bound: per cell, GPUs × (one sampling period + [`CELL_S`] + [`TICK_S`]) × K:
//!   gauges read a period late, a cell's own overhead around its sleep, and the daemon's 1 s
//!   idle-release tick;
//! - GPU-hours provisioned: every host event (added or released, either side) may fall one
//!   autoscale interval earlier or later and its boot lasts [`BOOT_REAL_S`] × K on the
//!   replay, so GPUs per host × (interval + boot) each, plus the hosts' GPUs × [`DELETE_S`]
//!   × K (the replay ends when the last deletion is answered);
//! - delay p50: [`DELAY_S`] × K (election and GPU commit: 2 ms in the model, up to 20 ms on a
//!   busy 2-core VM, plus the client's timer wake-up); delay p95: the same plus the longest
//!   real wait a cell can have that the model prices in seconds: a host's boot and one
//!   interval (a cell that waits for a host), or its kernel's start (a cell due before its
//!   kernel's three replicas have started waits for them: measured, × K);
//! - delay p95 after the kernel's start (the replay's cells' submission moved to their
//!   kernel's start when that came later; against the simulator's p95): [`DELAY_S`] × K plus
//!   a host's boot and one interval: the scheduler's tail without the kernel starts that the
//!   compression magnifies K times;
//! - migrations and scale-outs: counts of discrete decisions; a decision taken one interval
//!   apart (the K-fold costs above shift the demand curve) changes one of them by a host's
//!   worth: ± (2 + a quarter of the larger count).
//!
//! The simulator reads the hosts' own config (`nbos sim --config`), so it runs their
//! autoscale rule with their parameters: every figure is compared. On a replay that moved
//! replicas the GPU-hours bound and the delays are shown but not held ([`MOVED_BECAUSE`]); the
//! migrations and scale-outs are held whatever happened.

use std::path::Path;
use std::process::Command;

use anyhow::Context as _;

use super::autoscaled::BOOT_REAL_S;
use super::report::ClusterModel;

/// A cell's own overhead around its sleep (ipykernel's start of it, its namespace's export
/// and commit, the reply), real seconds: 24–47 ms measured, 250 ms on a loaded 2-core VM.
pub const CELL_S: f64 = 0.25;
/// The daemon's idle-release tick, real seconds (`node/kernels.rs`).
pub const TICK_S: f64 = 1.0;
/// Real delay budget per cell, seconds.
pub const DELAY_S: f64 = 0.1;
/// Deleting the last kernel, real seconds.
pub const DELETE_S: f64 = 1.0;

/// The `nbos sim` arguments that simulate the replayed cluster and slice: the same
/// workload flags (so the same sessions) and the cluster's model. With `config` (the file
/// the hosts ran, in trace time) the simulator reads the policy from it as the daemons did
/// (`nbos sim --config`), and only what a config does not say comes from flags: GPUs per
/// host, a host's boot and an election, in trace time, (`costs`, [`costs_in_trace_time`])
/// the moves' state transfers, and the hosts up from the start: the replay's founding
/// hosts are the cluster's seeds, which the autoscaler never releases, so the simulation
/// starts with as many and keeps them (`--min-hosts`, at least the config's).
pub fn sim_argv(workload: &[String], cm: &ClusterModel, config: Option<(&Path, &Path)>) -> Vec<String> {
    let mut argv = vec!["sim".to_owned()];
    argv.extend(workload.iter().cloned());
    match (config, &cm.autoscale) {
        (Some((path, costs)), Some(a)) => argv.extend([
            "--policy".to_owned(),
            "notebookos".to_owned(),
            "--config".to_owned(),
            path.display().to_string(),
            "--costs".to_owned(),
            costs.display().to_string(),
            "--min-hosts".to_owned(),
            a.floor(cm.hosts).to_string(),
            "--gpus-per-host".to_owned(),
            cm.gpus_per_host.to_string(),
            "--provision-s".to_owned(),
            a.provision_s.to_string(),
            "--election-ms".to_owned(),
            cm.election_ms.to_string(),
        ]),
        _ => argv.extend(cm.sim_args()),
    }
    argv
}

/// The cost file for the simulation of a replay compressed `speedup` times: the measured
/// one with every state transfer `speedup` times as long, as a real transfer's seconds
/// are in the replay's trace time. (Replica starts stay: the replay's kernel starts are
/// compared separately, [`AFTER_START`].)
pub fn costs_in_trace_time(speedup: f64) -> anyhow::Result<String> {
    let costs = nbos_sched::sim::costs::Costs::measured().with_transfers_times(speedup);
    serde_json::to_string_pretty(&costs).context("encoding the replay's cost file")
}

/// Runs `nbos <argv> --json` (this `nbos`) and returns its `notebookos` result.
pub fn simulate(argv: &[String]) -> anyhow::Result<serde_json::Value> {
    let nbos = std::env::current_exe().context("finding nbos")?;
    let out = Command::new(&nbos).args(argv).arg("--json").output().context("running nbos sim")?;
    anyhow::ensure!(out.status.success(), "nbos {} failed: {}", argv.join(" "), String::from_utf8_lossy(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).context("nbos sim --json: not JSON")?;
    doc.get("policies").and_then(|p| p.get("notebookos")).cloned().context("nbos sim --json has no policies.notebookos")
}

/// The replay's delay p95 with each cell's submission moved to its kernel's start.
pub const AFTER_START: &str = "delay_p95_after_kernel_start_s";

/// Figures shown but left out of `"agree"`, with why: gaps between the model and the
/// daemons seen on the test's slice and not yet explained (issue 34 stays open on them).
pub const NOT_HELD: [(&str, &str); 2] = [
    (
        "gpu_hours_provisioned",
        "the autoscaled loopback cluster provisioned 1.2-1.4 x what the simulator's Decider provisions for the same \
         config and slice (hosts booting under load, draining); not yet explained",
    ),
    (
        "background_moves",
        "the daemons' drains moved replicas off hosts that the simulator's drains found empty; not yet explained",
    ),
];

/// The figures a replica move distorts on the replay, left out of `"agree"` when the replay
/// moved replicas ([`MOVED_BECAUSE`]); migrations and scale-outs are held either way.
pub const MOVE_DISTORTED: [&str; 4] = ["gpu_hours_bound", "delay_p50_s", "delay_p95_s", AFTER_START];

/// Why [`MOVE_DISTORTED`] figures are not held on a replay with moves.
pub const MOVED_BECAUSE: &str = "the replay moved replicas: a move's real seconds (about 3 s) count K times in trace \
     time, and so does their variance under load (this slice's delay p50 was 5.6 s in one run and 34 s in another at \
     K = 60, its GPU-h bound 1.3-1.4 x the simulator's); the simulation charges the measured transfer x K (the \
     replay's costs.json) but not that variance";

/// What the tolerances are computed from.
#[derive(Debug, Clone, Copy)]
pub struct Basis {
    /// The speedup K.
    pub speedup: f64,
    /// The sampler's period, real seconds.
    pub sample_s: f64,
    /// Σ over the cells of their GPUs.
    pub cell_gpus: f64,
    /// GPUs per host.
    pub gpus_per_host: f64,
    /// The most hosts up at once on the replay.
    pub hosts_peak: f64,
    /// `autoscale.interval` in trace seconds.
    pub interval_s: f64,
    /// The longest kernel start of the replay, real seconds.
    pub kernel_start_max_s: f64,
    /// [`AFTER_START`] of the replay, trace seconds.
    pub delay_p95_after_kernel_start_s: f64,
}

fn num(v: &serde_json::Value, k: &str) -> f64 {
    v.get(k).and_then(serde_json::Value::as_f64).unwrap_or(f64::NAN)
}

/// Per figure: the replay's value, the simulator's, the tolerance, why, and whether they
/// agree; plus `"agree"` over all of them.
pub fn compare(replay: &serde_json::Value, sim: &serde_json::Value, b: &Basis) -> serde_json::Value {
    // The replay's p95 after its kernels started, against the simulator's p95.
    let mut replay = replay.clone();
    let mut sim = sim.clone();
    let sim_p95 = sim.get("delay_p95_s").cloned().unwrap_or_default();
    if let (Some(r), Some(s)) = (replay.as_object_mut(), sim.as_object_mut()) {
        r.insert(AFTER_START.to_owned(), b.delay_p95_after_kernel_start_s.into());
        s.insert(AFTER_START.to_owned(), sim_p95);
    }
    let (replay, sim) = (&replay, &sim);
    let k = b.speedup;
    let boot_s = BOOT_REAL_S * k;
    let host_events = |v: &serde_json::Value| num(v, "scale_outs") + num(v, "scale_ins");
    let events = host_events(replay) + host_events(sim);
    let count = |k: &str| 2.0 + 0.25 * num(replay, k).max(num(sim, k));
    let figures: [(&str, f64, String); 7] = [
        (
            "gpu_hours_bound",
            b.cell_gpus * (b.sample_s + CELL_S + TICK_S) * k / 3600.0,
            format!(
                "per cell GPUs x (sampling {} s + cell overhead {CELL_S} s + idle-release tick {TICK_S} s) x K",
                b.sample_s
            ),
        ),
        (
            "gpu_hours_provisioned",
            (events * b.gpus_per_host * (b.interval_s + boot_s) + b.hosts_peak * b.gpus_per_host * DELETE_S * k)
                / 3600.0,
            format!(
                "per host event (both sides) GPUs per host x (interval {} s + boot {BOOT_REAL_S} s x K), plus the \
                 hosts' GPUs x last deletion {DELETE_S} s x K",
                b.interval_s
            ),
        ),
        ("delay_p50_s", DELAY_S * k, format!("election and GPU commit {DELAY_S} s x K")),
        (
            "delay_p95_s",
            DELAY_S * k + (boot_s + b.interval_s).max(b.kernel_start_max_s * k),
            format!(
                "election and GPU commit {DELAY_S} s x K, plus the longer of a wait for a host (boot {BOOT_REAL_S} s \
                 x K + interval {} s) and for the kernel's start ({} s measured x K)",
                b.interval_s, b.kernel_start_max_s
            ),
        ),
        (
            AFTER_START,
            DELAY_S * k + boot_s + b.interval_s,
            format!(
                "election and GPU commit {DELAY_S} s x K, plus a wait for a host (boot {BOOT_REAL_S} s x K + interval \
                 {} s); each cell's submission moved to its kernel's start when that came later",
                b.interval_s
            ),
        ),
        ("migrations", count("migrations"), "decisions one interval apart: 2 + a quarter of the larger count".into()),
        ("scale_outs", count("scale_outs"), "decisions one interval apart: 2 + a quarter of the larger count".into()),
    ];
    // JSON rounding: GPU-hours have 3 decimals, delays 3 (both sides).
    let rounding = 0.001;
    let moved = num(replay, "migrations") > 0.0;
    let mut out = serde_json::Map::new();
    let mut all = true;
    for (name, tol, why) in figures {
        let (r, s) = (num(replay, name), num(sim, name));
        let tolerance = nbos_sched::sim::metrics::round3(tol + rounding);
        let agree = (r - s).abs() <= tolerance;
        let because = NOT_HELD
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, b)| *b)
            .or_else(|| (moved && MOVE_DISTORTED.contains(&name)).then_some(MOVED_BECAUSE));
        let held = because.is_none();
        all &= agree || !held;
        let mut fig = serde_json::json!({"replay": r, "sim": s, "tolerance": tolerance, "agree": agree, "why": why, "held": held});
        if let Some(because) = because {
            fig["not_held_because"] = because.into();
        }
        out.insert(name.to_owned(), fig);
    }
    out.insert(
        "background_moves".to_owned(),
        serde_json::json!({"replay": num(replay, "background_moves"), "sim": num(sim, "background_moves"),
            "held": false, "not_held_because": NOT_HELD[1].1}),
    );
    out.insert("agree".to_owned(), serde_json::Value::Bool(all));
    serde_json::Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_figure_agrees_within_its_tolerance_and_not_beyond() {
        let b = Basis {
            speedup: 10.0,
            sample_s: 0.05,
            cell_gpus: 4.0,
            gpus_per_host: 8.0,
            hosts_peak: 4.0,
            interval_s: 30.0,
            kernel_start_max_s: 2.0,
            delay_p95_after_kernel_start_s: 1.0,
        };
        let doc = |delay_p50_s: f64| {
            serde_json::json!({"gpu_hours_bound": 1.0, "gpu_hours_provisioned": 10.0, "delay_p50_s": delay_p50_s,
                "delay_p95_s": 1.0, "migrations": 0, "scale_outs": 3, "scale_ins": 0})
        };
        let same = compare(&doc(0.5), &doc(0.5), &b);
        assert_eq!(same["agree"], true, "{same}");
        // p50's tolerance is 0.1 s x 10 (+ rounding): 1.0 s off agrees, 1.1 s does not.
        assert_eq!(compare(&doc(1.5), &doc(0.5), &b)["delay_p50_s"]["agree"], true);
        let off = compare(&doc(1.6), &doc(0.5), &b);
        assert_eq!((off["delay_p50_s"]["agree"].clone(), off["agree"].clone()), (false.into(), false.into()));
    }

    #[test]
    fn a_replay_with_moves_holds_the_counts_and_says_why_not_the_timings() {
        let b = Basis {
            speedup: 60.0,
            sample_s: 0.05,
            cell_gpus: 4.0,
            gpus_per_host: 8.0,
            hosts_peak: 6.0,
            interval_s: 30.0,
            kernel_start_max_s: 2.0,
            delay_p95_after_kernel_start_s: 400.0,
        };
        let doc = |migrations: u64, delay_p50_s: f64| {
            serde_json::json!({"gpu_hours_bound": 1.0, "gpu_hours_provisioned": 10.0, "delay_p50_s": delay_p50_s,
                "delay_p95_s": 1.0, "migrations": migrations, "scale_outs": 3, "scale_ins": 0})
        };
        // Delays far apart: with moves on the replay they are shown, not held.
        let moved = compare(&doc(4, 60.0), &doc(3, 0.1), &b);
        assert_eq!(moved["agree"], true, "{moved:#}");
        assert_eq!(
            (moved["delay_p50_s"]["held"].clone(), moved["delay_p50_s"]["agree"].clone()),
            (false.into(), false.into())
        );
        assert_eq!(moved["delay_p50_s"]["not_held_because"], MOVED_BECAUSE);
        assert_eq!(
            (moved["migrations"]["held"].clone(), moved["scale_outs"]["held"].clone()),
            (true.into(), true.into())
        );
        // The counts are still held: 4 moves against none is beyond 2 + a quarter of 4.
        let counts_off = compare(&doc(4, 0.1), &doc(0, 0.1), &b);
        assert_eq!(
            (counts_off["migrations"]["agree"].clone(), counts_off["agree"].clone()),
            (false.into(), false.into())
        );
        // Without moves every timing is held as before.
        let still = compare(&doc(0, 60.0), &doc(0, 0.1), &b);
        assert_eq!((still["delay_p50_s"]["held"].clone(), still["agree"].clone()), (true.into(), false.into()));
    }
}
