//! `nbos bench election`: a cluster on loopback (`notebookosd` processes next to `nbos`,
//! each with its own state and ports): three GPU hosts (simulated GPUs) holding one
//! replicated kernel, and a fourth host without GPUs (`gpu.driver = "none"`), which holds
//! no replica and serves only as a gateway. Then
//!
//! - election latency: the client's `execute_request` sent (`SystemTime` just before the
//!   WebSocket write) → the elected replica's daemon wrote it to its ipykernel's shell
//!   socket, after binding committed the cell's GPUs and passed them to the lease server
//!   (`metadata.nbos_election.dispatched_unix_us` of the reply; all hosts share this
//!   machine's clock), p50/p99 over `--cells` trivial cells. This is what NotebookOS adds
//!   before a cell runs: the gateway's WebSocket, the front-end's pre-selection, the hop to
//!   the designee, its LEAD swap committed in the kernel's group (fsynced on a quorum), its
//!   catch-up check, the GPU commit and the write to the kernel. Measured twice: *local*,
//!   through the gateway of the host that ends up executing (pre-selection breaks ties
//!   toward it; `local_executor_cells` says how many cells did run there), and *remote*,
//!   through the GPU-less host, so every cell crosses the front-end's WebSocket to another
//!   host (`election_remote_*`);
//! - first output: the same request → the cell's first IOPub (`status: busy`) back at
//!   the client, which adds ipykernel's own time to start a cell and the way back
//!   (`kernel_start_p50_ms` is that difference in the local case, the kernel's share);
//! - state-sync throughput, small objects and one large numpy array: payload bytes /
//!   (the cell's code finished → every replica applied the cell's namespace, from each
//!   host's `GET /api/v1/cluster/replicas`). The time covers the executor's export, the
//!   commit to the kernel's group and every follower's apply. The small case is one cell
//!   that binds `--small-objects` new globals (half ints, half short strings, about 20
//!   pickled bytes each: a notebook's loop that fills globals, or many small results),
//!   so it measures the per-name cost; `sync_small_objects_per_s` says it in names.
//!
//! The cluster is the test-support crate's launcher, [`TestCluster`] ([`loopback`]).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::loopback::{self, create_kernel};
use crate::stats::{percentile, round3};
pub use nbos_test_support::cell_client::{executed_revision, CellClient, CellRun};
use nbos_test_support::{Options, TestCluster};

/// Options of `nbos bench election`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Measured cells for the election latency.
    #[arg(long, default_value_t = 200)]
    pub cells: usize,
    /// Unmeasured warm-up cells.
    #[arg(long, default_value_t = 20)]
    pub warmup: usize,
    /// Python with ipykernel, cloudpickle and numpy for the kernels.
    #[arg(long, default_value = "python3")]
    pub python: PathBuf,
    /// GPUs each cell asks for (each host has one simulated GPU per `--fake-gpus`).
    #[arg(long, default_value_t = 1)]
    pub gpus: u32,
    /// Simulated GPUs per host.
    #[arg(long, default_value_t = 1)]
    pub fake_gpus: u32,
    /// Small objects in the small-object sync cell.
    #[arg(long, default_value_t = 20_000)]
    pub small_objects: usize,
    /// Size of the numpy array in the large-object sync cell, MiB.
    #[arg(long, default_value_t = 64)]
    pub large_mib: usize,
    /// Keep the hosts' directories (configs, daemon logs) and print where they are.
    #[arg(long)]
    pub keep_logs: bool,
    /// Log filter of the daemons (written to each host's `daemon-1.log`).
    #[arg(long, default_value = "warn")]
    pub log_level: String,
}

/// Results.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ElectionBench {
    /// Median election latency, client on the executor's host's gateway, ms.
    pub election_p50_ms: f64,
    /// 99th percentile election latency, client on the executor's host's gateway, ms.
    pub election_p99_ms: f64,
    /// Median election latency, client on a gateway-only host, ms.
    pub election_remote_p50_ms: f64,
    /// 99th percentile election latency, client on a gateway-only host, ms.
    pub election_remote_p99_ms: f64,
    /// Median request → first IOPub at the client (local case), ms.
    pub first_output_p50_ms: f64,
    /// 99th percentile request → first IOPub at the client (local case), ms.
    pub first_output_p99_ms: f64,
    /// Median request → first IOPub at the client (remote case), ms.
    pub first_output_remote_p50_ms: f64,
    /// 99th percentile request → first IOPub at the client (remote case), ms.
    pub first_output_remote_p99_ms: f64,
    /// Measured cells of the local case that the gateway's own host executed.
    pub local_executor_cells: usize,
    /// Median of (first output − election) per cell: ipykernel starting the cell and its
    /// first IOPub travelling back, ms.
    pub kernel_start_p50_ms: f64,
    /// Small-object sync throughput, MiB/s.
    pub sync_small_mib_s: f64,
    /// Large-object sync throughput, MiB/s.
    pub sync_large_mib_s: f64,
    /// Small-object sync throughput, names per second.
    pub sync_small_objects_per_s: f64,
    /// Names the small-object cell binds.
    pub sync_small_objects: usize,
    /// Payload of the small-object cell, bytes (pickled sizes).
    pub sync_small_bytes: u64,
    /// Seconds from the small cell's end to every replica applied.
    pub sync_small_s: f64,
    /// Payload of the large-object cell, bytes.
    pub sync_large_bytes: u64,
    /// Seconds from the large cell's end to every replica applied.
    pub sync_large_s: f64,
    /// Cells measured per case.
    pub cells: usize,
    /// Hosts (the GPU hosts and the gateway-only one).
    pub hosts: usize,
}

