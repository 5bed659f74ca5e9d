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
    /// Measured migrations.
    #[arg(long, default_value_t = 20)]
    pub samples: usize,
    /// Python with ipykernel, cloudpickle and numpy for the kernels.
    #[arg(long, default_value = "python3")]
    pub python: PathBuf,
    /// MiB of namespace (a numpy array, through the large-object store) the moving replica catches up.
    #[arg(long, default_value_t = 8)]
    pub state_mib: usize,
    /// Keep the hosts' directories (configs, daemon logs) and print where they are.
    #[arg(long)]
    pub keep_logs: bool,
    /// Log filter of the daemons.
    #[arg(long, default_value = "warn")]
    pub log_level: String,
}

/// The result.
#[derive(Debug, Serialize)]
pub struct MigrationBench {
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

/// Runs the benchmark.
pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.samples >= 1, "--samples must be at least 1");
    let options = Options {
        // K and four blockers, three replicas each, on four one-GPU hosts: up to five on a
        // host, and a moving replica needs room for one more.
        subscription_ratio: Some(6.0),
        ..loopback::options(&args.python, &args.log_level, args.keep_logs)?
    };
    let cluster = TestCluster::launch(4, options)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    let result = runtime.block_on(bench(&cluster, &args))?;
    if args.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        println!(
            "migration on 4 local hosts (1 GPU each), {} samples, {} MiB of namespace:",
            result.samples, result.state_mib
        );
        println!(
            "  cell sent with every replica's host busy -> running on the moved replica: p50 {:.1} ms  p99 {:.1} ms  max {:.1} ms",
            result.migration_p50_ms, result.migration_p99_ms, result.migration_max_ms
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
    let state = format!("import numpy as np\nstate = np.ones({} * (1 << 20) // 8)\nn = 0", args.state_mib);
    let run = client.run(&state, CELL_TIMEOUT).await?;
    anyhow::ensure!(run.reply["status"] == "ok", "the state cell failed: {:?}", run.reply);
    let mut blocker_clients = Vec::new();
    for b in &blockers {
        blocker_clients.push(CellClient::connect(&cluster.client(1)?, b).await?);
    }
    let mut samples = Vec::new();
    let bar = crate::progress::bar(args.json, args.samples, "migrations");
    for round in 0..args.samples {
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
    bar.finish_and_clear();
    let n = samples.len();
    Ok(MigrationBench {
        samples: n,
        state_mib: args.state_mib,
        migration_p50_ms: round3(percentile(&mut samples, 50.0)),
        migration_p99_ms: round3(percentile(&mut samples, 99.0)),
        migration_max_ms: round3(samples.iter().copied().fold(0.0, f64::max)),
    })
}
