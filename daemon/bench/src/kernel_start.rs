//! `nbos bench kernel-start`: how long a new kernel takes until it answers its first
//! cell, with every host starting Python afresh and with the pre-warm pool (issue 14,
//! docs/prewarm.md).
//!
//! Per sample: create the kernel → open its channels → `1 + 1` answered; then the kernel is
//! deleted. Two setups, each with `kernel.prewarm_max = 0` and with a pool of `--pool` per
//! host that is refilled before each sample (a sample measures a take, not a pool that ran
//! dry):
//! - one standalone host: a replica's start, the part the pool shortens;
//! - three hosts forming a cluster (one simulated GPU each): a replicated kernel, three
//!   replicas started at once plus the kernel's raft group and its first election.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use nbos_test_support::{Options, TestCluster};
use serde::Serialize;

use crate::election::CellClient;
use crate::loopback::{self, create_kernel};
use crate::stats::{percentile, round3};

const CLUSTER_HOSTS: u64 = 3;
const CELL_TIMEOUT: Duration = Duration::from_secs(120);
const REFILL_TIMEOUT: Duration = Duration::from_secs(120);

/// `nbos bench kernel-start` options.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Kernels started in each mode.
    #[arg(long, default_value_t = 10)]
    pub samples: usize,
    /// Pre-warmed processes per host in the pool mode.
    #[arg(long, default_value_t = 3)]
    pub pool: u32,
    /// Python with ipykernel for the kernels.
    #[arg(long, default_value = "python3")]
    pub python: PathBuf,
    /// Keep the hosts' directories (configs, daemon logs) and print where they are.
    #[arg(long)]
    pub keep_logs: bool,
    /// Log filter of the daemons.
    #[arg(long, default_value = "warn")]
    pub log_level: String,
    /// `kernel.pid_namespace` of the hosts (a root daemon's kernels in PID namespaces of
    /// their own, the default), to measure what it costs a start.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub pid_namespace: bool,
    /// Whose account kernels run as: `kernel_user` (the hosts' `kernel.user`, the setups
    /// above) or `owner`: `kernel.run_as = "owner"` beside `kernel_user`, one host, in
    /// process, each kernel owned by the account `nbos-bench-owner` (made once; root only).
    #[arg(long, value_enum, default_value_t = RunAsArg::KernelUser)]
    pub run_as: RunAsArg,
    /// Also write the one-host p50s (cold and pre-warmed replica start) into this cost
    /// file's `replica_start` section (the simulator's docs/sim/costs.json).
    #[arg(long, value_name = "FILE")]
    pub costs_out: Option<PathBuf>,
}

/// `--run-as`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RunAsArg {
    /// `kernel.user` for every kernel.
    KernelUser,
    /// `kernel.run_as = "owner"`, beside `kernel_user`.
    Owner,
}

/// Create → first cell answered, ms, with and without the pool.
#[derive(Debug, Serialize)]
pub struct StartTimes {
    /// Every replica a new Python: p50.
    pub cold_p50_ms: f64,
    /// Every replica a new Python: p99.
    pub cold_p99_ms: f64,
    /// Replicas taken from the pool: p50.
    pub pool_p50_ms: f64,
    /// Replicas taken from the pool: p99.
    pub pool_p99_ms: f64,
    /// `cold_p50_ms / pool_p50_ms`, measured in this run.
    pub speedup_p50: f64,
    /// Replicas that took a ready pre-warmed process (all hosts, pool mode).
    pub pool_hits: f64,
}

/// The result.
#[derive(Debug, Serialize)]
pub struct KernelStartBench {
    /// Kernels started in each mode.
    pub samples: usize,
    /// Pre-warmed processes per host in the pool mode.
    pub pool: u32,
    /// One standalone host: a replica's start.
    pub replica: StartTimes,
    /// Three hosts in a cluster: a replicated kernel's start.
    pub cluster_kernel: StartTimes,
}