/// Runs the benchmark.
pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.cells >= 10, "--cells must be at least 10 for a p99 to mean anything");
    let options = Options {
        fake_gpus: args.fake_gpus,
        gateway_hosts: 1,
        ..loopback::options(&args.python, &args.log_level, args.keep_logs)?
    };
    let progress = crate::progress::stages(args.json, "bench election:");
    progress.set_message("starting 3 GPU hosts and a gateway-only host");
    let cluster = TestCluster::launch(4, options)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    let result = runtime.block_on(bench(&cluster, &args, &progress))?;
    progress.finish_and_clear();
    if args.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        println!(
            "executor election on {} GPU hosts + 1 gateway-only host over loopback ({} cells per case)",
            result.hosts - 1,
            result.cells
        );
        println!("  request sent -> cell written to the elected kernel (after its GPUs are committed):");
        println!(
            "    gateway on the executor's host: p50 {:.3} ms  p99 {:.3} ms ({} of {} cells ran there)",
            result.election_p50_ms, result.election_p99_ms, result.local_executor_cells, result.cells
        );
        println!(
            "    gateway on another host:        p50 {:.3} ms  p99 {:.3} ms",
            result.election_remote_p50_ms, result.election_remote_p99_ms
        );
        println!("  request sent -> first output at the client:");
        println!(
            "    gateway on the executor's host: p50 {:.3} ms  p99 {:.3} ms (ipykernel's share p50 {:.3} ms)",
            result.first_output_p50_ms, result.first_output_p99_ms, result.kernel_start_p50_ms
        );
        println!(
            "    gateway on another host:        p50 {:.3} ms  p99 {:.3} ms",
            result.first_output_remote_p50_ms, result.first_output_remote_p99_ms
        );
        println!(
            "  state sync, small objects: {:.1} MiB/s, {:.0} names/s ({} names, {} bytes in {:.3} s)",
            result.sync_small_mib_s,
            result.sync_small_objects_per_s,
            result.sync_small_objects,
            result.sync_small_bytes,
            result.sync_small_s
        );
        println!(
            "  state sync, large object:  {:.1} MiB/s ({} bytes in {:.3} s)",
            result.sync_large_mib_s, result.sync_large_bytes, result.sync_large_s
        );
    }
    Ok(())
}

