//! `nbos sim --each-window --hours H`: every whole, non-overlapping H-hour window of a
//! trace from `--start-min` on (a partial last window is left out), each simulated on its
//! own and clipped at its end, and the spread across them of what the headline claims:
//! GPU-hours saved against reservation, and notebookos' delay p95 and p99. It also names
//! the busiest window at any start minute, so a single-window run can be checked against it.

use std::time::Instant;

use anyhow::{bail, Context as _};
use serde_json::json;

use nbos_sched::sim::metrics::round3;
use nbos_sched::sim::workload::{self, Workload};
use nbos_sched::sim::{spread, Model, PolicyKind, PolicyResult};

use super::setup::{check_invariants, par_map, simulate, window_len, workload_of, Args, Source};

/// One window's figures.
struct Window<'k> {
    start_min: u64,
    gpu_min: u64,
    trainings: usize,
    results: Vec<(&'k str, PolicyResult)>,
}

impl Window<'_> {
    fn policy(&self, name: &str) -> Option<&PolicyResult> {
        self.results.iter().find(|(n, _)| *n == name).map(|(_, r)| r)
    }

    /// Reservation's GPU-hours provisioned minus notebookos' (both must have run).
    fn saved(&self) -> Option<f64> {
        let (res, ours) = (self.policy("reservation")?, self.policy("notebookos")?);
        Some(round3(res.gpu_hours_provisioned - ours.gpu_hours_provisioned))
    }
}

/// Runs the windows and prints the table or `--json`.
pub(crate) fn run(a: &Args, src: &Source, kinds: &[PolicyKind], model: &Model, started: Instant) -> anyhow::Result<()> {
    let (Source::Trace(path, jobs), Some((len_min, _))) = (src, window_len(a)) else {
        bail!("--each-window needs --trace and --hours");
    };
    if len_min == 0 {
        bail!("--hours {} is shorter than the trace's minute", a.hours.unwrap_or_default());
    }
    // The trace ends after its last submission minute; only whole windows count.
    let trace_end = jobs.iter().map(|j| j.submit_min + 1).max().unwrap_or(0);
    let starts: Vec<u64> = (0..)
        .map(|i| a.start_min + i * len_min)
        .take_while(|s| s + len_min <= trace_end)
        .filter(|&s| !workload::window(jobs, s, len_min).is_empty())
        .collect();
    if starts.is_empty() {
        bail!("{path} has no whole {len_min}-minute window with jobs from minute {}", a.start_min);
    }
    let workloads: Vec<(u64, Workload)> = par_map(&starts, |&s| workload_of(a, src, s, a.seed))
        .into_iter()
        .map(|w| w.map(|w| (a.seed, w)))
        .collect::<anyhow::Result<_>>()?;
    let bar = crate::progress::bar(a.json, workloads.len() * kinds.len(), "simulations:");
    let runs = simulate(&workloads, kinds, model, &bar)?;
    bar.finish_and_clear();
    check_invariants(&runs, |i| format!(" (window at minute {})", starts[i]))?;
    let windows: Vec<Window<'_>> = starts
        .iter()
        .zip(&workloads)
        .zip(runs)
        .map(|((&start_min, (_, w)), results)| Window {
            start_min,
            gpu_min: workload::window_gpu_min(jobs, start_min, len_min),
            trainings: w.sessions.iter().map(|s| s.trainings.len()).sum(),
            results,
        })
        .collect();
    let ours = |f: fn(&PolicyResult) -> f64| -> Vec<f64> {
        windows.iter().filter_map(|w| w.policy("notebookos").map(f)).collect()
    };
    let spreads = [
        ("saved_gpu_hours", windows.iter().filter_map(Window::saved).collect::<Vec<_>>()),
        ("notebookos_delay_p95_s", ours(|r| r.delay_p95_s)),
        ("notebookos_delay_p99_s", ours(|r| r.delay_p99_s)),
    ];
    let busiest = workload::busiest_window(jobs, len_min).context("no jobs")?;
    let wall_s = (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
    if a.json {
        let mut spread_doc = serde_json::Map::new();
        for (key, xs) in &spreads {
            if let Some(s) = spread::spread(xs) {
                spread_doc.insert((*key).to_owned(), json!(s));
            }
        }
        let list: Vec<serde_json::Value> = windows
            .iter()
            .map(|w| {
                let policies: serde_json::Map<String, serde_json::Value> = w
                    .results
                    .iter()
                    .map(|(n, r)| ((*n).to_owned(), serde_json::to_value(r).unwrap_or_default()))
                    .collect();
                json!({
                    "start_min": w.start_min,
                    "gpu_min": w.gpu_min,
                    "trainings": w.trainings,
                    "saved_gpu_hours": w.saved(),
                    "policies": policies,
                })
            })
            .collect();
        let doc = json!({
            "workload": { "name": path, "window_hours": a.hours, "seed": a.seed },
            "wall_s": wall_s,
            "model": model,
            "windows": list,
            "spread": spread_doc,
            "busiest": { "start_min": busiest.0, "gpu_min": busiest.1 },
        });
        println!("{doc}");
        return Ok(());
    }
    println!(
        "{path}: {} whole {} h windows from minute {} with jobs (seed {}); GPU-min: submitted GPU-minutes inside the window",
        windows.len(),
        a.hours.unwrap_or_default(),
        a.start_min,
        a.seed
    );
    println!(
        "{:>9} {:>9} {:>9} {:>12} {:>12} {:>11} {:>8} {:>8}",
        "start min", "GPU-min", "trainings", "reserv. GPU-h", "nbos GPU-h", "saved GPU-h", "p95 s", "p99 s"
    );
    let cell = |x: Option<f64>, p: usize| x.map_or_else(|| "-".to_owned(), |x| format!("{x:.p$}"));
    for w in &windows {
        let (res, nb) = (w.policy("reservation"), w.policy("notebookos"));
        println!(
            "{:>9} {:>9} {:>9} {:>12} {:>12} {:>11} {:>8} {:>8}",
            w.start_min,
            w.gpu_min,
            w.trainings,
            cell(res.map(|r| r.gpu_hours_provisioned), 1),
            cell(nb.map(|r| r.gpu_hours_provisioned), 1),
            cell(w.saved(), 1),
            cell(nb.map(|r| r.delay_p95_s), 3),
            cell(nb.map(|r| r.delay_p99_s), 3),
        );
    }
    for (key, xs) in &spreads {
        if let Some(s) = spread::spread(xs) {
            println!("{key}: min {:.3}, median {:.3}, max {:.3}", s.min, s.median, s.max);
        }
    }
    println!(
        "busiest {} h window at any start: minute {} ({} GPU-min inside it)",
        a.hours.unwrap_or_default(),
        busiest.0,
        busiest.1
    );
    println!("wall time {wall_s:.3} s");
    Ok(())
}
