//! `nbos bench raft`: a 3-node raft-store cluster on loopback (separate processes, fsync on, mutual
//! TLS), measured for commit latency, throughput, failover and idle-group memory; optionally etcd
//! side by side under the same load.
//!
//! The node processes are this same binary run with the hidden `--serve-node <config.json>`.
//!
//! Like with like: both stores get the same number of clients, each with its own connection and
//! one write outstanding, sending to the group's leader only (`"policy": "leader"`). Ours speak the
//! node service's JSON lines over TCP and follow leader hints; etcd's speak its native gRPC API
//! (the `etcd-client` crate, `"etcd_client": "grpc"`) to the member that `Status` names leader.
//! [`load`] is the clients' load loops and what they measure, [`etcd`] starts and loads
//! etcd; this file, our nodes.

mod etcd;
mod load;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use self::etcd::{etcd_leader, etcd_load, start_etcd};
use self::load::{drive, free_addr, Phase};
use raft_store::service::{ClusterClient, NodeServiceConfig, Request};
use raft_store::{GroupStatus, NodeTlsFiles, StoreConfig};
use serde_json::json;

/// Options of `nbos bench raft`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Cluster size (node processes on loopback).
    #[arg(long, default_value_t = 3)]
    pub nodes: u64,
    /// Measuring time, split evenly between the sequential and the concurrent phase.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Concurrent clients in the throughput phase.
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
    /// Idle groups created for the memory measurement.
    #[arg(long, default_value_t = 1000)]
    pub idle_groups: u64,
    /// Also run etcd (Debian package `etcd-server`) under the same load and print the ratios.
    #[arg(long)]
    pub etcd: bool,
    /// The etcd binary.
    #[arg(long, default_value = "/usr/bin/etcd")]
    pub etcd_bin: PathBuf,
    /// Value size in bytes.
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// Ticks of inactivity before a group hibernates (0 = never; shows what hibernation saves).
    #[arg(long, default_value_t = 30)]
    pub hibernate_after_ticks: u32,
    /// Internal: run as one node of the benchmark cluster with this configuration.
    #[arg(long, hide = true)]
    pub serve_node: Option<PathBuf>,
}

const GROUP: u64 = 1;
/// The idle groups' ids start here.
const IDLE_FIRST: u64 = 1000;
/// How the etcd clients reach etcd (its default, plaintext; ours use mutual TLS).
const ETCD_TRANSPORT: &str = "plaintext gRPC (HTTP/2) over loopback TCP, one connection per client";

/// Runs the benchmark (or, with `--serve-node`, one node of it).
pub fn run(args: Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    if let Some(path) = &args.serve_node {
        notebookosd::logging::init(&notebookosd::config::LogConfig {
            level: "warn,raft=error".to_owned(),
            ..notebookosd::config::LogConfig::default()
        });
        let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        let cfg: NodeServiceConfig =
            serde_json::from_str(&text).with_context(|| format!("parse node configuration {}", path.display()))?;
        return rt.block_on(raft_store::service::run_node(cfg));
    }
    if args.nodes < 1 || args.clients < 1 {
        bail!("--nodes and --clients must be at least 1");
    }
    // Checked first: a comparison that was asked for must not quietly turn into none.
    if args.etcd && !args.etcd_bin.is_file() {
        bail!(
            "--etcd: {} not found; install etcd with `apt-get install etcd-server` (Debian/Ubuntu; \
             scripts/install-deps.sh does) or pass --etcd-bin",
            args.etcd_bin.display()
        );
    }
    let report = rt.block_on(bench(&args))?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}

