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
//! [`LocalCluster`] is also what the multi-host tests start.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::stats::{percentile, round3};
pub use nbos_test_support::cell_client::{executed_revision, CellClient, CellRun};
use notebookosd::link::client::GatewayClient;

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
    /// Log filter of the daemons (written to each host's `daemon.log`).
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

/// One daemon of a [`LocalCluster`].
pub struct LocalHost {
    /// Raft node id (1-based).
    pub node_id: u64,
    /// Gateway URL (stable across restarts).
    pub url: String,
    /// Its directory (config, state, runtime, log).
    pub dir: PathBuf,
    child: Option<Child>,
}

impl LocalHost {
    /// The daemon's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }
}

/// N `notebookosd` processes forming one cluster on loopback, each with its own state
/// directory, ports and simulated GPUs, sharing a large-object directory and a token.
/// Stopped (SIGTERM, then SIGKILL) on drop.
pub struct LocalCluster {
    /// The hosts, node id `i + 1` at index `i`.
    pub hosts: Vec<LocalHost>,
    /// The cluster's API token.
    pub token: String,
    /// File holding the token.
    pub token_file: PathBuf,
    daemon: PathBuf,
    dir: Option<tempfile::TempDir>,
    keep: bool,
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for h in &mut self.hosts {
            if let Some(mut c) = h.child.take() {
                signal(&c, libc::SIGTERM);
                let deadline = Instant::now() + Duration::from_secs(20);
                while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                kill_group(&c);
                let _ = c.wait();
            }
        }
        if self.keep {
            if let Some(d) = self.dir.take() {
                eprintln!("nbos: the hosts' directories are kept in {}", d.keep().display());
            }
        }
    }
}

fn kill_group(c: &Child) {
    if let Ok(pid) = libc::pid_t::try_from(c.id()) {
        // SAFETY: killpg(2) on the process group our own child leads (`process_group(0)`).
        unsafe { libc::killpg(pid, libc::SIGKILL) };
    }
}

fn signal(c: &Child, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(c.id()) {
        // SAFETY: kill(2) on our own child, not reaped yet.
        unsafe { libc::kill(pid, sig) };
    }
}

/// A free loopback TCP port (bound, then released; the daemon binds it soon after). Below
/// the ephemeral range: a port-0 pick could be taken in between by any outgoing connection
/// or port-0 listener of the machine (a CI run saw a host's raft port taken by another
/// test's HTTP server).
fn free_port() -> anyhow::Result<u16> {
    Ok(raft_store::service::free_loopback_addr().context("finding a free port")?.port())
}

/// How the hosts of a [`LocalCluster`] are configured.
#[derive(Debug, Clone)]
pub struct LocalClusterConfig {
    /// Number of hosts with `fake_gpus` GPUs (node ids 1..=hosts).
    pub hosts: usize,
    /// Hosts without GPUs (`gpu.driver = "none"`) after those: gateways that hold no
    /// replica of a kernel with GPUs.
    pub gateway_hosts: usize,
    /// The kernels' Python.
    pub python: PathBuf,
    /// Simulated GPUs per host (0: none).
    pub fake_gpus: u32,
    /// `gpu.idle_release` of the GPU hosts (`None`: the daemon's default).
    pub idle_release: Option<Duration>,
    /// `gpu.subscription_ratio` of the hosts (`None`: the daemon's default).
    pub subscription_ratio: Option<f64>,
    /// Heartbeat lease TTL.
    pub host_ttl: Duration,
    /// `notebookosd` binary.
    pub daemon: PathBuf,
    /// Log filter of the daemons.
    pub log_level: String,
    /// Keep the hosts' directories when the cluster stops.
    pub keep: bool,
    /// More `[kernel]` settings of every host (TOML lines).
    pub kernel_toml: String,
    /// Hosts that form no cluster (no `[cluster]`): each serves its own kernels.
    pub standalone: bool,
}

