//! `nbos sim`'s flags and what they set up: the workloads (per seed and window), the
//! model (`--config` and the overrides), the simulations run on every core, the checks
//! and the files written.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{bail, Context as _};

use nbos_sched::policy::{AutoscaleRule, PolicyConfig};
use nbos_sched::sim::costs::Costs;
use nbos_sched::sim::sessions::{self, SessionParams};
use nbos_sched::sim::synthetic::{self, SyntheticParams};
use nbos_sched::sim::users;
use nbos_sched::sim::workload::{self, Job, Stats, Workload};
use nbos_sched::sim::{report, Model, PolicyKind, PolicyResult};
use nbos_sched::template::Template;

use crate::flags;

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
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = flags::count)]
    pub seed: u64,
    /// A `notebookosd` configuration (TOML, read by the daemon's own loader): `notebookos`
    /// simulates its policy (`[gpu]`, `[kernel]` pre-warm, `[cluster]` replicas,
    /// `[autoscale]`). Default: the shipped defaults (packaging/notebookosd.toml).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Run N seeds (--seed, --seed + 1, …) and report each figure's mean and 95% interval
    /// (Student's t over the N runs); `--json` adds a `seeds` object beside `policies`
    /// (which holds the first seed's results).
    #[arg(long, default_value_t = 1, value_name = "N", allow_negative_numbers = true, value_parser = flags::positive_count32)]
    pub seeds: u32,

    /// Trace window: first minute (the trace's own time).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = flags::count)]
    pub start_min: u64,
    /// Trace window: length in hours (default: the whole trace). The simulation stops at
    /// the window's end: trainings still running are cut there, hosts stop being billed.
    #[arg(long, allow_negative_numbers = true, value_parser = flags::above_zero)]
    pub hours: Option<f64>,
    /// Trace window: start at the busiest --hours window, the one whose submitted trainings
    /// hold the most GPU-minutes inside it (instead of --start-min).
    #[arg(long, requires = "hours", conflicts_with_all = ["start_min", "each_window"])]
    pub busiest: bool,
    /// Run every --hours window of the trace from --start-min on, one after another, and
    /// report each and the spread (min, median, max) of GPU-hours saved against
    /// reservation and of notebookos' delay p95 and p99.
    #[arg(long, requires = "hours", conflicts_with = "seeds")]
    pub each_window: bool,
    /// Sweep notebookos' parameters (subscription ratio, autoscale rule, spare hosts, peak
    /// window, buffer) around the config's, every other policy once, over --seeds; write
    /// the cost–delay plots, sweep.json and sweep.md here, naming the point that meets
    /// the targets (docs/simulator.md, "Defaults from evidence").
    #[arg(long, value_name = "DIR", conflicts_with_all = ["each_window", "out"])]
    pub sweep: Option<PathBuf>,

    /// Session generator: mean trainings per session.
    #[arg(long, default_value_t = SessionParams::default().mean_trainings, allow_negative_numbers = true, value_parser = flags::at_least_zero)]
    pub session_trainings: f64,
    /// Session generator: mean idle minutes between trainings of a session.
    #[arg(long, default_value_t = SessionParams::default().mean_gap_min, allow_negative_numbers = true, value_parser = flags::at_least_zero)]
    pub session_gap_min: f64,
    /// Session generator: a session idle longer than this (minutes) is over.
    #[arg(long, default_value_t = SessionParams::default().max_gap_min, allow_negative_numbers = true, value_parser = flags::at_least_zero)]
    pub session_max_gap_min: f64,
    /// Session generator: mean minutes from session start to its first training.
    #[arg(long, default_value_t = SessionParams::default().mean_lead_min, allow_negative_numbers = true, value_parser = flags::at_least_zero)]
    pub session_lead_min: f64,
    /// Session generator: minutes from the last training's end to the session's stop.
    #[arg(long, default_value_t = SessionParams::default().tail_min, allow_negative_numbers = true, value_parser = flags::at_least_zero)]
    pub session_tail_min: f64,

    /// Synthetic workload: sessions.
    #[arg(long, default_value_t = SyntheticParams::default().sessions, allow_negative_numbers = true, value_parser = flags::positive_count32)]
    pub sessions: u32,
    /// Synthetic workload: hours over which sessions arrive.
    #[arg(long, default_value_t = SyntheticParams::default().hours, allow_negative_numbers = true, value_parser = flags::above_zero)]
    pub synthetic_hours: f64,

    /// Cluster: GPUs per host.
    #[arg(long, default_value_t = Model::default().gpus_per_host, allow_negative_numbers = true, value_parser = flags::positive_count32)]
    pub gpus_per_host: u32,
    /// Cluster: seconds to provision a host (± 2 s).
    #[arg(long, default_value_t = 15, allow_negative_numbers = true, value_parser = flags::count)]
    pub provision_s: u64,
    /// Cluster: the measured costs of replica starts and state transfers, and the cap on
    /// concurrent moves per host (default: the committed docs/sim/costs.json, compiled in).
    #[arg(long, value_name = "FILE")]
    pub costs: Option<PathBuf>,
    /// Multiplies every session's namespace size (an assumption: docs/simulator.md).
    #[arg(long, default_value_t = 1.0, value_name = "F", allow_negative_numbers = true, value_parser = flags::above_zero)]
    pub namespace_scale: f64,
    /// Cluster: hosts up from the start and never released below, for every policy alike;
    /// overrides the config's autoscale.min_hosts.
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = flags::count32)]
    pub min_hosts: Option<u32>,
    /// notebookos: subscription ratio (subscribed replica GPUs per host GPU); overrides
    /// the config's gpu.subscription_ratio.
    #[arg(long, allow_negative_numbers = true, value_parser = flags::at_least_one)]
    pub subscription_ratio: Option<f64>,
    /// notebookos: seconds idle-held GPUs stay bound after a cell; overrides the config's
    /// gpu.idle_release.
    #[arg(long, allow_negative_numbers = true, value_parser = flags::count)]
    pub idle_release_s: Option<u64>,
    /// notebookos: the autoscale rule, `notebookos` or `paper`; overrides the config's
    /// autoscale.rule.
    #[arg(long, value_name = "RULE")]
    pub autoscale_rule: Option<String>,
    /// notebookos: whole hosts kept above the recent demand peak (`notebookos` rule);
    /// overrides the config's autoscale.spare_hosts.
    #[arg(long, allow_negative_numbers = true, value_parser = flags::count32)]
    pub spare_hosts: Option<u32>,
    /// notebookos: minutes of demand history the autoscaler covers (`notebookos` rule);
    /// overrides the config's autoscale.peak_window.
    #[arg(long, allow_negative_numbers = true, value_parser = flags::positive_count)]
    pub peak_window_min: Option<u64>,
    /// Cluster: half-width of the uniform jitter on --provision-s, seconds.
    #[arg(long, default_value_t = 2, allow_negative_numbers = true, value_parser = flags::count)]
    pub provision_jitter_s: u64,
    /// Replicated policies: milliseconds of an executor election.
    #[arg(long, default_value_t = Model::default().election_ms, allow_negative_numbers = true, value_parser = flags::count)]
    pub election_ms: u64,
    /// notebookos-paper: the cap on its moving subscription ratio.
    #[arg(long, default_value_t = Model::default().paper_max_ratio, allow_negative_numbers = true, value_parser = flags::at_least_one)]
    pub paper_max_ratio: f64,
    /// middle-ground and notebookos-paper: pre-warmed containers per host.
    #[arg(long, default_value_t = Model::default().prewarm_per_host, allow_negative_numbers = true, value_parser = flags::count32)]
    pub prewarm_per_host: u32,
    /// Autoscaling policies: seconds between autoscaler runs (default 30; notebookos: the
    /// config's autoscale.interval, which this overrides).
    #[arg(long, allow_negative_numbers = true, value_parser = flags::positive_count)]
    pub scaling_interval_s: Option<u64>,
    /// A fixed cluster of N hosts, all up from the start, no autoscaling (0: autoscaled).
    /// With `--policy notebookos` this models a `notebookosd` cluster as it runs today
    /// (see "Replay against a real cluster" in docs/simulator.md).
    #[arg(long, default_value_t = 0, value_name = "N", allow_negative_numbers = true, value_parser = flags::count32)]
    pub fixed_hosts: u32,
    /// Cluster: host memory for replicas per host, MiB (0: not modelled). Default: the
    /// config's cluster.kernel_memory_mib when set, else 1 TiB (an 8-GPU host with 1,152
    /// GiB of RAM less the system's share).
    #[arg(long, value_name = "MIB", allow_negative_numbers = true, value_parser = flags::count)]
    pub host_memory_mib: Option<u64>,
    /// Users: assign sessions to N users, Zipf-distributed (user k owns a share ∝ 1 ÷ (k + 1)),
    /// seeded, and report per-user delays and Jain's index (docs/simulator.md, "Users and
    /// fair share"). 0: no users (one user owns everything).
    #[arg(long, default_value_t = 0, value_name = "N", allow_negative_numbers = true, value_parser = flags::count32)]
    pub users: u32,
    /// Users: user 0 also floods the cluster: kernels of --flood-gpus GPUs, each submitting
    /// a --flood-cell-s cell as soon as its previous one ends, from the workload's start to
    /// its end, asking twice the GPUs of the largest cluster (autoscale.max_hosts, or
    /// --fixed-hosts, × --gpus-per-host). Needs --users.
    #[arg(long, requires = "users")]
    pub flood_user: bool,
    /// The flood: GPUs per kernel and per cell.
    #[arg(long, default_value_t = 4, allow_negative_numbers = true, value_parser = flags::positive_count32)]
    pub flood_gpus: u32,
    /// The flood: seconds each of its cells runs.
    #[arg(long, default_value_t = 600, allow_negative_numbers = true, value_parser = flags::positive_count)]
    pub flood_cell_s: u64,
    /// notebookos: waiting cells in fair-share order (`on`, as the daemon's `gpu.fair_share`
    /// default) or first come first served (`off`); overrides the config's gpu.fair_share.
    #[arg(long, value_name = "on|off", value_parser = ["on", "off"])]
    pub fair_share: Option<String>,
    /// notebookos with fair share: a user over their share leaves free the GPUs an idle
    /// kernel of a user within theirs asks (`on`) or not (`off`, the daemon's default);
    /// overrides the config's gpu.fair_share_headroom.
    #[arg(long, value_name = "on|off", value_parser = ["on", "off"])]
    pub fair_share_headroom: Option<String>,
    /// Memory of an idle replica before its namespace, MiB (an ipykernel with the user's imports).
    #[arg(long, default_value_t = Model::default().replica_base_mib, value_name = "MIB", allow_negative_numbers = true, value_parser = flags::count)]
    pub replica_base_mib: u64,
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

