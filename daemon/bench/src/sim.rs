//! `nbos sim`: replays a workload under the scheduling policies in virtual time
//! (`nbos_sched::sim`, driving the daemon's scheduler core) and prints a table or
//! `--json`; `--out DIR` also writes SVG plots and a markdown report. See
//! `docs/simulator.md`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context as _};

use nbos_sched::sim::costs::Costs;
use nbos_sched::sim::sessions::{self, SessionParams};
use nbos_sched::sim::synthetic::{self, SyntheticParams};
use nbos_sched::sim::workload::{self, Stats, Workload};
use nbos_sched::sim::{report, Model, PolicyKind, PolicyResult};
use nbos_sched::template::Template;

/// Options of `nbos sim`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A Tiresias-format CSV trace (e.g. traces/sensei_june_60sec.csv); sessions are generated.
    #[arg(long, value_name = "CSV", conflicts_with_all = ["template", "synthetic"])]
    pub trace: Option<PathBuf>,
    /// A NotebookOS session template (traces/templates/*.json), replayed as is.
    #[arg(long, value_name = "JSON", conflicts_with = "synthetic")]
    pub template: Option<PathBuf>,
    /// A synthetic workload (see --sessions, --synthetic-hours).
    #[arg(long)]
    pub synthetic: bool,
    /// Policies: `all` or a comma-separated list of reservation, fcfs-batch,
    /// middle-ground, notebookos-paper, notebookos.
    #[arg(long, default_value = "all")]
    pub policy: String,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Write plots (SVG), report.md and results.json here.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Seed of everything random (session generator, synthetic workload, boot times).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,

    /// Trace window: first minute (the trace's own time).
    #[arg(long, default_value_t = 0)]
    pub start_min: u64,
    /// Trace window: length in hours (default: the whole trace).
    #[arg(long)]
    pub hours: Option<f64>,

    /// Session generator: mean trainings per session.
    #[arg(long, default_value_t = SessionParams::default().mean_trainings)]
    pub session_trainings: f64,
    /// Session generator: mean idle minutes between trainings of a session.
    #[arg(long, default_value_t = SessionParams::default().mean_gap_min)]
    pub session_gap_min: f64,
    /// Session generator: a session idle longer than this (minutes) is over.
    #[arg(long, default_value_t = SessionParams::default().max_gap_min)]
    pub session_max_gap_min: f64,
    /// Session generator: mean minutes from session start to its first training.
    #[arg(long, default_value_t = SessionParams::default().mean_lead_min)]
    pub session_lead_min: f64,
    /// Session generator: minutes from the last training's end to the session's stop.
    #[arg(long, default_value_t = SessionParams::default().tail_min)]
    pub session_tail_min: f64,

    /// Synthetic workload: sessions.
    #[arg(long, default_value_t = SyntheticParams::default().sessions)]
    pub sessions: u32,
    /// Synthetic workload: hours over which sessions arrive.
    #[arg(long, default_value_t = SyntheticParams::default().hours)]
    pub synthetic_hours: f64,

    /// Cluster: GPUs per host.
    #[arg(long, default_value_t = Model::default().gpus_per_host)]
    pub gpus_per_host: u32,
    /// Cluster: seconds to provision a host (± 2 s).
    #[arg(long, default_value_t = 15)]
    pub provision_s: u64,
    /// Cluster: the measured costs of replica starts and state transfers, and the cap on
    /// concurrent moves per host (default: the committed docs/sim/costs.json, compiled in).
    #[arg(long, value_name = "FILE")]
    pub costs: Option<PathBuf>,
    /// Multiplies every session's namespace size (an assumption: docs/simulator.md).
    #[arg(long, default_value_t = 1.0, value_name = "F")]
    pub namespace_scale: f64,
    /// Cluster: hosts up from the start and never released below, for every policy alike.
    #[arg(long, default_value_t = Model::default().min_hosts, value_name = "N")]
    pub min_hosts: u32,
    /// notebookos: subscription ratio (subscribed replica GPUs per host GPU).
    #[arg(long, default_value_t = Model::default().subscription_ratio)]
    pub subscription_ratio: f64,
    /// notebookos: seconds idle-held GPUs stay bound after a cell (the daemon's gpu.idle_release).
    #[arg(long, default_value_t = 30)]
    pub idle_release_s: u64,
    /// notebookos: whole hosts kept above the recent demand peak.
    #[arg(long, default_value_t = Model::default().spare_hosts)]
    pub spare_hosts: u32,
    /// notebookos: minutes of demand history the autoscaler covers.
    #[arg(long, default_value_t = 5)]
    pub peak_window_min: u64,
    /// Cluster: half-width of the uniform jitter on --provision-s, seconds.
    #[arg(long, default_value_t = 2)]
    pub provision_jitter_s: u64,
    /// Replicated policies: milliseconds of an executor election.
    #[arg(long, default_value_t = Model::default().election_ms)]
    pub election_ms: u64,
    /// notebookos-paper: the cap on its moving subscription ratio.
    #[arg(long, default_value_t = Model::default().paper_max_ratio)]
    pub paper_max_ratio: f64,
    /// middle-ground and notebookos-paper: pre-warmed containers per host.
    #[arg(long, default_value_t = Model::default().prewarm_per_host)]
    pub prewarm_per_host: u32,
    /// Autoscaling policies: seconds between autoscaler runs.
    #[arg(long, default_value_t = 30)]
    pub scaling_interval_s: u64,
    /// A fixed cluster of N hosts, all up from the start, no autoscaling (0: autoscaled).
    /// With `--policy notebookos` this models a `notebookosd` cluster as it runs today
    /// (see "Replay against a real cluster" in docs/simulator.md).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub fixed_hosts: u32,
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