struct Cluster {
    dir: PathBuf,
    nodes: Vec<(u64, SocketAddr, PathBuf, Option<Child>)>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, _, _, child) in &mut self.nodes {
            if let Some(mut c) = child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

impl Cluster {
    fn start(dir: &Path, n: u64, hibernate_after_ticks: u32) -> anyhow::Result<Cluster> {
        let ids: Vec<u64> = (1..=n).collect();
        let pki = dir.join("pki");
        raft_store::generate_cluster_pki(&pki, &ids)?;
        let raft_addrs: HashMap<u64, SocketAddr> =
            ids.iter().map(|i| Ok((*i, free_addr()?))).collect::<anyhow::Result<_>>()?;
        let mut cluster = Cluster { dir: dir.to_path_buf(), nodes: Vec::new() };
        for id in &ids {
            let mut store = StoreConfig::new(
                *id,
                dir.join(format!("node-{id}")),
                raft_addrs[id],
                NodeTlsFiles::in_dir(&pki, *id).security(),
            );
            store.hibernate_after_ticks = hibernate_after_ticks;
            store.peers = raft_addrs.iter().filter(|(k, _)| *k != id).map(|(k, v)| (*k, *v)).collect();
            let client = free_addr()?;
            let cfg = NodeServiceConfig {
                store,
                client_listen: client,
                bootstrap_groups: vec![GROUP],
                bootstrap_voters: ids.clone(),
            };
            let path = dir.join(format!("node-{id}.json"));
            std::fs::write(&path, serde_json::to_vec_pretty(&cfg)?)?;
            cluster.nodes.push((*id, client, path, None));
        }
        for i in 0..cluster.nodes.len() {
            cluster.spawn(i)?;
        }
        Ok(cluster)
    }

    fn spawn(&mut self, i: usize) -> anyhow::Result<()> {
        let exe = std::env::current_exe().context("locate nbos")?;
        let (id, client, path, _) = &self.nodes[i];
        let log = std::fs::File::create(self.dir.join(format!("node-{id}.log")))?;
        let mut child = Command::new(exe)
            .args(["bench", "raft", "--serve-node"])
            .arg(path)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("start a node process")?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(client).is_err() {
            if let Some(status) = child.try_wait()? {
                bail!("node {id} exited with {status}; see {}", self.dir.join(format!("node-{id}.log")).display());
            }
            if Instant::now() > deadline {
                bail!("node {id} did not start in 20 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.nodes[i].3 = Some(child);
        Ok(())
    }

    fn client(&self) -> ClusterClient {
        ClusterClient::new(self.nodes.iter().map(|(id, addr, _, _)| (*id, *addr)).collect())
    }

    fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].3.as_ref().map(Child::id)
    }

    async fn status(&self, client: &mut ClusterClient, id: u64, group: u64) -> Option<GroupStatus> {
        let r = client.call_node(id, &Request::Status { group }).await.ok()?;
        serde_json::from_value(r.result).ok()
    }

    async fn leader(&self, within: Duration) -> anyhow::Result<u64> {
        let mut client = self.client();
        client.call_timeout = Duration::from_millis(500);
        let deadline = Instant::now() + within;
        loop {
            for (id, _, _, child) in &self.nodes {
                if child.is_some() && self.status(&mut client, *id, GROUP).await.is_some_and(|s| s.role == "leader") {
                    return Ok(*id);
                }
            }
            if Instant::now() > deadline {
                bail!("no leader within {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn raft_load(
    cluster: &Cluster,
    clients: usize,
    time: Duration,
    value: &str,
) -> impl std::future::Future<Output = Phase> {
    let addrs: HashMap<u64, SocketAddr> = cluster.nodes.iter().map(|(id, a, _, _)| (*id, *a)).collect();
    let value = value.to_owned();
    drive(clients, move |c| {
        let mut client = ClusterClient::new(addrs.clone());
        let value = value.clone();
        async move {
            let mut lat = Vec::new();
            let end = Instant::now() + time;
            let mut i = 0u64;
            while Instant::now() < end {
                i += 1;
                let req = Request::Put { group: GROUP, key: format!("bench/{c}/{i}"), value: value.clone() };
                let t = Instant::now();
                if let Ok(r) = client.call_leader(&req, end + Duration::from_secs(5)).await {
                    if r.ok {
                        lat.push(t.elapsed().as_secs_f64() * 1e3);
                    }
                }
            }
            lat
        }
    })
}

/// `kill -9` of group 1's leader → the first write acknowledged on group 1 (busy until then),
/// ms; and, at the same time, → a new leader of an idle group the killed node also led
/// (hibernating when hibernation is on), ms, `None` when it led none of the first 64.
async fn measure_failover(cluster: &mut Cluster, idle_groups: u64) -> anyhow::Result<(f64, Option<f64>)> {
    let leader = cluster.leader(Duration::from_secs(20)).await?;
    let mut client = cluster.client();
    client.call_timeout = Duration::from_millis(300);
    let put = |group: u64, i: u64| Request::Put { group, key: format!("failover/{i}"), value: "x".into() };
    let r = client.call_leader(&put(GROUP, 0), Instant::now() + Duration::from_secs(10)).await?;
    if !r.ok {
        bail!("write before failover failed: {r:?}");
    }
    // An idle group led by the node about to die (read without waking it: a status request).
    let mut idle = None;
    for g in IDLE_FIRST..IDLE_FIRST + idle_groups.min(64) {
        if cluster.status(&mut client, leader, g).await.is_some_and(|s| s.role == "leader") {
            idle = Some(g);
            break;
        }
    }
    let idx = cluster.nodes.iter().position(|n| n.0 == leader).context("leader index")?;
    let killed = Instant::now();
    if let Some(mut c) = cluster.nodes[idx].3.take() {
        c.kill()?;
        c.wait()?;
    }
    let shared: &Cluster = cluster;
    let first_write = |group: u64| {
        let mut client = shared.client();
        client.call_timeout = Duration::from_millis(300);
        async move {
            let mut i = 0;
            loop {
                i += 1;
                if let Ok(r) = client.call_leader(&put(group, i), Instant::now() + Duration::from_millis(300)).await {
                    if r.ok {
                        return Ok(killed.elapsed().as_secs_f64() * 1e3);
                    }
                }
                if killed.elapsed() > Duration::from_secs(30) {
                    bail!("no write on group {group} succeeded within 30 s of killing the leader");
                }
            }
        }
    };
    // The idle group is only watched (status requests do not wake a group): its followers must
    // notice the silence themselves, as after a host's death with no cell running.
    let survivors: Vec<u64> = shared.nodes.iter().filter(|n| n.3.is_some()).map(|n| n.0).collect();
    let new_leader = |group: u64| {
        let mut client = shared.client();
        client.call_timeout = Duration::from_millis(300);
        let survivors = survivors.clone();
        async move {
            loop {
                for id in &survivors {
                    if shared.status(&mut client, *id, group).await.is_some_and(|s| s.role == "leader") {
                        return Ok(killed.elapsed().as_secs_f64() * 1e3);
                    }
                }
                if killed.elapsed() > Duration::from_secs(30) {
                    bail!("idle group {group} elected no leader within 30 s of killing its leader");
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    let (busy, idle) = tokio::join!(first_write(GROUP), async {
        match idle {
            Some(g) => new_leader(g).await.map(Some),
            None => Ok(None),
        }
    });
    let (busy, idle) = (busy?, idle?);
    cluster.spawn(idx)?;
    Ok((busy, idle))
}

fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

async fn metric(client: &mut ClusterClient, id: u64, name: &str) -> f64 {
    let Ok(r) = client.call_node(id, &Request::Metrics).await else { return 0.0 };
    r.result
        .as_str()
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Creates `n` idle 3-replica groups on every node and measures RSS once they hibernate.
async fn measure_idle_groups(cluster: &Cluster, n: u64, hibernate: bool) -> anyhow::Result<IdleGroups> {
    let baseline = (0..cluster.nodes.len()).filter_map(|i| cluster.pid(i).and_then(rss_mib)).fold(0.0, f64::max);
    let voters: Vec<u64> = cluster.nodes.iter().map(|n| n.0).collect();
    let mut creates = Vec::new();
    for (id, _, _, _) in &cluster.nodes {
        let mut client = cluster.client();
        client.call_timeout = Duration::from_secs(300);
        let req = Request::CreateGroups { first: IDLE_FIRST, count: n, voters: voters.clone() };
        let id = *id;
        creates.push(tokio::spawn(async move { client.call_node(id, &req).await }));
    }
    for c in creates {
        let r = c.await?.context("create idle groups")?;
        if !r.ok {
            bail!("create idle groups: {r:?}");
        }
    }
    let mut client = cluster.client();
    let deadline = Instant::now() + Duration::from_secs(120);
    if !hibernate {
        // Without hibernation there is no state to wait for: give the elections time to settle.
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let mut hibernated = false;
    while hibernate && Instant::now() < deadline {
        let mut all = true;
        for (id, _, _, _) in &cluster.nodes {
            if metric(&mut client, *id, "notebookos_raft_groups_hibernating").await < n as f64 {
                all = false;
            }
        }
        if all {
            hibernated = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let rss = (0..cluster.nodes.len()).filter_map(|i| cluster.pid(i).and_then(rss_mib)).fold(0.0, f64::max);
    // CPU of an idle node: what hibernation saves.
    let pids: Vec<u32> = (0..cluster.nodes.len()).filter_map(|i| cluster.pid(i)).collect();
    let before: Vec<Option<f64>> = pids.iter().map(|p| cpu_seconds(*p)).collect();
    let t = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let elapsed = t.elapsed().as_secs_f64();
    let idle_cpu = pids
        .iter()
        .zip(before)
        .filter_map(|(p, b)| Some((cpu_seconds(*p)? - b?) / elapsed * 100.0))
        .fold(0.0, f64::max);
    Ok(IdleGroups { rss, baseline, hibernated, idle_cpu })
}

struct IdleGroups {
    rss: f64,
    baseline: f64,
    hibernated: bool,
    idle_cpu: f64,
}

/// User + system CPU seconds of a process.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions and only reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| ticks / hz as f64)
}

fn round(x: Option<f64>) -> serde_json::Value {
    x.map_or(serde_json::Value::Null, |v| json!((v * 1000.0).round() / 1000.0))
}

async fn bench(args: &Args) -> anyhow::Result<serde_json::Value> {
    let tmp = tempfile::tempdir()?;
    let half = args.duration / 2;
    let value = "x".repeat(args.value_bytes);
    let progress = crate::progress::stages(args.json, "bench raft:");
    progress.set_message(format!("starting {} nodes", args.nodes));
    let mut cluster = Cluster::start(tmp.path(), args.nodes, args.hibernate_after_ticks)?;
    cluster.leader(Duration::from_secs(30)).await?;
    // Memory first, on fresh processes: 1,000 idle groups, not the keys the load phases write.
    progress.set_message(format!("{} idle groups", args.idle_groups));
    let idle = measure_idle_groups(&cluster, args.idle_groups, args.hibernate_after_ticks > 0).await?;
    progress.set_message("one client");
    raft_load(&cluster, 1, Duration::from_millis(500), &value).await; // warm-up
    let mut seq = raft_load(&cluster, 1, half, &value).await;
    progress.set_message(format!("{} clients", args.clients));
    let mut conc = raft_load(&cluster, args.clients, half, &value).await;
    progress.set_message("leader failover");
    let (failover_ms, failover_idle_ms) = if args.nodes >= 3 {
        let (busy, idle) = measure_failover(&mut cluster, args.idle_groups).await?;
        (Some(busy), idle)
    } else {
        (None, None)
    };
    drop(cluster);

    let mut etcd_seq = None;
    let mut etcd_conc = None;
    if args.etcd {
        progress.set_message("the same load on etcd");
        let etcd = start_etcd(&args.etcd_bin, tmp.path(), args.nodes)?;
        let leader = etcd_leader(&etcd, tmp.path()).await?;
        etcd_load(&leader, 1, Duration::from_millis(500), &value).await?; // warm-up
        etcd_seq = Some(etcd_load(&leader, 1, half, &value).await?);
        etcd_conc = Some(etcd_load(&leader, args.clients, half, &value).await?);
    }
    progress.finish_and_clear();
    let etcd_tp = etcd_conc.as_ref().map(Phase::throughput);
    let etcd_seq_tp = etcd_seq.as_ref().map(Phase::throughput);
    Ok(json!({
        "nodes": args.nodes,
        "clients": args.clients,
        "duration_s": args.duration.as_secs_f64(),
        "value_bytes": args.value_bytes,
        "fsync": true,
        "transport": "mutual TLS over loopback TCP",
        "policy": "leader",
        "client": "JSON lines over TCP, one connection per client",
        "etcd_client": args.etcd.then_some("grpc"),
        "etcd_transport": args.etcd.then_some(ETCD_TRANSPORT),
        "commit_p50_ms": round(seq.p(0.50)),
        "commit_p99_ms": round(seq.p(0.99)),
        "commit_p999_ms": round(seq.p(0.999)),
        "sequential_ops": round(Some(seq.throughput())),
        "throughput_ops": round(Some(conc.throughput())),
        "concurrent_p50_ms": round(conc.p(0.50)),
        "concurrent_p99_ms": round(conc.p(0.99)),
        "etcd_throughput_ops": round(etcd_tp),
        "etcd_sequential_ops": round(etcd_seq_tp),
        "etcd_commit_p50_ms": round(etcd_seq.as_mut().and_then(|p| p.p(0.50))),
        "etcd_commit_p99_ms": round(etcd_seq.as_mut().and_then(|p| p.p(0.99))),
        "throughput_ratio_vs_etcd": round(etcd_tp.filter(|t| *t > 0.0).map(|t| conc.throughput() / t)),
        "sequential_ratio_vs_etcd": round(etcd_seq_tp.filter(|t| *t > 0.0).map(|t| seq.throughput() / t)),
        "failover_ms": round(failover_ms),
        "failover_idle_group_ms": round(failover_idle_ms),
        "rss_1000_groups_mib": round(Some(idle.rss)),
        "rss_baseline_mib": round(Some(idle.baseline)),
        "idle_groups": args.idle_groups,
        "idle_groups_all_hibernating": idle.hibernated,
        "idle_cpu_percent": round(Some(idle.idle_cpu)),
        "hibernate_after_ticks": args.hibernate_after_ticks,
    }))
}

fn print_table(r: &serde_json::Value) {
    let f = |k: &str| r.get(k).map_or("-".to_owned(), |v| if v.is_null() { "-".to_owned() } else { v.to_string() });
    println!("raft-store, {} nodes on loopback (fsync on, {})", f("nodes"), r["transport"].as_str().unwrap_or(""));
    println!(
        "  commit latency (1 client)  p50 {} ms  p99 {} ms  p99.9 {} ms",
        f("commit_p50_ms"),
        f("commit_p99_ms"),
        f("commit_p999_ms")
    );
    println!("  throughput      1 client   {} ops/s", f("sequential_ops"));
    println!(
        "  throughput {:>3} clients    {} ops/s (p50 {} ms, p99 {} ms)",
        f("clients"),
        f("throughput_ops"),
        f("concurrent_p50_ms"),
        f("concurrent_p99_ms")
    );
    println!("  leader failover            {} ms", f("failover_ms"));
    println!(
        "  the same, idle group       {} ms (hibernating: {})",
        f("failover_idle_group_ms"),
        f("idle_groups_all_hibernating")
    );
    println!(
        "  RSS with {} idle groups  {} MiB (before: {} MiB; all hibernating: {})",
        f("idle_groups"),
        f("rss_1000_groups_mib"),
        f("rss_baseline_mib"),
        f("idle_groups_all_hibernating")
    );
    println!("  idle node CPU with them    {} %", f("idle_cpu_percent"));
    println!("  clients write to the leader only ({})", r["client"].as_str().unwrap_or(""));
    if !r["etcd_throughput_ops"].is_null() {
        println!("etcd, same load and policy ({})", r["etcd_transport"].as_str().unwrap_or(""));
        println!("  commit latency (1 client)  p50 {} ms  p99 {} ms", f("etcd_commit_p50_ms"), f("etcd_commit_p99_ms"));
        println!(
            "  throughput      1 client   {} ops/s  (ratio raft-store/etcd {})",
            f("etcd_sequential_ops"),
            f("sequential_ratio_vs_etcd")
        );
        println!(
            "  throughput {:>3} clients    {} ops/s  (ratio raft-store/etcd {})",
            f("clients"),
            f("etcd_throughput_ops"),
            f("throughput_ratio_vs_etcd")
        );
    }
}
