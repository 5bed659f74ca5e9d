//! Multi-process cluster harness: real node processes on loopback, mutual TLS, kill -9, restart.

pub use raft_store::linearizability;

use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use raft_store::service::{ClusterClient, NodeServiceConfig, Request, Response};
use raft_store::{GroupStatus, NodeTlsFiles, StoreConfig};

/// Serialises the multi-process tests of one binary: they share two cores.
pub static CLUSTER_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub const TICK: Duration = Duration::from_millis(50);
pub const ELECTION_TICKS: usize = 10;

pub fn election_timeout() -> Duration {
    TICK * ELECTION_TICKS as u32
}

pub fn free_addr() -> SocketAddr {
    raft_store::service::free_loopback_addr().expect("free port")
}

pub struct Node {
    pub id: u64,
    pub raft_addr: SocketAddr,
    pub client_addr: SocketAddr,
    pub config_path: PathBuf,
    pub child: Option<Child>,
}

pub struct Opts {
    pub snapshot_interval: u64,
    pub bootstrap_groups: Vec<u64>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts { snapshot_interval: 10_000, bootstrap_groups: vec![1] }
    }
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub nodes: BTreeMap<u64, Node>,
    opts: Opts,
}

impl Cluster {
    /// Starts nodes 1..=n, all founding voters of the bootstrap groups.
    pub fn start(n: u64, opts: Opts) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let ids: Vec<u64> = (1..=n + 2).collect(); // spare certificates for nodes added later
        raft_store::generate_cluster_pki(&dir.path().join("pki"), &ids).expect("pki");
        let mut c = Cluster { dir, nodes: BTreeMap::new(), opts };
        for id in 1..=n {
            c.nodes.insert(
                id,
                Node { id, raft_addr: free_addr(), client_addr: free_addr(), config_path: PathBuf::new(), child: None },
            );
        }
        let voters: Vec<u64> = (1..=n).collect();
        for id in 1..=n {
            c.write_config(id, &voters, true);
            c.spawn(id);
        }
        c
    }

    fn write_config(&mut self, id: u64, voters: &[u64], bootstrap: bool) {
        let node = &self.nodes[&id];
        let mut store = StoreConfig::new(
            id,
            self.dir.path().join(format!("node-{id}")),
            node.raft_addr,
            NodeTlsFiles::in_dir(&self.dir.path().join("pki"), id).security(),
        );
        store.peers = self.nodes.values().filter(|n| n.id != id).map(|n| (n.id, n.raft_addr)).collect();
        store.tick_interval = TICK;
        store.election_ticks = ELECTION_TICKS;
        store.snapshot_interval = self.opts.snapshot_interval;
        store.request_timeout = Duration::from_secs(3);
        let cfg = NodeServiceConfig {
            store,
            client_listen: node.client_addr,
            bootstrap_groups: if bootstrap { self.opts.bootstrap_groups.clone() } else { Vec::new() },
            bootstrap_voters: voters.to_vec(),
        };
        let path = self.dir.path().join(format!("node-{id}.json"));
        std::fs::write(&path, serde_json::to_vec_pretty(&cfg).expect("json")).expect("write config");
        self.nodes.get_mut(&id).expect("node").config_path = path;
    }

    /// Adds a node that joins later (no bootstrap groups); existing nodes learn its address.
    pub async fn add_node(&mut self, id: u64) {
        self.nodes.insert(
            id,
            Node { id, raft_addr: free_addr(), client_addr: free_addr(), config_path: PathBuf::new(), child: None },
        );
        self.write_config(id, &[], false);
        self.spawn(id);
        let addr = self.nodes[&id].raft_addr;
        let mut client = self.client();
        for other in self.live_ids() {
            if other != id {
                let r = client.call_node(other, &Request::AddPeer { node: id, addr }).await.expect("add peer");
                assert!(r.ok, "add peer: {r:?}");
            }
        }
    }

    /// Starts (or restarts) a node process and waits until it serves.
    pub fn spawn(&mut self, id: u64) {
        let log_path = self.dir.path().join(format!("node-{id}.log"));
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path).expect("node log");
        let node = self.nodes.get_mut(&id).expect("node");
        assert!(node.child.is_none(), "node {id} already running");
        let mut child = Command::new(env!("CARGO_BIN_EXE_raft-store-node"))
            .arg("--config")
            .arg(&node.config_path)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawn node");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.starts_with("READY") {
                    let _ = tx.send(());
                }
            }
        });
        if rx.recv_timeout(Duration::from_secs(20)).is_err() {
            let status = child.try_wait();
            let _ = child.kill();
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            panic!("node {id} did not become ready ({status:?}); its log ends:\n{}", tail.join("\n"));
        }
        node.child = Some(child);
    }

    /// kill -9.
    pub fn kill(&mut self, id: u64) {
        if let Some(mut child) = self.nodes.get_mut(&id).and_then(|n| n.child.take()) {
            child.kill().expect("kill -9");
            child.wait().expect("reap");
        }
    }

    pub fn live_ids(&self) -> Vec<u64> {
        self.nodes.values().filter(|n| n.child.is_some()).map(|n| n.id).collect()
    }

    pub fn client(&self) -> ClusterClient {
        let addrs: HashMap<u64, SocketAddr> = self.nodes.values().map(|n| (n.id, n.client_addr)).collect();
        ClusterClient::new(addrs)
    }

    pub async fn status(&self, node: u64, group: u64) -> Option<GroupStatus> {
        let mut c = self.client();
        c.call_timeout = Duration::from_secs(1);
        let r = c.call_node(node, &Request::Status { group }).await.ok()?;
        if !r.ok {
            return None;
        }
        serde_json::from_value(r.result).ok()
    }

    /// Waits until a live node leads `group` with a term above `min_term`; returns (leader, term).
    pub async fn wait_leader(&self, group: u64, min_term: u64, within: Duration) -> (u64, u64) {
        let deadline = Instant::now() + within;
        loop {
            for id in self.live_ids() {
                if let Some(s) = self.status(id, group).await {
                    if s.role == "leader" && s.term > min_term {
                        return (id, s.term);
                    }
                }
            }
            assert!(Instant::now() < deadline, "no leader of group {group} with term > {min_term} within {within:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until `node` has applied at least `index` of `group`.
    pub async fn wait_applied(&self, node: u64, group: u64, index: u64, within: Duration) -> GroupStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(s) = self.status(node, group).await {
                if s.applied >= index {
                    return s;
                }
            }
            assert!(Instant::now() < deadline, "node {node} did not apply index {index} of group {group} in time");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn metric(&self, node: u64, line_prefix: &str) -> f64 {
        let mut c = self.client();
        let r = c.call_node(node, &Request::Metrics).await.expect("metrics");
        let text = r.result.as_str().unwrap_or_default().to_owned();
        text.lines()
            .filter(|l| l.starts_with(line_prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Keys under `prefix` via a linearizable range at the leader.
    /// `call_leader` already follows `not_leader` answers and skips nodes it cannot reach; any
    /// answer the store itself gives (a `timeout` in particular) fails the test: on a healthy
    /// cluster a linearizable read must be served, not left hanging.
    pub async fn range(&self, group: u64, prefix: &str) -> BTreeMap<String, String> {
        let mut c = self.client();
        let deadline = Instant::now() + Duration::from_secs(20);
        let req = Request::Range { group, prefix: prefix.into(), limit: 0, stale: false };
        match c.call_leader(&req, deadline).await {
            Ok(r) if r.ok => pairs(&r),
            other => panic!("linearizable range of group {group} failed: {other:?}"),
        }
    }

    /// Keys under `prefix` from one node's local state.
    pub async fn range_stale(&self, node: u64, group: u64, prefix: &str) -> BTreeMap<String, String> {
        let mut c = self.client();
        let r = c
            .call_node(node, &Request::Range { group, prefix: prefix.into(), limit: 0, stale: true })
            .await
            .expect("range");
        assert!(r.ok, "stale range on node {node}: {r:?}");
        pairs(&r)
    }
}

pub fn pairs(r: &Response) -> BTreeMap<String, String> {
    assert!(r.ok, "range failed: {r:?}");
    r.result
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|p| Some((p[0].as_str()?.to_owned(), p[1].as_str()?.to_owned())))
        .collect()
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The temporary directory goes away: show what the nodes said.
            for id in self.nodes.keys() {
                let log = std::fs::read_to_string(self.dir.path().join(format!("node-{id}.log"))).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect();
                eprintln!("--- node {id} log (tail) ---\n{}", tail.join("\n"));
            }
        }
        for n in self.nodes.values_mut() {
            if let Some(mut c) = n.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Writers that put unique keys `w/<writer>/<seq>` and remember which puts were acknowledged.
pub struct Writers {
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<Vec<(String, String)>>>,
    pub acked: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Writers {
    pub fn start(cluster: &Cluster, group: u64, n: usize) -> Writers {
        // Keys stay unique across several sets of writers in one test.
        static GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let generation = GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (stop, rx) = tokio::sync::watch::channel(false);
        let acked = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let tasks = (0..n)
            .map(|w| {
                let mut client = cluster.client();
                client.call_timeout = Duration::from_secs(2);
                let rx = rx.clone();
                let acked = acked.clone();
                tokio::spawn(async move {
                    let mut ok = Vec::new();
                    let mut seq = 0u64;
                    while !*rx.borrow() {
                        seq += 1;
                        let key = format!("w/{generation}-{w}/{seq}");
                        let value = format!("v{seq}");
                        let req = Request::Put { group, key: key.clone(), value: value.clone() };
                        if let Ok(r) = client.call_leader(&req, Instant::now() + Duration::from_secs(5)).await {
                            if r.ok {
                                ok.push((key, value));
                                acked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                        }
                    }
                    ok
                })
            })
            .collect();
        Writers { stop, tasks, acked }
    }

    pub fn acked(&self) -> u64 {
        self.acked.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits until `more` further writes were acknowledged.
    pub async fn wait_more(&self, more: u64, within: Duration) {
        let target = self.acked() + more;
        let deadline = Instant::now() + within;
        while self.acked() < target {
            assert!(Instant::now() < deadline, "writes stalled at {} acknowledged", self.acked());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub async fn stop(self) -> Vec<(String, String)> {
        let _ = self.stop.send(true);
        let mut all = Vec::new();
        for t in self.tasks {
            all.extend(t.await.expect("writer"));
        }
        all
    }
}

/// Asserts every acknowledged write is present with its value.
pub fn assert_all_present(acked: &[(String, String)], found: &BTreeMap<String, String>, whose: &str) {
    let missing: Vec<_> = acked.iter().filter(|(k, v)| found.get(k) != Some(v)).take(5).collect();
    assert!(missing.is_empty(), "{whose}: acknowledged writes lost (first few): {missing:?}");
}
