//! `nbos bench migration`: how long a cell waits when every replica's host is busy and a
//! replica moves to a free host (issue 14).
//!
//! Four local hosts with one simulated GPU each. A kernel K has replicas on three of them;
//! four blocker kernels' long cells take every host's GPU, then the blocker on the host
//! without a replica of K is released. K's next cell finds every replica's host busy (all
//! YIELD), a replica moves to the free host (start a kernel there, catch up, quiesce the
//! old one, swap), and the cell runs there. Measured per sample: the cell sent → written to
//! the new replica's kernel (`metadata.nbos_election.dispatched_unix_us`), which is
//! all-YIELD → the cell starts elsewhere plus one election round (about 2 ms). The blockers
//! are released between samples; the next sample uses K's new replica set.
//!
//! The samples run at each namespace size of `--state-mib` in turn (K's state cell sets
//! the size); a least-squares line through the sizes' p50s gives a move's base and its
//! cost per MiB, which `--costs-out` writes into the simulator's cost file.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use nbos_test_support::{Options, TestCluster};
use serde::Serialize;

use crate::election::CellClient;
use crate::loopback::{self, create_kernel};
use crate::stats::{percentile, round3};

const CELL_TIMEOUT: Duration = Duration::from_secs(300);

/// `nbos bench migration` options.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Measured migrations per namespace size.
    #[arg(long, default_value_t = 5)]
    pub samples: usize,
    /// Python with ipykernel, cloudpickle and numpy for the kernels.
    #[arg(long, default_value = "python3")]
    pub python: PathBuf,
    /// MiB of namespace (a numpy array, through the large-object store) the moving replica
    /// catches up: one or more sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 16, 48])]
    pub state_mib: Vec<usize>,
    /// Also write the per-size p50s and their fit into this cost file's `state_transfer`
    /// section (the simulator's docs/sim/costs.json).
    #[arg(long, value_name = "FILE")]
    pub costs_out: Option<PathBuf>,
    /// Keep the hosts' directories (configs, daemon logs) and print where they are.
    #[arg(long)]
    pub keep_logs: bool,
    /// Log filter of the daemons.
    #[arg(long, default_value = "warn")]
    pub log_level: String,
}

/// One namespace size's migrations.
#[derive(Debug, Serialize)]
pub struct SizeResult {
    /// Measured migrations.
    pub samples: usize,
    /// Namespace carried, MiB.
    pub state_mib: usize,
    /// Cell sent (every replica's host busy) → written to the moved replica's kernel, ms.
    pub migration_p50_ms: f64,
    /// The same, 99th percentile.
    pub migration_p99_ms: f64,
    /// The same, slowest.
    pub migration_max_ms: f64,
}

/// The result.
#[derive(Debug, Serialize)]
pub struct MigrationBench {
    /// Per namespace size.
    pub sizes: Vec<SizeResult>,
    /// The least-squares line through the sizes' p50s: its intercept, ms.
    pub fit_base_ms: f64,
    /// Its slope, ms per MiB.
    pub fit_per_mib_ms: f64,
    /// Pre-warmed processes the hosts handed out during the rounds (blockers' moves
    /// included): at least one per measured move says the moves started pre-warmed.
    pub pool_hits: f64,
}

/// Least squares `y = a + b x` (one point: a horizontal line); both at least 0.
fn fit(points: &[(f64, f64)]) -> (f64, f64) {
    #[expect(clippy::cast_precision_loss, reason = "a handful of points")]
    let n = points.len() as f64;
    if points.is_empty() {
        return (0.0, 0.0);
    }
    let (mx, my) = (points.iter().map(|p| p.0).sum::<f64>() / n, points.iter().map(|p| p.1).sum::<f64>() / n);
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let b = if sxx > 0.0 { (sxy / sxx).max(0.0) } else { 0.0 };
    ((my - b * mx).max(0.0), b)
}

