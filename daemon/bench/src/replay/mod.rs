//! `nbos replay WORKLOAD --speedup K`: replays a session template on a real cluster, time
//! compressed K times, and reports what `nbos sim` reports, in trace time.
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

mod clock;
mod cluster;
mod report;
mod sampler;
mod session;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use self::clock::Clock;
use self::cluster::ReplayCluster;
use self::report::{ClusterModel, Measured, COUNTERS};
use self::sampler::{metric_sum, Sampler};
use nbos_sched::sim::{report as sim_report, Workload};
use nbos_test_support::Options;

/// Options of `nbos replay`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A NotebookOS session template (traces/templates/*.json). Traces (CSV) and
    /// synthetic workloads are refused: their sessions span days (`nbos sim` only).
    #[arg(value_name = "WORKLOAD")]
    pub workload: PathBuf,
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
    /// what the cluster uses, for the model in the report).
    #[arg(long, default_value_t = 3.0)]
    pub subscription_ratio: f64,
    /// The cluster's `gpu.idle_release` in trace seconds: a loopback cluster's daemons get
    /// this ÷ K (30 s at K = 60: 0.5 s), so idle-held GPUs last what the simulator models.
    #[arg(long, default_value_t = 30)]
    pub idle_release_s: u64,
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

/// The workload: templates only, with a reason for everything else.
fn load(p: &Path) -> anyhow::Result<Workload> {
    if p.extension().is_some_and(|e| e.eq_ignore_ascii_case("csv")) {
        bail!(
            "{}: nbos replay takes a NotebookOS session template (traces/templates/*.json), not a trace: \
             a trace's sessions are generated and span days, hours of real time even at --speedup 1000; \
             use nbos sim --trace for it",
            p.display()
        );
    }
    crate::sim::load_template(p).context(
        "nbos replay takes a NotebookOS session template (traces/templates/*.json); traces and synthetic \
         workloads are for nbos sim",
    )
}

/// Sums the [`COUNTERS`] over the hosts (`None` where no host has one).
fn counters(target: &ReplayCluster) -> [Option<f64>; 3] {
    let mut out = [None; 3];
    for i in 0..target.hosts.len() {
        let Ok(text) = target.metrics(i) else { continue };
        for (slot, name) in out.iter_mut().zip(COUNTERS) {
            if let Some(v) = metric_sum(&text, name) {
                *slot = Some(slot.unwrap_or(0.0) + v);
            }
        }
    }
    out
}

/// Runs the workload's sessions on `target` and collects what they measured.
fn replay(
    w: &Workload,
    target: &Arc<ReplayCluster>,
    clock: Clock,
    sample_every: Duration,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<Measured> {
    let before = counters(target);
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
    let (samples, sample_misses) = sampler.stop();
    let sessions = sessions?;
    let after = counters(target);
    let mut delta = [None; 3];
    for (d, (b, a)) in delta.iter_mut().zip(before.iter().zip(after)) {
        *d = a.map(|a| a - b.unwrap_or(0.0));
    }
    let start_unix_us = clock.unix_us_at(w.sessions.iter().map(|s| s.start).min().unwrap_or(0));
    let end_unix_us = sessions.iter().map(|s| s.stopped_unix_us).max().unwrap_or(start_unix_us);
    Ok(Measured { sessions, samples, sample_misses, start_unix_us, end_unix_us, counters: delta })
}

/// Runs the subcommand against the cluster at `--url`, or a loopback one it starts.
pub fn run(t: &crate::client::ConnectArgs, a: Args) -> anyhow::Result<()> {
    if !(a.speedup.is_finite() && a.speedup > 0.0) {
        bail!("--speedup must be a positive number, got {}", a.speedup);
    }
    let w = load(&a.workload)?;
    anyhow::ensure!(!w.sessions.is_empty(), "{}: the template has no sessions", a.workload.display());
    let clock_probe = Clock::start(0, a.speedup);
    let idle_release = clock_probe.real(a.idle_release_s * 1000);
    anyhow::ensure!(
        idle_release >= Duration::from_millis(1),
        "--idle-release-s {} at --speedup {} is under a millisecond of real time",
        a.idle_release_s,
        a.speedup
    );
    let started = Instant::now();
    let target = if t.url.is_some() {
        ReplayCluster::remote(t)?
    } else {
        ReplayCluster::local(
            u64::try_from(a.hosts)?,
            Options {
                fake_gpus: a.fake_gpus,
                idle_release: Some(idle_release),
                subscription_ratio: Some(a.subscription_ratio),
                ..crate::loopback::options(&a.python, &a.log_level, a.keep_logs)?
            },
        )?
    };
    let target = Arc::new(target);
    let gpus_per_host = target.hosts.iter().map(|h| h.gpus).max().unwrap_or(0);
    if let Some((i, s)) = w.sessions.iter().enumerate().find(|(_, s)| s.gpus > gpus_per_host) {
        bail!("session {i} needs {} GPUs, but the cluster's hosts have at most {gpus_per_host}", s.gpus);
    }
    let cm = ClusterModel {
        hosts: u32::try_from(target.hosts.len()).unwrap_or(u32::MAX),
        gpus_per_host,
        subscription_ratio: a.subscription_ratio,
        idle_release_s: a.idle_release_s,
        #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "milliseconds")]
        election_ms: (nbos_sched::sim::Model::default().election_ms as f64 * a.speedup).round() as u64,
    };
    let t0 = w.sessions.iter().map(|s| s.start).min().unwrap_or(0);
    let clock = Clock::start(t0, a.speedup);
    let progress = crate::progress::bar(a.json, w.sessions.len(), "sessions replayed:");
    let measured = replay(&w, &target, clock, Duration::from_millis(a.sample_ms.max(1)), &progress)?;
    progress.finish_and_clear();
    let result = report::result(&w, &clock, &target.hosts, &measured);
    let details = report::details(&w, &clock, &target.hosts, &cm, &measured);
    let model = cm.model();
    let stats = w.stats();
    let results = [("replay", result)];
    let wall_s = (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
    if let Some(dir) = &a.out {
        crate::sim::write_out(dir, &w.name, &stats, &model, &results, Some(("replay", details.clone())))?;
    }
    if a.json {
        let mut doc = sim_report::json(&w.name, &stats, &model, &results, Some(wall_s));
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
        println!(
            "the same model in the simulator: nbos sim --template {} {}",
            a.workload.display(),
            cm.sim_args().join(" ")
        );
        println!("replay details (real time): {details}");
        println!("wall time {wall_s:.3} s");
    }
    Ok(())
}