/// Runs the benchmark.
pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.samples >= 1, "--samples must be at least 1");
    anyhow::ensure!((1..=64).contains(&args.pool), "--pool must be 1..=64");
    if args.run_as == RunAsArg::Owner {
        anyhow::ensure!(args.costs_out.is_none(), "--costs-out takes the HTTP setups' figures, not --run-as owner's");
        return crate::kernel_start_owner::run(&args.python, args.samples, args.pool, args.pid_namespace, args.json);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    let result = KernelStartBench {
        samples: args.samples,
        pool: args.pool,
        replica: compare(&args, 1, &runtime)?,
        cluster_kernel: compare(&args, CLUSTER_HOSTS, &runtime)?,
    };
    if let Some(path) = &args.costs_out {
        let section = nbos_sched::sim::costs::ReplicaStart {
            cold_ms: result.replica.cold_p50_ms,
            prewarmed_ms: result.replica.pool_p50_ms,
            measured: crate::costs_file::measured(),
        };
        crate::costs_file::update(path, "replica_start", section)?;
    }
    if args.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        println!(
            "kernel start, create -> first cell answered, {} samples each, pool of {} per host, pid_namespace = {}:",
            args.samples, args.pool, args.pid_namespace
        );
        for (what, t) in
            [("one host (a replica)", &result.replica), ("3-host cluster (3 replicas)", &result.cluster_kernel)]
        {
            println!(
                "  {what:<28} new Python p50 {:.1} ms p99 {:.1} ms | pre-warmed p50 {:.1} ms p99 {:.1} ms | p50 ratio {:.2}x ({} pool hits)",
                t.cold_p50_ms, t.cold_p99_ms, t.pool_p50_ms, t.pool_p99_ms, t.speedup_p50, t.pool_hits
            );
        }
    }
    Ok(())
}

/// The samples on `hosts` hosts without and with the pool.
fn compare(args: &Args, hosts: u64, runtime: &tokio::runtime::Runtime) -> anyhow::Result<StartTimes> {
    let (mut cold, _) = measure(args, hosts, "prewarm_max = 0\n", runtime)?;
    let pool_toml = format!("prewarm_min = {p}\nprewarm_max = {p}\n", p = args.pool);
    let (mut warm, hits) = measure(args, hosts, &pool_toml, runtime)?;
    let (cold_p50, warm_p50) = (percentile(&mut cold, 50.0), percentile(&mut warm, 50.0));
    Ok(StartTimes {
        cold_p50_ms: round3(cold_p50),
        cold_p99_ms: round3(percentile(&mut cold, 99.0)),
        pool_p50_ms: round3(warm_p50),
        pool_p99_ms: round3(percentile(&mut warm, 99.0)),
        speedup_p50: round3(cold_p50 / warm_p50),
        pool_hits: hits,
    })
}

/// Samples on fresh hosts (a cluster unless `hosts == 1`) with `kernel_toml`; returns the
/// times (ms) and the pool hits the hosts counted.
fn measure(
    args: &Args,
    hosts: u64,
    kernel_toml: &str,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<(Vec<f64>, f64)> {
    let options = Options {
        overlay: format!("[kernel]\n{kernel_toml}pid_namespace = {}\n", args.pid_namespace),
        standalone: hosts == 1,
        ..loopback::options(&args.python, &args.log_level, args.keep_logs)?
    };
    let cluster = TestCluster::launch(hosts, options)?;
    let pooled = kernel_toml.contains("prewarm_min");
    let mut samples = Vec::with_capacity(args.samples);
    let what = format!("kernel starts on {hosts} host(s), {}", if pooled { "pool" } else { "no pool" });
    let bar = crate::progress::bar(args.json, args.samples, &what);
    for i in 0..args.samples {
        if pooled {
            wait_for_pools(&cluster, hosts, args.pool)?;
        }
        let started = Instant::now();
        let ms = runtime.block_on(async {
            let host = u64::try_from(i)? % hosts + 1;
            let id = create_kernel(&cluster, host, 0).await?;
            let mut client = CellClient::connect(&cluster.client(host)?, &id).await?;
            let run = client.run("1 + 1", CELL_TIMEOUT).await?;
            anyhow::ensure!(run.reply["status"] == "ok", "sample {i}: the first cell failed: {:?}", run.reply);
            let ms = started.elapsed().as_secs_f64() * 1000.0;
            let g = cluster.client(host)?;
            tokio::task::spawn_blocking(move || g.delete_kernel(&id)).await??;
            anyhow::Ok(ms)
        })?;
        samples.push(ms);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let hits = (1..=hosts).filter_map(|h| cluster.metric(h, r#"notebookos_prewarm_takes_total{result="hit"}"#)).sum();
    Ok((samples, hits))
}

/// Waits until every host's pool holds `n` ready processes.
fn wait_for_pools(cluster: &TestCluster, hosts: u64, n: u32) -> anyhow::Result<()> {
    let deadline = Instant::now() + REFILL_TIMEOUT;
    let full = |h| cluster.metric(h, r#"notebookos_prewarm_pool_processes{state="ready"}"#) == Some(f64::from(n));
    while !(1..=hosts).all(full) {
        anyhow::ensure!(Instant::now() < deadline, "the hosts' pools did not refill to {n} in {REFILL_TIMEOUT:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}