/// Runs the benchmark.
pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.samples >= 1, "--samples must be at least 1");
    anyhow::ensure!(!args.state_mib.is_empty(), "--state-mib needs at least one size");
    let options = Options {
        // K and four blockers, three replicas each, on four one-GPU hosts: up to five on a
        // host, and a moving replica needs room for one more.
        subscription_ratio: Some(6.0),
        ..loopback::options(&args.python, &args.log_level, args.keep_logs)?
    };
    let cluster = TestCluster::launch(4, options)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    let result = runtime.block_on(bench(&cluster, &args))?;
    if let Some(path) = &args.costs_out {
        let moves = result.sizes.iter().map(|s| s.samples).sum::<usize>();
        #[expect(clippy::cast_precision_loss, reason = "a count of moves")]
        let prewarmed = result.pool_hits >= moves as f64;
        let section = nbos_sched::sim::costs::StateTransfer {
            move_base_ms: result.fit_base_ms,
            per_mib_ms: result.fit_per_mib_ms,
            bench_start: if prewarmed {
                nbos_sched::sim::costs::StartKind::Prewarmed
            } else {
                nbos_sched::sim::costs::StartKind::Cold
            },
            points: result
                .sizes
                .iter()
                .map(|s| nbos_sched::sim::costs::MovePoint {
                    #[expect(clippy::cast_precision_loss, reason = "MiB")]
                    mib: s.state_mib as f64,
                    move_p50_ms: s.migration_p50_ms,
                    samples: s.samples,
                })
                .collect(),
            measured: crate::costs_file::measured(),
        };
        crate::costs_file::update(path, "state_transfer", section)?;
    }
    if args.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        println!("migration on 4 local hosts (1 GPU each), cell sent with every replica's host busy -> running on the moved replica:");
        for s in &result.sizes {
            println!(
                "  {:>5} MiB of namespace, {} samples: p50 {:.1} ms  p99 {:.1} ms  max {:.1} ms",
                s.state_mib, s.samples, s.migration_p50_ms, s.migration_p99_ms, s.migration_max_ms
            );
        }
        println!(
            "  fit: {:.1} ms + {:.2} ms/MiB ({} pre-warmed processes taken)",
            result.fit_base_ms, result.fit_per_mib_ms, result.pool_hits
        );
    }
    Ok(())
}

/// The node ids holding replicas of `kernel`, from its record.
fn replica_hosts(cluster: &TestCluster, kernel: &str) -> anyhow::Result<Vec<u64>> {
    let record = cluster
        .get_json(1, &format!("/api/v1/cluster/kernels/{kernel}"))
        .with_context(|| format!("reading kernel {kernel}'s record"))?;
    Ok(record["replicas"]
        .as_array()
        .map(|r| r.iter().filter_map(|r| r["node_id"].as_u64()).collect())
        .unwrap_or_default())
}

