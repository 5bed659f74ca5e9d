//! `nbos replay TEMPLATE --speedup K`: replays a session template on a real cluster, time
//! compressed K times, and reports what `nbos sim` reports, in trace time. `nbos replay
//! --trace CSV --start-min M --hours H --seed S` replays a slice of a trace, its sessions
//! generated as `nbos sim` generates them for the same flags, on a loopback cluster at the
//! daemon's defaults that autoscales through the `exec` provider ([`autoscaled`]), and
//! compares it with `nbos sim` of the same cluster and slice ([`compare`]).
//!
//! Sessions become kernels of the cluster (created at their compressed start, with the
//! session's GPUs; deleted at their compressed stop) and trainings become cells that run
//! for `duration ÷ K` holding the kernel's GPUs, all through the gateways' REST and
//! WebSocket API. Per cell, the delay is its submission → its executor wrote it to
//! ipykernel with its GPUs committed (the reply's `nbos_election.dispatched_unix_us`);
//! GPUs bound and committed are the hosts' gauges sampled from `/metrics`; hosts × GPUs ×
//! time is what is provisioned. Real durations are multiplied by K back into trace time.
//! The cluster is a loopback one of `notebookosd` daemons with simulated GPUs that the
//! command starts (the benches' [`crate::loopback`] cluster), or the one at `--url`.
//! See "Replay against a real cluster" in `docs/simulator.md`.
//!
//! - [`clock`]: trace time ↔ real time; [`cluster`]: the cluster and its hosts;
//! - [`session`]: one session as a kernel and its cells; [`sampler`]: GPU gauges over time;
//! - [`report`]: the measurements as a simulator result, and the replay's own figures.

mod autoscaled;
mod clock;
mod cluster;
mod compare;
mod report;
mod sampler;
mod session;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use self::clock::Clock;
use self::cluster::ReplayCluster;
use self::report::{AutoscaleModel, ClusterModel, Measured};
use self::sampler::Sampler;
use nbos_sched::sim::{report as sim_report, Workload};
use nbos_test_support::Options;

/// Options of `nbos replay`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A NotebookOS session template (traces/templates/*.json). For a trace, --trace.
    #[arg(value_name = "TEMPLATE", required_unless_present = "trace", conflicts_with = "trace")]
    pub workload: Option<PathBuf>,
    /// A Tiresias-format CSV trace (traces/sensei_june_60sec.csv): the slice --start-min,
    /// --hours, its sessions generated as `nbos sim --trace` generates them (--seed),
    /// replayed on a loopback cluster at the daemon's defaults that autoscales through the
    /// exec provider, and compared with `nbos sim` of the same cluster and slice.
    #[arg(long, value_name = "CSV", requires = "hours")]
    pub trace: Option<PathBuf>,
    /// Trace slice: first minute (the trace's own time).
    #[arg(long, default_value_t = 0, value_name = "M", requires = "trace")]
    pub start_min: u64,
    /// Trace slice: length in hours.
    #[arg(long, value_name = "H", requires = "trace")]
    pub hours: Option<f64>,
    /// Seed of the session generator (as `nbos sim --seed`).
    #[arg(long, default_value_t = 1, requires = "trace")]
    pub seed: u64,
    /// Time compression: the workload runs K times faster than its trace time (a
    /// 10-minute training runs 10 s at K = 60); measured times are multiplied back by K.
    #[arg(long, value_name = "K", default_value_t = 60.0)]
    pub speedup: f64,
    /// Print one JSON object (the shape of `nbos sim --json`, plus `"replay"`) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Write plots (SVG), report.md and results.json here (as `nbos sim --out`).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Loopback cluster: GPU hosts to start (ignored with --url: the cluster's own).
    #[arg(long, default_value_t = 3)]
    pub hosts: usize,
    /// Loopback cluster: simulated GPUs per host.
    #[arg(long, default_value_t = 8)]
    pub fake_gpus: u32,
    /// The cluster's `gpu.subscription_ratio` (set on a loopback cluster; with --url, say
    /// what the cluster uses, for the model in the report). Default: the daemon's.
    /// A trace replay runs the daemon's defaults: not with --trace.
    #[arg(long, conflicts_with = "trace")]
    pub subscription_ratio: Option<f64>,
    /// The cluster's `gpu.idle_release` in trace seconds: a loopback cluster's daemons get
    /// this ÷ K (30 s at K = 60: 0.5 s), so idle-held GPUs last what the simulator models.
    /// Default: the daemon's. Not with --trace (the daemon's default ÷ K).
    #[arg(long, conflicts_with = "trace")]
    pub idle_release_s: Option<u64>,
    /// Python with ipykernel for a loopback cluster's kernels.
    #[arg(long, env = "NBOS_PYTHON", default_value = "python3")]
    pub python: PathBuf,
    /// How often the hosts' GPU gauges are read, real milliseconds.
    #[arg(long, default_value_t = 50)]
    pub sample_ms: u64,
    /// Loopback cluster: keep the hosts' directories (configs, daemon logs) and print where.
    #[arg(long)]
    pub keep_logs: bool,
    /// Loopback cluster: the daemons' log filter (each host's `daemon-1.log`).
    #[arg(long, default_value = "warn")]
    pub log_level: String,
}