/// Waits until every host holding a replica of `kernel` reports it applied `revision`.
pub async fn wait_applied(cluster: &TestCluster, kernel: &str, revision: u64, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut all = true;
        let mut seen = 0;
        for h in &cluster.hosts {
            let Some(v) = cluster.get_json(h.node_id, "/api/v1/cluster/replicas") else { continue };
            for r in v.as_array().into_iter().flatten() {
                if r.get("kernel_id").and_then(|k| k.as_str()) != Some(kernel) {
                    continue;
                }
                seen += 1;
                all &= r.get("applied_revision").and_then(serde_json::Value::as_u64).unwrap_or(0) >= revision;
            }
        }
        if all && seen >= 3 {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "replicas of {kernel} did not apply revision {revision} in {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Per-cell figures of one case, ms.
#[derive(Debug, Default)]
struct Samples {
    elections: Vec<f64>,
    first_outputs: Vec<f64>,
    kernel_starts: Vec<f64>,
    /// Cells the host with node id `gateway` executed.
    on_gateway: usize,
}

/// Runs `warmup` + `cells` trivial cells through `client` and times the measured ones.
async fn time_cells(client: &mut CellClient, gateway: u64, args: &Args) -> anyhow::Result<Samples> {
    let timeout = Duration::from_secs(120);
    let mut out = Samples::default();
    for i in 0..(args.warmup + args.cells) {
        let run = client.run("pass", timeout).await?;
        anyhow::ensure!(run.reply.get("status").and_then(|s| s.as_str()) == Some("ok"), "cell failed: {}", run.reply);
        if i < args.warmup {
            continue;
        }
        let first = run.started_after.context("the cell produced no output")?.as_secs_f64() * 1e3;
        let election = run.reply_metadata.get("nbos_election");
        let dispatched = election
            .and_then(|e| e.get("dispatched_unix_us"))
            .and_then(serde_json::Value::as_u64)
            .with_context(|| format!("the reply does not say when the cell was dispatched: {}", run.reply_metadata))?;
        let ms = dispatched.saturating_sub(run.sent_unix_us) as f64 / 1e3;
        out.elections.push(ms);
        out.first_outputs.push(first);
        out.kernel_starts.push(first - ms);
        if election.and_then(|e| e.get("node_id")).and_then(serde_json::Value::as_u64) == Some(gateway) {
            out.on_gateway += 1;
        }
    }
    Ok(out)
}

async fn bench(cluster: &TestCluster, args: &Args, progress: &indicatif::ProgressBar) -> anyhow::Result<ElectionBench> {
    progress.set_message("creating the kernel");
    let id = create_kernel(cluster, 1, args.gpus).await?;
    let timeout = Duration::from_secs(120);
    // Local first: with every GPU idle, pre-selection breaks the tie toward host 1's own
    // replica, and keeps that previous executor while it can commit the GPUs. Then remote,
    // through the gateway-only host (the last one): it holds no replica, so each cell
    // crosses to the executor's host.
    progress.set_message(format!("{} cells through host 1's gateway", args.cells));
    let mut client = CellClient::connect(&cluster.client(1)?, &id).await?;
    let mut l = time_cells(&mut client, 1, args).await?;
    let remote = cluster.hosts.last().context("no hosts")?.node_id;
    progress.set_message(format!("{} cells through the gateway-only host", args.cells));
    let mut far = CellClient::connect(&cluster.client(remote)?, &id).await?;
    let mut r = time_cells(&mut far, remote, args).await?;
    drop(far);
    let small_code = format!(
        "import pickle as _p\nfor _i in range({n}):\n    globals()[f'small_i{{_i}}'] = _i\n    globals()[f'small_s{{_i}}'] = f'value-{{_i}}'\n\
         print(sum(len(_p.dumps(globals()[k], 5)) for k in list(globals()) if k.startswith('small_')))",
        n = args.small_objects / 2
    );
    let small_names = args.small_objects / 2 * 2;
    progress.set_message("namespace sync: small objects, then a large array");
    let (small_bytes, small_s) = sync_cell(cluster, &mut client, &id, &small_code, timeout).await?;
    let large_code = format!(
        "import numpy as np\nlarge = np.random.default_rng(7).integers(0, 255, size={n}, dtype=np.uint8)\nprint(large.nbytes)",
        n = args.large_mib * 1024 * 1024
    );
    let (large_bytes, large_s) = sync_cell(cluster, &mut client, &id, &large_code, timeout).await?;
    let g = cluster.client(1)?;
    let kid = id.clone();
    tokio::task::spawn_blocking(move || g.delete_kernel(&kid)).await??;
    let mib = |b: u64, s: f64| b as f64 / (1024.0 * 1024.0) / s.max(1e-9);
    Ok(ElectionBench {
        election_p50_ms: round3(percentile(&mut l.elections, 50.0)),
        election_p99_ms: round3(percentile(&mut l.elections, 99.0)),
        election_remote_p50_ms: round3(percentile(&mut r.elections, 50.0)),
        election_remote_p99_ms: round3(percentile(&mut r.elections, 99.0)),
        first_output_p50_ms: round3(percentile(&mut l.first_outputs, 50.0)),
        first_output_p99_ms: round3(percentile(&mut l.first_outputs, 99.0)),
        first_output_remote_p50_ms: round3(percentile(&mut r.first_outputs, 50.0)),
        first_output_remote_p99_ms: round3(percentile(&mut r.first_outputs, 99.0)),
        local_executor_cells: l.on_gateway,
        kernel_start_p50_ms: round3(percentile(&mut l.kernel_starts, 50.0)),
        sync_small_mib_s: round3(mib(small_bytes, small_s)),
        sync_large_mib_s: round3(mib(large_bytes, large_s)),
        sync_small_objects_per_s: round3(small_names as f64 / small_s.max(1e-9)),
        sync_small_objects: small_names,
        sync_small_bytes: small_bytes,
        sync_small_s: round3(small_s),
        sync_large_bytes: large_bytes,
        sync_large_s: round3(large_s),
        cells: args.cells,
        hosts: cluster.hosts.len(),
    })
}

/// Runs a cell whose last line prints its payload size; returns (bytes, seconds from the
/// printed line's arrival to every replica applied the cell).
async fn sync_cell(
    cluster: &TestCluster,
    client: &mut CellClient,
    id: &str,
    code: &str,
    timeout: Duration,
) -> anyhow::Result<(u64, f64)> {
    let run = client.run(code, timeout).await?;
    anyhow::ensure!(
        run.reply.get("status").and_then(|s| s.as_str()) == Some("ok"),
        "sync cell failed: {} {}",
        run.reply,
        run.stderr
    );
    let bytes: u64 = run.stdout.trim().parse().with_context(|| format!("sync cell printed {:?}", run.stdout))?;
    let end = run.last_stdout_at.context("the sync cell printed nothing")?;
    let revision = executed_revision(&run).context("the reply carries no synchronised revision")?;
    wait_applied(cluster, id, revision, timeout).await?;
    Ok((bytes, end.elapsed().as_secs_f64()))
}