impl LocalCluster {
    /// Starts the hosts and waits until every host sees every host up and the meta group
    /// has a leader.
    pub fn start(cfg: &LocalClusterConfig) -> anyhow::Result<Self> {
        anyhow::ensure!(cfg.daemon.exists(), "{} does not exist", cfg.daemon.display());
        let dir = tempfile::Builder::new().prefix("nbos-cluster-").tempdir()?;
        let token = hex::encode(rand_bytes()?);
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, format!("{token}\n"))?;
        // Hosts without node certificates call each other with the operator token, never the
        // users' (docs/security.md): the bench's loopback cluster has one of its own.
        let operator_token_file = dir.path().join("operator-token");
        std::fs::write(&operator_token_file, format!("{}\n", hex::encode(rand_bytes()?)))?;
        let objects = dir.path().join("objects");
        std::fs::create_dir_all(&objects)?;
        let python =
            if cfg.python.components().count() > 1 { std::path::absolute(&cfg.python)? } else { cfg.python.clone() };
        let total = cfg.hosts + cfg.gateway_hosts;
        let mut raft_ports = Vec::new();
        let mut http_ports = Vec::new();
        for _ in 0..total {
            raft_ports.push(free_port()?);
            http_ports.push(free_port()?);
        }
        let seeds: Vec<String> =
            raft_ports.iter().enumerate().map(|(i, p)| format!("\"{}=127.0.0.1:{p}\"", i + 1)).collect();
        let mut hosts = Vec::new();
        for i in 0..total {
            let hdir = dir.path().join(format!("h{}", i + 1));
            std::fs::create_dir_all(&hdir)?;
            let mut gpu = "[gpu]\n".to_owned();
            if let Some(r) = cfg.subscription_ratio {
                gpu.push_str(&format!("subscription_ratio = {r:?}\n"));
            }
            if let Some(d) = cfg.idle_release {
                gpu.push_str(&format!("idle_release = \"{}ms\"\n", d.as_millis().max(1)));
            }
            if i >= cfg.hosts {
                // Not "auto": on a machine with real GPUs it would find them.
                gpu.push_str("driver = \"none\"\n");
            } else if cfg.fake_gpus > 0 {
                gpu.push_str(&format!(
                    "driver = \"fake\"\nfake_gpus = {}\n[observer]\nmode = \"procfs\"\n",
                    cfg.fake_gpus
                ));
            }
            let config = format!(
                "[node]\nname = \"h{n}\"\nstate_dir = {state:?}\nruntime_dir = {run:?}\n\
                 [http]\nlisten = \"127.0.0.1:{http}\"\ntoken_file = {token:?}\noperator_token_file = {operator:?}\n\
                 [kernel]\npython = {python:?}\n{kernel}{gpu}\
                 [cluster]\nenabled = {cluster}\nnode_id = {n}\nraft_listen = \"127.0.0.1:{raft}\"\nseeds = [{seeds}]\n\
                 host_ttl = \"{ttl}ms\"\nobject_store = \"file://{objects}\"\n\
                 [log]\nlevel = {level:?}\nformat = \"text\"\n",
                cluster = !cfg.standalone,
                n = i + 1,
                state = hdir.join("state"),
                run = hdir.join("run"),
                http = http_ports[i],
                token = token_file,
                operator = operator_token_file,
                raft = raft_ports[i],
                seeds = seeds.join(", "),
                ttl = cfg.host_ttl.as_millis(),
                objects = objects.display(),
                level = cfg.log_level,
                kernel = cfg.kernel_toml,
            );
            std::fs::write(hdir.join("notebookosd.toml"), config)?;
            hosts.push(LocalHost {
                node_id: u64::try_from(i + 1)?,
                url: format!("http://127.0.0.1:{}", http_ports[i]),
                dir: hdir,
                child: None,
            });
        }
        let mut cluster = Self { hosts, token, token_file, daemon: cfg.daemon.clone(), dir: Some(dir), keep: cfg.keep };
        for i in 0..total {
            cluster.spawn(i)?;
        }
        if cfg.standalone {
            cluster.wait_healthy(Duration::from_secs(60))?;
        } else {
            cluster.wait_ready(Duration::from_secs(60))?;
        }
        Ok(cluster)
    }

    fn spawn(&mut self, i: usize) -> anyhow::Result<()> {
        let h = &mut self.hosts[i];
        let log = std::fs::OpenOptions::new().create(true).append(true).open(h.dir.join("daemon.log"))?;
        // Its own process group: `kill` takes its kernel processes down with it, like a
        // host that loses power.
        let child = Command::new(&self.daemon)
            .process_group(0)
            .arg("--config")
            .arg(h.dir.join("notebookosd.toml"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.daemon.display()))?;
        h.child = Some(child);
        Ok(())
    }

    /// `kill -9` of host `i`'s daemon and every process of its group (its kernels).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.hosts[i].child.take() {
            kill_group(&c);
            let _ = c.wait();
        }
    }

    /// Starts host `i` again with the same state directory and ports.
    pub fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        anyhow::ensure!(self.hosts[i].child.is_none(), "host {} is running", i + 1);
        // The HTTP port may still be in TIME_WAIT; the daemon binds with SO_REUSEADDR (tokio default).
        self.spawn(i)
    }

    /// A gateway client for host `i`.
    pub fn client(&self, i: usize) -> GatewayClient {
        GatewayClient::new(&self.hosts[i].url, Some(self.token.clone()))
    }

    /// `GET path` on host `i` as JSON (`None` when the host does not answer 2xx).
    pub fn get_json(&self, i: usize, path: &str) -> Option<serde_json::Value> {
        let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(10)).build();
        agent
            .get(&format!("{}{path}", self.hosts[i].url))
            .set("Authorization", &format!("token {}", self.token))
            .call()
            .ok()?
            .into_json()
            .ok()
    }

    /// The value of `series` (name and labels, as exposed) on host `i`'s /metrics.
    pub fn metric(&self, i: usize, series: &str) -> Option<f64> {
        let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(10)).build();
        let text = agent.get(&format!("{}/metrics", self.hosts[i].url)).call().ok()?.into_string().ok()?;
        text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// Waits until every host answers `/healthz` (standalone hosts).
    fn wait_healthy(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(5)).build();
        while !self.hosts.iter().all(|h| agent.get(&format!("{}/healthz", h.url)).call().is_ok()) {
            if Instant::now() > deadline {
                let logs: Vec<String> =
                    self.hosts.iter().map(|h| format!("--- h{} ---\n{}", h.node_id, tail(&h.log(), 3000))).collect();
                anyhow::bail!("the hosts did not start within {timeout:?}\n{}", logs.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Waits until every running host reports the cluster ready with every running host up.
    pub fn wait_ready(&self, timeout: Duration) -> anyhow::Result<()> {
        let running: Vec<u64> = self.hosts.iter().filter(|h| h.child.is_some()).map(|h| h.node_id).collect();
        let deadline = Instant::now() + timeout;
        loop {
            let ok = self.hosts.iter().enumerate().filter(|(_, h)| h.child.is_some()).all(|(i, _)| {
                self.get_json(i, "/api/v1/cluster/status").is_some_and(|s| {
                    let ready = s.get("ready").and_then(serde_json::Value::as_bool) == Some(true);
                    let up: Vec<u64> = s
                        .get("members")
                        .and_then(|m| m.as_array())
                        .map(|m| {
                            m.iter()
                                .filter(|x| x.get("up").and_then(serde_json::Value::as_bool) == Some(true))
                                .filter_map(|x| x.get("node_id").and_then(serde_json::Value::as_u64))
                                .collect()
                        })
                        .unwrap_or_default();
                    ready && running.iter().all(|n| up.contains(n))
                })
            });
            if ok {
                return Ok(());
            }
            if Instant::now() > deadline {
                let logs: Vec<String> =
                    self.hosts.iter().map(|h| format!("--- h{} ---\n{}", h.node_id, tail(&h.log(), 3000))).collect();
                anyhow::bail!("the cluster was not ready within {timeout:?}\n{}", logs.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn tail(s: &str, n: usize) -> &str {
    let start = s.len().saturating_sub(n);
    let start = (start..s.len()).find(|&i| s.is_char_boundary(i)).unwrap_or(s.len());
    &s[start..]
}

fn rand_bytes() -> anyhow::Result<[u8; 24]> {
    let mut b = [0u8; 24];
    getrandom::fill(&mut b).map_err(|e| anyhow::anyhow!("random token: {e}"))?;
    Ok(b)
}

/// Runs the benchmark.
pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.cells >= 10, "--cells must be at least 10 for a p99 to mean anything");
    let exe = std::env::current_exe().context("finding nbos")?;
    let cfg = LocalClusterConfig {
        hosts: 3,
        gateway_hosts: 1,
        python: args.python.clone(),
        fake_gpus: args.fake_gpus,
        idle_release: None,
        subscription_ratio: None,
        host_ttl: Duration::from_secs(3),
        daemon: exe.with_file_name("notebookosd"),
        log_level: args.log_level.clone(),
        keep: args.keep_logs,
        kernel_toml: String::new(),
        standalone: false,
    };
    let progress = crate::progress::stages(args.json, "bench election:");
    progress.set_message("starting 3 GPU hosts and a gateway-only host");
    let cluster = LocalCluster::start(&cfg)?;
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

/// Creates a kernel through host 0's gateway.
pub async fn create_kernel(cluster: &LocalCluster, host: usize, gpus: u32) -> anyhow::Result<String> {
    let g = cluster.client(host);
    let model =
        tokio::task::spawn_blocking(move || g.create_kernel(notebookosd::kernel::spec::DEFAULT_SPEC, Some(gpus)))
            .await??;
    Ok(model.id)
}

/// Waits until every host holding a replica of `kernel` reports it applied `revision`.
pub async fn wait_applied(
    cluster: &LocalCluster,
    kernel: &str,
    revision: u64,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut all = true;
        let mut seen = 0;
        for i in 0..cluster.hosts.len() {
            let Some(v) = cluster.get_json(i, "/api/v1/cluster/replicas") else { continue };
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

async fn bench(
    cluster: &LocalCluster,
    args: &Args,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<ElectionBench> {
    progress.set_message("creating the kernel");
    let id = create_kernel(cluster, 0, args.gpus).await?;
    let timeout = Duration::from_secs(120);
    // Local first: with every GPU idle, pre-selection breaks the tie toward host 1's own
    // replica, and keeps that previous executor while it can commit the GPUs. Then remote,
    // through the gateway-only host (the last one): it holds no replica, so each cell
    // crosses to the executor's host.
    progress.set_message(format!("{} cells through host 1's gateway", args.cells));
    let mut client = CellClient::connect(&cluster.client(0), &id).await?;
    let mut l = time_cells(&mut client, cluster.hosts[0].node_id, args).await?;
    let remote = cluster.hosts.len() - 1;
    progress.set_message(format!("{} cells through the gateway-only host", args.cells));
    let mut far = CellClient::connect(&cluster.client(remote), &id).await?;
    let mut r = time_cells(&mut far, cluster.hosts[remote].node_id, args).await?;
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
    let g = cluster.client(0);
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
    cluster: &LocalCluster,
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

#[cfg(test)]
mod tests {
    use super::*;

    // Percentiles are tested with them, in `stats.rs`.
    #[test]
    fn tails_end_on_a_char_boundary() {
        assert_eq!(tail("héllo", 3), "llo");
        assert_eq!(tail("ab", 10), "ab");
    }
}