/// A NotebookOS session template (`traces/templates/*.json`) as a workload.
pub fn load_template(p: &Path) -> anyhow::Result<Workload> {
    let t = Template::parse(&read(p)?).with_context(|| format!("{} is not a NotebookOS template", p.display()))?;
    Ok(Workload::from_template(format!("{}", p.display()), &t))
}

fn load(a: &Args) -> anyhow::Result<Workload> {
    if let Some(p) = &a.trace {
        let jobs = workload::parse_csv(&read(p)?).with_context(|| format!("{}", p.display()))?;
        let (jobs, name) = match a.hours {
            Some(h) => {
                if !(h.is_finite() && h > 0.0) {
                    bail!("--hours must be a positive number of hours, got {h}");
                }
                let len = nbos_sched::sim::rng::minutes_ms(h * 60.0) / 60_000;
                (
                    workload::window(&jobs, a.start_min, len),
                    format!("{} (minutes {}..+{h} h)", p.display(), a.start_min),
                )
            }
            None => (workload::window(&jobs, a.start_min, u64::MAX), format!("{} (whole trace)", p.display())),
        };
        if jobs.is_empty() {
            bail!("no job of {} is submitted in the window starting at minute {}", p.display(), a.start_min);
        }
        let params = SessionParams {
            mean_trainings: a.session_trainings,
            mean_gap_min: a.session_gap_min,
            max_gap_min: a.session_max_gap_min,
            mean_lead_min: a.session_lead_min,
            tail_min: a.session_tail_min,
        };
        for (v, flag) in [
            (params.mean_trainings, "--session-trainings"),
            (params.mean_gap_min, "--session-gap-min"),
            (params.max_gap_min, "--session-max-gap-min"),
            (params.mean_lead_min, "--session-lead-min"),
            (params.tail_min, "--session-tail-min"),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                bail!("{flag} must be a number >= 0, got {v}");
            }
        }
        return Ok(sessions::generate(name, &jobs, &params, a.seed));
    }
    if let Some(p) = &a.template {
        return load_template(p);
    }
    if a.synthetic {
        if !(a.synthetic_hours.is_finite() && a.synthetic_hours > 0.0) || a.sessions == 0 {
            bail!("--sessions and --synthetic-hours must be positive");
        }
        let p = SyntheticParams { sessions: a.sessions, hours: a.synthetic_hours, ..SyntheticParams::default() };
        return Ok(synthetic::generate(&p, a.seed));
    }
    bail!("say what to replay: --trace CSV (e.g. traces/sensei_june_60sec.csv), --template JSON, or --synthetic")
}

