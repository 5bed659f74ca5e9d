//! `nbos sim`: replays a workload under the scheduling policies in virtual time
//! (`nbos_sched::sim`, driving the daemon's scheduler core) and prints a table or
//! `--json`; `--out DIR` also writes SVG plots and a markdown report. See
//! `docs/simulator.md`.
//!
//! - [`setup`]: the flags, the workloads and model they make, the runs and files;
//! - [`windows`]: `--each-window`; [`sweep`]: `--sweep`.

mod setup;
mod sweep;
mod windows;

use std::time::Instant;

use anyhow::bail;

use nbos_sched::sim::workload::Workload;
use nbos_sched::sim::{report, spread};

use self::setup::{check_invariants, par_map, policies, simulate, source, start_min, workload_of};
pub use self::setup::{load, load_template, model, write_out, Args};

/// Runs the subcommand.
pub fn run(a: Args) -> anyhow::Result<()> {
    let kinds = policies(&a.policy)?;
    let model = model(&a)?;
    let started = Instant::now();
    let src = source(&a)?;
    if a.each_window {
        return windows::run(&a, &src, &kinds, &model, started);
    }
    let start_min = start_min(&a, &src)?;
    if let Some(dir) = &a.sweep {
        return sweep::run(&a, &src, start_min, &model, dir, started);
    }
    let seeds: Vec<u64> = (0..u64::from(a.seeds)).map(|i| a.seed.saturating_add(i)).collect();
    let workloads: Vec<(u64, Workload)> = par_map(&seeds, |&seed| workload_of(&a, &src, start_min, seed))
        .into_iter()
        .zip(&seeds)
        .map(|(w, &seed)| w.map(|w| (seed, w)))
        .collect::<anyhow::Result<_>>()?;
    let bar = crate::progress::bar(a.json, workloads.len() * kinds.len(), "simulations:");
    let runs = simulate(&workloads, &kinds, &model, &bar)?;
    bar.finish_and_clear();
    let wall_s = (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
    let (Some((_, w)), Some(results)) = (workloads.first(), runs.first()) else { bail!("no seed to run") };
    let stats = w.stats();
    // One seed reports as it always did; more add their summary.
    let summary = (runs.len() > 1).then(|| spread::across_seeds(&runs));
    if let Some(dir) = &a.out {
        write_out(dir, &w.name, &stats, &model, results, summary.clone().map(|s| ("seeds", s)))?;
    }
    if a.json {
        let mut doc = report::json(&w.name, &stats, &model, results, Some(wall_s));
        if let (Some(s), Some(obj)) = (summary, doc.as_object_mut()) {
            obj.insert("seeds".into(), s);
        }
        println!("{doc}");
    } else {
        println!(
            "{}: {} sessions, {} trainings, floor {:.1} GPU-hours",
            w.name, stats.sessions, stats.trainings, stats.floor_gpu_hours
        );
        match &summary {
            Some(s) => {
                println!(
                    "seeds {}..={}: mean ± half-width of the 95% interval (Student's t over {} runs)",
                    seeds[0],
                    seeds[seeds.len() - 1],
                    seeds.len()
                );
                print!("{}", spread::seeds_table(s, &kinds.iter().map(|k| k.name()).collect::<Vec<_>>()));
            }
            None => print!("{}", report::table(results)),
        }
        println!("wall time {wall_s:.3} s");
    }
    check_invariants(&runs, |i| format!(" (seed {})", seeds[i]))
}