/// A NotebookOS session template (`traces/templates/*.json`) as a workload.
pub fn load_template(p: &Path) -> anyhow::Result<Workload> {
    let t = Template::parse(&read(p)?).with_context(|| format!("{} is not a NotebookOS template", p.display()))?;
    Ok(Workload::from_template(format!("{}", p.display()), &t))
}

/// What `nbos sim` replays, read once (each seed and window generates its sessions from it).
pub(crate) enum Source {
    /// A Tiresias CSV: its path and jobs, sorted by submission.
    Trace(String, Vec<Job>),
    /// A template, replayed as is (the same for every seed).
    Template(Workload),
    /// The synthetic generator.
    Synthetic(SyntheticParams),
}

pub(crate) fn source(a: &Args) -> anyhow::Result<Source> {
    if let Some(p) = &a.trace {
        let jobs = workload::parse_csv(&read(p)?, a.gpus_per_host).with_context(|| format!("{}", p.display()))?;
        return Ok(Source::Trace(format!("{}", p.display()), jobs));
    }
    if let Some(p) = &a.template {
        return Ok(Source::Template(load_template(p)?));
    }
    if a.synthetic {
        let p = SyntheticParams { sessions: a.sessions, hours: a.synthetic_hours, ..SyntheticParams::default() };
        return Ok(Source::Synthetic(p));
    }
    bail!("say what to replay: --trace CSV (e.g. traces/sensei_june_60sec.csv), --template JSON, or --synthetic")
}