/// A template, with a reason for anything else.
fn load_template(p: &Path) -> anyhow::Result<Workload> {
    if p.extension().is_some_and(|e| e.eq_ignore_ascii_case("csv")) {
        bail!(
            "{}: a trace is replayed with --trace CSV --hours H (a slice of it: a whole trace's sessions \
             span days, hours of real time even at --speedup 1000)",
            p.display()
        );
    }
    crate::sim::load_template(p).context(
        "nbos replay takes a NotebookOS session template (traces/templates/*.json) or --trace CSV; synthetic \
         workloads are for nbos sim",
    )
}

/// The workload flags of `nbos sim` for the same workload: a template, or the trace slice
/// with its session generator's seed.
fn workload_args(a: &Args) -> Vec<String> {
    match (&a.trace, &a.workload) {
        (Some(csv), _) => vec![
            "--trace".to_owned(),
            csv.display().to_string(),
            "--start-min".to_owned(),
            a.start_min.to_string(),
            "--hours".to_owned(),
            a.hours.map(|h| h.to_string()).unwrap_or_default(),
            "--seed".to_owned(),
            a.seed.to_string(),
        ],
        (None, Some(t)) => vec!["--template".to_owned(), t.display().to_string()],
        (None, None) => Vec::new(),
    }
}

/// `nbos sim`'s own flags, parsed from a command line.
#[derive(clap::Parser)]
struct SimCommand {
    #[command(flatten)]
    args: crate::sim::Args,
}

/// The workload: a template as is, or a trace slice's sessions generated by `nbos sim`'s
/// own loader from the same flags (so both replay the same sessions).
fn load(a: &Args, workload: &[String]) -> anyhow::Result<Workload> {
    if let Some(t) = a.workload.as_deref().filter(|_| a.trace.is_none()) {
        return load_template(t);
    }
    let cmd =
        <SimCommand as clap::Parser>::try_parse_from(std::iter::once("sim".to_owned()).chain(workload.iter().cloned()))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    crate::sim::load(&cmd.args)
}

/// Runs the workload's sessions on `target` and collects what they measured.
fn replay(
    w: &Workload,
    target: &Arc<ReplayCluster>,
    clock: Clock,
    sample_every: Duration,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<Measured> {
    let sampler = Sampler::start(target.clone(), sample_every);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    let sessions = runtime.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for (i, s) in w.sessions.iter().enumerate() {
            let (gateway, s) = (target.gateway(i), s.clone());
            tasks.spawn(async move { (i, session::replay(gateway, i, &s, clock).await) });
        }
        let mut out = vec![None; w.sessions.len()];
        while let Some(joined) = tasks.join_next().await {
            let (i, r) = joined.context("a session's task failed")?;
            // The first failure ends the replay (the other sessions' tasks are dropped).
            out[i] = Some(r?);
            progress.inc(1);
        }
        anyhow::Ok(out.into_iter().flatten().collect::<Vec<_>>())
    });
    let sampled = sampler.stop();
    let sessions = sessions?;
    let start_unix_us = clock.unix_us_at(w.sessions.iter().map(|s| s.start).min().unwrap_or(0));
    let end_unix_us = sessions.iter().map(|s| s.stopped_unix_us).max().unwrap_or(start_unix_us);
    Ok(Measured {
        sessions,
        samples: sampled.samples,
        sample_misses: sampled.misses,
        start_unix_us,
        end_unix_us,
        counters: sampled.counters,
    })
}

