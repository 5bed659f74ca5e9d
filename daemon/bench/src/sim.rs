//! `nbos sim`: replays a workload under the scheduling policies in virtual time
//! (`nbos_sched::sim`, driving the daemon's scheduler core) and prints a table or
//! `--json`; `--out DIR` also writes SVG plots and a markdown report. See
//! `docs/simulator.md`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context as _};

use nbos_sched::policy::{AutoscaleRule, PolicyConfig};
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
    /// A `notebookosd` configuration (TOML, read by the daemon's own loader): `notebookos`
    /// simulates its policy (`[gpu]`, `[kernel]` pre-warm, `[cluster]` replicas,
    /// `[autoscale]`). Default: the shipped defaults (packaging/notebookosd.toml).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

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
    /// Cluster: hosts up from the start and never released below, for every policy alike;
    /// overrides the config's autoscale.min_hosts.
    #[arg(long, value_name = "N")]
    pub min_hosts: Option<u32>,
    /// notebookos: subscription ratio (subscribed replica GPUs per host GPU); overrides
    /// the config's gpu.subscription_ratio.
    #[arg(long)]
    pub subscription_ratio: Option<f64>,
    /// notebookos: seconds idle-held GPUs stay bound after a cell; overrides the config's
    /// gpu.idle_release.
    #[arg(long)]
    pub idle_release_s: Option<u64>,
    /// notebookos: the autoscale rule, `notebookos` or `paper`; overrides the config's
    /// autoscale.rule.
    #[arg(long, value_name = "RULE")]
    pub autoscale_rule: Option<String>,
    /// notebookos: whole hosts kept above the recent demand peak (`notebookos` rule);
    /// overrides the config's autoscale.spare_hosts.
    #[arg(long)]
    pub spare_hosts: Option<u32>,
    /// notebookos: minutes of demand history the autoscaler covers (`notebookos` rule);
    /// overrides the config's autoscale.peak_window.
    #[arg(long)]
    pub peak_window_min: Option<u64>,
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
    /// Autoscaling policies: seconds between autoscaler runs (default 30; notebookos: the
    /// config's autoscale.interval, which this overrides).
    #[arg(long)]
    pub scaling_interval_s: Option<u64>,
    /// A fixed cluster of N hosts, all up from the start, no autoscaling (0: autoscaled).
    /// With `--policy notebookos` this models a `notebookosd` cluster as it runs today
    /// (see "Replay against a real cluster" in docs/simulator.md).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub fixed_hosts: u32,
    /// Cluster: host memory for replicas per host, MiB (0: not modelled). The default is
    /// 1 TiB, an 8-GPU host with 1,152 GiB of RAM less the system's share.
    #[arg(long, default_value_t = Model::default().host_memory_mib, value_name = "MIB")]
    pub host_memory_mib: u64,
    /// Memory of an idle replica before its namespace, MiB (an ipykernel with the user's imports).
    #[arg(long, default_value_t = Model::default().replica_base_mib, value_name = "MIB")]
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

/// The workload `a` names (`nbos replay --trace` generates its sessions here too).
pub fn load(a: &Args) -> anyhow::Result<Workload> {
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

/// `notebookos`'s policy: the `--config` file's (the daemon's strict loader), else the
/// shipped defaults, with the per-parameter flags on top.
fn policy(a: &Args) -> anyhow::Result<PolicyConfig> {
    let mut p = match &a.config {
        Some(path) => notebookosd::config::Config::load(path)?.policy(),
        None => PolicyConfig::default(),
    };
    if let Some(r) = a.subscription_ratio {
        p.subscription_ratio = r;
    }
    if let Some(s) = a.idle_release_s {
        p.idle_release_ms = s * 1000;
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
        p.autoscale.peak_window_ms = m * 60_000;
    }
    if let Some(n) = a.min_hosts {
        p.autoscale.min_hosts = n;
    }
    if let Some(s) = a.scaling_interval_s {
        p.autoscale.interval_ms = s * 1000;
    }
    Ok(p)
}

/// The cluster model the flags (and `--config`) describe.
pub fn model(a: &Args) -> anyhow::Result<Model> {
    Ok(Model {
        gpus_per_host: a.gpus_per_host,
        provision_ms: a.provision_s * 1000,
        costs: match &a.costs {
            Some(p) => Costs::parse(&read(p)?).with_context(|| format!("{}", p.display()))?,
            None => Costs::measured(),
        },
        provision_jitter_ms: a.provision_jitter_s * 1000,
        election_ms: a.election_ms,
        paper_max_ratio: a.paper_max_ratio,
        prewarm_per_host: a.prewarm_per_host,
        scaling_interval_ms: a.scaling_interval_s.map_or(Model::default().scaling_interval_ms, |s| s * 1000),
        notebookos: policy(a)?,
        fixed_hosts: a.fixed_hosts,
        host_memory_mib: a.host_memory_mib,
        replica_base_mib: a.replica_base_mib,
        seed: a.seed,
    })
}

/// Runs the subcommand.
pub fn run(a: Args) -> anyhow::Result<()> {
    let kinds = policies(&a.policy)?;
    let model = model(&a)?;
    if !(a.namespace_scale.is_finite() && a.namespace_scale > 0.0) {
        bail!("--namespace-scale must be a positive number, got {}", a.namespace_scale);
    }
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