/// The `--hours` window in whole minutes (what selects jobs) and milliseconds (its end).
pub(crate) fn window_len(a: &Args) -> Option<(u64, u64)> {
    a.hours.map(|h| {
        let ms = nbos_sched::sim::rng::minutes_ms(h * 60.0);
        (ms / 60_000, ms)
    })
}

/// The workload of `src` for `seed`; a trace's from `start_min` (for `--hours`, ending
/// there); namespaces scaled by `--namespace-scale`.
pub(crate) fn workload_of(a: &Args, src: &Source, start_min: u64, seed: u64) -> anyhow::Result<Workload> {
    let mut w = generated(a, src, start_min, seed)?;
    if a.namespace_scale != 1.0 {
        w.scale_namespaces(a.namespace_scale);
    }
    if a.users > 0 {
        users::assign(&mut w, a.users, seed);
    }
    if a.flood_user {
        if a.flood_gpus > a.gpus_per_host {
            bail!("--flood-gpus {} is more than a host's {} GPUs", a.flood_gpus, a.gpus_per_host);
        }
        let hosts = if a.fixed_hosts > 0 { a.fixed_hosts } else { model(a)?.notebookos.autoscale.max_hosts };
        let flood =
            users::Flood::saturating(0, a.flood_gpus, a.flood_cell_s.saturating_mul(1000), hosts, a.gpus_per_host, 2);
        users::add_flood(&mut w, &flood);
    }
    Ok(w)
}