/// Runs the subcommand against the cluster at `--url`, or a loopback one it starts.
pub fn run(t: &crate::client::ConnectArgs, a: Args) -> anyhow::Result<()> {
    if !(a.speedup.is_finite() && a.speedup > 0.0) {
        bail!("--speedup must be a positive number, got {}", a.speedup);
    }
    if a.trace.is_some() && t.url.is_some() {
        bail!(
            "--trace replays on a loopback cluster it configures (the daemon's defaults, the exec provider): \
             not with --url, whose configuration the comparison with nbos sim could not know"
        );
    }
    let workload = workload_args(&a);
    let w = load(&a, &workload)?;
    let name = a.trace.as_ref().or(a.workload.as_ref()).map(|p| p.display().to_string()).unwrap_or_default();
    anyhow::ensure!(!w.sessions.is_empty(), "{name}: the workload has no sessions");
    let defaults = notebookosd::config::Config::default();
    let compressed = autoscaled::Compressed::of(&defaults, a.speedup);
    let subscription_ratio = a.subscription_ratio.unwrap_or(defaults.gpu.subscription_ratio);
    let idle_release_s = a.idle_release_s.unwrap_or(defaults.gpu.idle_release.as_secs());
    let idle_release = Clock::start(0, a.speedup).real(idle_release_s * 1000);
    anyhow::ensure!(
        idle_release >= Duration::from_millis(1),
        "gpu.idle_release {idle_release_s} s at --speedup {} is under a millisecond of real time",
        a.speedup
    );
    let started = Instant::now();
    let mut autoscaled_config = None;
    let target = if t.url.is_some() {
        ReplayCluster::remote(t)?
    } else {
        let options = Options {
            fake_gpus: a.fake_gpus,
            idle_release: Some(idle_release),
            subscription_ratio: Some(subscription_ratio),
            ..crate::loopback::options(&a.python, &a.log_level, a.keep_logs)?
        };
        if a.trace.is_some() {
            let c = autoscaled::start(u64::try_from(a.hosts)?, options, compressed, &a.python)?;
            autoscaled_config = Some((c.config_toml.clone(), c.provider_template.clone(), c.sim_toml.clone()));
            ReplayCluster::autoscaled(c)?
        } else {
            ReplayCluster::local(u64::try_from(a.hosts)?, options)?
        }
    };
    let target = Arc::new(target);
    let gpus_per_host = target.hosts.iter().map(|h| h.gpus).max().unwrap_or(0);
    if let Some((i, s)) = w.sessions.iter().enumerate().find(|(_, s)| s.gpus > gpus_per_host) {
        bail!("session {i} needs {} GPUs, but the cluster's hosts have at most {gpus_per_host}", s.gpus);
    }
    #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "seconds")]
    let autoscale = a.trace.is_some().then(|| AutoscaleModel {
        spare_hosts: defaults.autoscale.spare_hosts,
        peak_window_min: defaults.autoscale.peak_window.as_secs().div_ceil(60),
        interval_s: defaults.autoscale.interval.as_secs(),
        provision_s: (autoscaled::BOOT_REAL_S * a.speedup).round() as u64,
        min_hosts: defaults.autoscale.min_hosts,
    });
    let cm = ClusterModel {
        hosts: u32::try_from(target.hosts.len()).unwrap_or(u32::MAX),
        gpus_per_host,
        subscription_ratio,
        idle_release_s,
        #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "milliseconds")]
        election_ms: (nbos_sched::sim::Model::default().election_ms as f64 * a.speedup).round() as u64,
        autoscale,
    };
    let t0 = w.sessions.iter().map(|s| s.start).min().unwrap_or(0);
    let clock = Clock::start(t0, a.speedup);
    let progress = crate::progress::bar(a.json, w.sessions.len(), "sessions replayed:");
    let measured = replay(&w, &target, clock, Duration::from_millis(a.sample_ms.max(1)), &progress)?;
    progress.finish_and_clear();
    let result = report::result(&w, &clock, &measured);
    let mut details = report::details(&w, &clock, &target.hosts, &cm, &measured);
    drop(target); // the cluster stops: the simulation below has the machine to itself
    let model = cm.model();
    let stats = w.stats();
    let results = [("replay", result)];
    let wall_s = (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
    // The simulator reads the hosts' own config (in trace time), as `nbos sim --config`;
    // the file stays (in --out, else a kept temporary directory) so the printed command works.
    let sim_config = match &autoscaled_config {
        Some((_, _, sim_toml)) => {
            let dir = match &a.out {
                Some(d) => {
                    std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
                    d.clone()
                }
                None => {
                    tempfile::Builder::new().prefix("nbos-replay-").tempdir().context("a temporary directory")?.keep()
                }
            };
            let p = dir.join("sim.toml");
            std::fs::write(&p, sim_toml).with_context(|| format!("writing {}", p.display()))?;
            let costs = dir.join("costs.json");
            std::fs::write(&costs, compare::costs_in_trace_time(a.speedup)?)
                .with_context(|| format!("writing {}", costs.display()))?;
            Some((p, costs))
        }
        None => None,
    };
    let sim_argv = compare::sim_argv(&workload, &cm, sim_config.as_ref().map(|(c, k)| (c.as_path(), k.as_path())));
    if let Some(obj) = details.as_object_mut() {
        obj.insert("sim_command".into(), serde_json::json!(sim_argv));
    }
    let mut doc = sim_report::json(&w.name, &stats, &model, &results, Some(wall_s));
    if a.trace.is_some() {
        let sim = compare::simulate(&sim_argv)?;
        let cell_gpus: u32 = w.sessions.iter().flat_map(|s| &s.trainings).map(|t| t.gpus).sum();
        #[expect(clippy::cast_precision_loss, reason = "a replay's sample period")]
        let basis = compare::Basis {
            speedup: a.speedup,
            sample_s: a.sample_ms.max(1) as f64 / 1000.0,
            cell_gpus: f64::from(cell_gpus),
            gpus_per_host: f64::from(gpus_per_host),
            hosts_peak: f64::from(measured.samples.iter().map(|s| s.hosts).max().unwrap_or(0)),
            interval_s: defaults.autoscale.interval.as_secs_f64(),
            kernel_start_max_s: measured.sessions.iter().map(|s| s.kernel_start.as_secs_f64()).fold(0.0, f64::max),
            delay_p95_after_kernel_start_s: report::delay_p95_after_kernel_start_s(&clock, &measured),
        };
        let comparison = compare::compare(&doc["policies"]["replay"], &sim, &basis);
        if let Some(obj) = details.as_object_mut() {
            obj.insert("sim".into(), sim);
            obj.insert("comparison".into(), comparison);
        }
    }
    if let (Some(dir), Some((config, template, sim_toml))) = (&a.out, &autoscaled_config) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        for (file, text) in [
            ("notebookosd.toml", config.as_str()),
            ("provider-template.toml", template.as_str()),
            ("sim.toml", sim_toml.as_str()),
        ] {
            std::fs::write(dir.join(file), text).with_context(|| format!("writing {file}"))?;
        }
        if let Some(obj) = details.as_object_mut() {
            let with_config = format!(
                "nbos sim --config {} --costs {} {}",
                dir.join("sim.toml").display(),
                dir.join("costs.json").display(),
                workload.join(" ")
            );
            obj.insert("sim_command_with_config".into(), with_config.into());
        }
    }
    if let Some(dir) = &a.out {
        crate::sim::write_out(dir, &w.name, &stats, &model, &results, Some(("replay", details.clone())))?;
    }
    if a.json {
        if let Some(obj) = doc.as_object_mut() {
            obj.insert("replay".into(), details);
        }
        println!("{doc}");
    } else {
        println!(
            "{}: {} sessions, {} trainings, floor {:.1} GPU-hours; replayed at {}x on {} hosts of {} GPUs",
            w.name, stats.sessions, stats.trainings, stats.floor_gpu_hours, a.speedup, cm.hosts, gpus_per_host
        );
        print!("{}", sim_report::table(&results));
        println!("the same model in the simulator: nbos {}", sim_argv.join(" "));
        if let Some(c) = details.get("sim_command_with_config") {
            println!("with the hosts' config (trace time): {}", c.as_str().unwrap_or_default());
        }
        if let Some(c) = details.get("comparison") {
            println!("replay vs sim: {c:#}");
        }
        println!("replay details (real time): {details}");
        println!("wall time {wall_s:.3} s");
    }
    Ok(())
}