/// Where `kernel`'s current cell runs, as host 1's front-end sees it.
async fn executor_of(cluster: &TestCluster, kernel: &str) -> anyhow::Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(n) = cluster
            .get_json(1, &format!("/api/kernels/{kernel}"))
            .and_then(|m| m["execution"]["current_executor_node"].as_u64())
        {
            return Ok(n);
        }
        anyhow::ensure!(Instant::now() < deadline, "kernel {kernel}'s long cell did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn bench(cluster: &TestCluster, args: &Args) -> anyhow::Result<MigrationBench> {
    let gates = tempfile::Builder::new().prefix("nbos-bench-gates-").tempdir()?;
    // Kernels run as another user: they look the gate files up, never list the directory.
    std::fs::set_permissions(gates.path(), std::os::unix::fs::PermissionsExt::from_mode(0o711))?;
    let k = create_kernel(cluster, 1, 1).await?;
    let blockers = [
        create_kernel(cluster, 1, 1).await?,
        create_kernel(cluster, 1, 1).await?,
        create_kernel(cluster, 1, 1).await?,
        create_kernel(cluster, 1, 1).await?,
    ];
    let mut client = CellClient::connect(&cluster.client(1)?, &k).await?;
    let mut blocker_clients = Vec::new();
    for b in &blockers {
        blocker_clients.push(CellClient::connect(&cluster.client(1)?, b).await?);
    }
    let mut sizes = Vec::new();
    let bar = crate::progress::bar(args.json, args.samples * args.state_mib.len(), "migrations");
    let mut round = 0;
    // Counted over the rounds only (the kernels' creation took pool processes too).
    let hits_before = pool_hits(cluster);
    for &mib in &args.state_mib {
        let state = format!("import numpy as np\nstate = np.ones({mib} * (1 << 20) // 8)\nn = 0");
        let run = client.run(&state, CELL_TIMEOUT).await?;
        anyhow::ensure!(run.reply["status"] == "ok", "the state cell failed: {:?}", run.reply);
        let mut samples = Vec::new();
        for _ in 0..args.samples {
            round += 1;
            // Every host's GPU taken by a blocker's long cell (one that finds its replicas' hosts
            // busy moves to the free one, as K will).
            let mut held = Vec::new();
            let mut executors = Vec::new();
            for (i, (b, bc)) in blockers.iter().zip(blocker_clients.iter_mut()).enumerate() {
                let gate = gates.path().join(format!("r{round}-b{i}"));
                let code =
                    format!("import os, time\nwhile not os.path.exists({:?}):\n    time.sleep(0.01)", gate.display());
                let (id, t) = bc.send(&code).await?;
                executors.push(executor_of(cluster, b).await?);
                held.push((id, t, gate));
            }
            // Free the host K has no replica on.
            let k_hosts = replica_hosts(cluster, &k)?;
            let free = (1..=4u64).find(|h| !k_hosts.contains(h)).context("K is on every host")?;
            let i = executors.iter().position(|&e| e == free).context("no blocker on the free host")?;
            std::fs::write(&held[i].2, "go")?;
            let (id, t, _) = &held[i];
            blocker_clients[i].wait(id, *t, CELL_TIMEOUT).await?;
            // K's cell: every replica's host is busy.
            let sent = SystemTime::now();
            let run = client.run("n += 1", CELL_TIMEOUT).await?;
            anyhow::ensure!(run.reply["status"] == "ok", "round {round}: K's cell failed: {:?}", run.reply);
            let on = run.reply_metadata["nbos_election"]["node_id"].as_u64();
            anyhow::ensure!(on == Some(free), "round {round}: the cell ran on {on:?}, not on the free host {free}");
            let dispatched =
                run.reply_metadata["nbos_election"]["dispatched_unix_us"].as_u64().context("no dispatch time")?;
            let sent_us = u64::try_from(sent.duration_since(SystemTime::UNIX_EPOCH)?.as_micros())?;
            #[expect(clippy::cast_precision_loss, reason = "microseconds of one migration")]
            samples.push(dispatched.saturating_sub(sent_us) as f64 / 1000.0);
            for (j, (id, t, gate)) in held.iter().enumerate() {
                if j != i {
                    std::fs::write(gate, "go")?;
                    blocker_clients[j].wait(id, *t, CELL_TIMEOUT).await?;
                }
            }
            bar.inc(1);
        }
        sizes.push(SizeResult {
            samples: samples.len(),
            state_mib: mib,
            migration_p50_ms: round3(percentile(&mut samples, 50.0)),
            migration_p99_ms: round3(percentile(&mut samples, 99.0)),
            migration_max_ms: round3(samples.iter().copied().fold(0.0, f64::max)),
        });
    }
    bar.finish_and_clear();
    #[expect(clippy::cast_precision_loss, reason = "MiB")]
    let points: Vec<(f64, f64)> = sizes.iter().map(|s| (s.state_mib as f64, s.migration_p50_ms)).collect();
    let (base, per_mib) = fit(&points);
    let pool_hits = pool_hits(cluster) - hits_before;
    Ok(MigrationBench { sizes, fit_base_ms: round3(base), fit_per_mib_ms: round3(per_mib), pool_hits })
}

/// Pre-warmed processes the four hosts have handed out.
fn pool_hits(cluster: &TestCluster) -> f64 {
    (1..=4).filter_map(|h| cluster.metric(h, r#"notebookos_prewarm_takes_total{result="hit"}"#)).sum()
}

#[cfg(test)]
mod tests {
    use super::fit;

    #[test]
    fn the_fit_is_least_squares_and_never_negative() {
        let (a, b) = fit(&[(1.0, 110.0), (16.0, 260.0), (48.0, 580.0)]);
        assert!((a - 100.0).abs() < 1e-6 && (b - 10.0).abs() < 1e-6, "{a} {b}");
        assert_eq!(fit(&[(8.0, 2_700.0)]), (2_700.0, 0.0), "one size: a flat line");
        assert_eq!(fit(&[(1.0, 300.0), (10.0, 200.0)]).1, 0.0, "a falling line is noise, not a negative cost");
    }
}