fn generated(a: &Args, src: &Source, start_min: u64, seed: u64) -> anyhow::Result<Workload> {
    match src {
        Source::Trace(path, jobs) => {
            let (jobs, name, end) = match window_len(a) {
                Some((len_min, end_ms)) => (
                    workload::window(jobs, start_min, len_min),
                    format!("{path} (minutes {start_min}..+{} h)", a.hours.unwrap_or_default()),
                    Some(end_ms),
                ),
                None => (workload::window(jobs, start_min, u64::MAX), format!("{path} (whole trace)"), None),
            };
            if jobs.is_empty() {
                bail!("no job of {path} is submitted in the window starting at minute {start_min}");
            }
            let params = SessionParams {
                mean_trainings: a.session_trainings,
                mean_gap_min: a.session_gap_min,
                max_gap_min: a.session_max_gap_min,
                mean_lead_min: a.session_lead_min,
                tail_min: a.session_tail_min,
            };
            let w = sessions::generate(name, &jobs, &params, seed);
            Ok(match end {
                Some(e) => w.ending_at(e),
                None => w,
            })
        }
        Source::Template(w) => Ok(w.clone()),
        Source::Synthetic(p) => Ok(synthetic::generate(p, seed)),
    }
}

/// `f` over `items` on every core (`std::thread::scope`), results in `items`' order.
pub(crate) fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let workers =
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get).clamp(1, items.len().max(1));
    let next = AtomicUsize::new(0);
    let mut done: Vec<(usize, R)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break mine };
                        mine.push((i, f(item)));
                    }
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).collect()
    });
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}

/// Runs every policy of `kinds` on every workload (in parallel); per workload, its results
/// in `kinds`' order. Boot jitter is drawn from the workload's seed.
pub(crate) fn simulate<'k>(
    workloads: &[(u64, Workload)],
    kinds: &'k [PolicyKind],
    model: &Model,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<Vec<Vec<(&'k str, PolicyResult)>>> {
    let jobs: Vec<(usize, PolicyKind)> =
        (0..workloads.len()).flat_map(|i| kinds.iter().map(move |&k| (i, k))).collect();
    let mut runs = par_map(&jobs, |&(i, k)| {
        let (seed, w) = &workloads[i];
        let r = nbos_sched::sim::run(w, k, &Model { seed: *seed, ..model.clone() });
        bar.inc(1);
        r.with_context(|| format!("simulating {} (seed {seed}, {})", k.name(), w.name))
    })
    .into_iter();
    let mut out = Vec::with_capacity(workloads.len());
    for _ in workloads {
        let mut results = Vec::with_capacity(kinds.len());
        for k in kinds {
            let r = runs.next().context("a simulation did not report")??;
            results.push((k.name(), r));
        }
        out.push(results);
    }
    Ok(out)
}

/// Fails naming every broken invariant of `runs` (labelled by `label(i)`).
pub(crate) fn check_invariants(
    runs: &[Vec<(&str, PolicyResult)>],
    label: impl Fn(usize) -> String,
) -> anyhow::Result<()> {
    let broken: Vec<String> =
        runs.iter()
            .enumerate()
            .flat_map(|(i, results)| {
                let label = &label;
                results.iter().filter(|(_, r)| r.violations > 0).map(move |(n, r)| {
                    format!("{n}{}: {} ({})", label(i), r.violations, r.violation_samples.join("; "))
                })
            })
            .collect();
    if !broken.is_empty() {
        bail!("invariants broken: {}", broken.join(" | "));
    }
    Ok(())
}