fn policies(spec: &str) -> anyhow::Result<Vec<PolicyKind>> {
    if spec == "all" {
        return Ok(PolicyKind::ALL.to_vec());
    }
    let mut out = Vec::new();
    for name in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some(p) = PolicyKind::parse(name) else {
            let known: Vec<&str> = PolicyKind::ALL.iter().map(|p| p.name()).collect();
            bail!("unknown policy {name:?}; known: all, {}", known.join(", "));
        };
        if !out.contains(&p) {
            out.push(p);
        }
    }
    if out.is_empty() {
        bail!("--policy names no policy");
    }
    Ok(out)
}

/// Writes `--out DIR`: the plots (SVG), `report.md` and `results.json` (the `--json`
/// document without `wall_s`, plus `extra` keys such as `nbos replay`'s own figures).
pub fn write_out(
    dir: &Path,
    workload: &str,
    stats: &Stats,
    model: &Model,
    results: &[(&str, PolicyResult)],
    extra: Option<(&str, serde_json::Value)>,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for (name, svg) in report::plots(results) {
        let p = dir.join(name);
        std::fs::write(&p, svg).with_context(|| format!("cannot write {}", p.display()))?;
    }
    let md = report::markdown(workload, stats, model, results);
    let mut doc = report::json(workload, stats, model, results, None);
    if let (Some((key, value)), Some(obj)) = (extra, doc.as_object_mut()) {
        obj.insert(key.to_owned(), value);
    }
    for (name, text) in [("report.md", md), ("results.json", format!("{doc:#}\n"))] {
        let p = dir.join(name);
        std::fs::write(&p, text).with_context(|| format!("cannot write {}", p.display()))?;
    }
    Ok(())
}

/// Runs the subcommand.
pub fn run(a: Args) -> anyhow::Result<()> {
    let kinds = policies(&a.policy)?;
    let costs = match &a.costs {
        Some(p) => Costs::parse(&read(p)?).with_context(|| format!("{}", p.display()))?,
        None => Costs::measured(),
    };
    if !(a.namespace_scale.is_finite() && a.namespace_scale > 0.0) {
        bail!("--namespace-scale must be a positive number, got {}", a.namespace_scale);
    }
    let model = Model {
        gpus_per_host: a.gpus_per_host,
        provision_ms: a.provision_s * 1000,
        costs,
        min_hosts: a.min_hosts,
        idle_release_ms: a.idle_release_s * 1000,
        subscription_ratio: a.subscription_ratio,
        spare_hosts: a.spare_hosts,
        peak_window_ms: a.peak_window_min * 60_000,
        provision_jitter_ms: a.provision_jitter_s * 1000,
        election_ms: a.election_ms,
        paper_max_ratio: a.paper_max_ratio,
        prewarm_per_host: a.prewarm_per_host,
        scaling_interval_ms: a.scaling_interval_s * 1000,
        fixed_hosts: a.fixed_hosts,
        seed: a.seed,
    };
    let started = Instant::now();
    let mut w = load(&a)?;
    if a.namespace_scale != 1.0 {
        w.scale_namespaces(a.namespace_scale);
    }
    let stats = w.stats();
    let mut results: Vec<(&str, PolicyResult)> = Vec::new();
    let bar = crate::progress::bar(a.json, kinds.len(), "policies simulated:");
    for k in kinds {
        bar.set_message(k.name());
        let r = nbos_sched::sim::run(&w, k, &model).with_context(|| format!("simulating {}", k.name()))?;
        results.push((k.name(), r));
        bar.inc(1);
    }
    bar.finish_and_clear();
    let wall_s = (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
    if let Some(dir) = &a.out {
        write_out(dir, &w.name, &stats, &model, &results, None)?;
    }
    if a.json {
        println!("{}", report::json(&w.name, &stats, &model, &results, Some(wall_s)));
    } else {
        println!(
            "{}: {} sessions, {} trainings, floor {:.1} GPU-hours",
            w.name, stats.sessions, stats.trainings, stats.floor_gpu_hours
        );
        print!("{}", report::table(&results));
        println!("wall time {wall_s:.3} s");
    }
    let broken: Vec<String> = results
        .iter()
        .filter(|(_, r)| r.violations > 0)
        .map(|(n, r)| format!("{n}: {} ({})", r.violations, r.violation_samples.join("; ")))
        .collect();
    if !broken.is_empty() {
        bail!("invariants broken: {}", broken.join(" | "));
    }
    Ok(())
}