pub(crate) fn policies(spec: &str) -> anyhow::Result<Vec<PolicyKind>> {
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

/// `notebookos`'s policy: the `--config` file's (the daemon's strict loader), else the
/// shipped defaults, with the per-parameter flags on top.
fn policy(a: &Args, config: Option<&notebookosd::config::Config>) -> anyhow::Result<PolicyConfig> {
    let mut p = config.map_or_else(PolicyConfig::default, notebookosd::config::Config::policy);
    if let Some(r) = a.subscription_ratio {
        p.subscription_ratio = r;
    }
    if let Some(s) = a.idle_release_s {
        p.idle_release_ms = s.saturating_mul(1000);
    }
    if let Some(rule) = &a.autoscale_rule {
        p.autoscale.rule = match rule.as_str() {
            "notebookos" => AutoscaleRule::Notebookos,
            "paper" => AutoscaleRule::Paper,
            other => bail!("--autoscale-rule must be notebookos or paper, got {other:?}"),
        };
    }
    if let Some(n) = a.spare_hosts {
        p.autoscale.spare_hosts = n;
    }
    if let Some(m) = a.peak_window_min {
        p.autoscale.peak_window_ms = m.saturating_mul(60_000);
    }
    if let Some(n) = a.min_hosts {
        p.autoscale.min_hosts = n;
    }
    if let Some(s) = a.scaling_interval_s {
        p.autoscale.interval_ms = s.saturating_mul(1000);
    }
    if let Some(f) = &a.fair_share {
        p.fair_share = f == "on";
    }
    if let Some(f) = &a.fair_share_headroom {
        p.fair_share_headroom = f == "on";
    }
    Ok(p)
}

/// The cluster model the flags (and `--config`) describe.
pub fn model(a: &Args) -> anyhow::Result<Model> {
    let config = a.config.as_deref().map(notebookosd::config::Config::load).transpose()?;
    let config_memory = config.as_ref().map(|c| c.cluster.kernel_memory_mib).filter(|&m| m > 0);
    Ok(Model {
        gpus_per_host: a.gpus_per_host,
        provision_ms: a.provision_s.saturating_mul(1000),
        costs: match &a.costs {
            Some(p) => Costs::parse(&read(p)?).with_context(|| format!("{}", p.display()))?,
            None => Costs::measured(),
        },
        provision_jitter_ms: a.provision_jitter_s.saturating_mul(1000),
        election_ms: a.election_ms,
        paper_max_ratio: a.paper_max_ratio,
        prewarm_per_host: a.prewarm_per_host,
        scaling_interval_ms: a
            .scaling_interval_s
            .map_or(Model::default().scaling_interval_ms, |s| s.saturating_mul(1000)),
        notebookos: policy(a, config.as_ref())?,
        fixed_hosts: a.fixed_hosts,
        host_memory_mib: a.host_memory_mib.or(config_memory).unwrap_or(Model::default().host_memory_mib),
        replica_base_mib: a.replica_base_mib,
        seed: a.seed,
    })
}

/// The window's first minute: `--start-min`, or the busiest `--hours` window's.
pub(crate) fn start_min(a: &Args, src: &Source) -> anyhow::Result<u64> {
    Ok(match (src, a.busiest, window_len(a)) {
        (Source::Trace(path, jobs), true, Some((len_min, _))) => workload::busiest_window(jobs, len_min)
            .map(|(start, _)| start)
            .with_context(|| format!("{path} has no jobs"))?,
        (_, true, _) => bail!("--busiest needs --trace and --hours"),
        _ => a.start_min,
    })
}

/// The workload `a` names, for its first seed (`nbos replay --trace` replays it).
pub fn load(a: &Args) -> anyhow::Result<Workload> {
    let src = source(a)?;
    workload_of(a, &src, start_min(a, &src)?, a.seed)
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn model_of(argv: &[&str]) -> anyhow::Result<Model> {
        model(&Cli::try_parse_from(std::iter::once("sim").chain(argv.iter().copied()))?.args)
    }

    const SHIPPED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../packaging/notebookosd.toml");

    #[test]
    fn the_shipped_config_is_the_model_without_config() {
        let shipped = model_of(&["--config", SHIPPED]).expect("the shipped config loads");
        assert_eq!(shipped, model_of(&[]).expect("defaults"));
        assert_eq!(shipped.notebookos, PolicyConfig::default());
    }

    #[test]
    fn flags_override_the_config_and_unknown_keys_are_the_daemons_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("notebookosd.toml");
        std::fs::write(&file, "[gpu]\nsubscription_ratio = 6.0\n[autoscale]\nrule = \"notebookos\"\n").expect("write");
        let path = file.to_str().expect("utf-8 path");
        let m = model_of(&["--config", path]).expect("valid");
        assert_eq!((m.notebookos.subscription_ratio, m.notebookos.autoscale.rule), (6.0, AutoscaleRule::Notebookos));
        let m = model_of(&["--config", path, "--subscription-ratio", "4", "--autoscale-rule", "paper"]).expect("valid");
        assert_eq!((m.notebookos.subscription_ratio, m.notebookos.autoscale.rule), (4.0, AutoscaleRule::Paper));
        std::fs::write(&file, "[gpu]\nsubscription_ratoi = 6.0\n").expect("write");
        let err = format!("{:#}", model_of(&["--config", path]).expect_err("unknown key"));
        let daemon = notebookosd::config::Config::load(&file).expect_err("the daemon refuses it too").to_string();
        assert!(err.contains("gpu.subscription_ratoi") && err.contains(&daemon), "{err}");
    }
}
