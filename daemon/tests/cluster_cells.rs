//! Multi-host acceptance of issue 7: three `notebookosd` processes on loopback (own state
//! directories, ports, one simulated GPU each) run replicated kernels.
//!
//! - a 10-cell notebook whose cells are elected on different replicas as GPUs come and
//!   go (other kernels' long GPU cells occupy hosts), with every replica's namespace
//!   digest equal after every cell (ints, strings, lists, dicts, a 10 MiB numpy array,
//!   a function, a class, objects mutated in place);
//! - `kill -9` of the executing host (daemon and kernel processes) with a cell in
//!   flight: that cell gets `ExecutorHostDied` (no hang), the next cell runs on a
//!   survivor with the state of cells 1–5, and a `nbos kernel-proxy` client whose
//!   gateway was the dead host reconnects to another host and keeps the kernel;
//! - 200 cells under random host kills (never two down): every cell ran exactly once
//!   (a counter with no gap or duplicate, one election winner per cell).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime};

use nbos_test_support::cell_client::{CellClient, CellRun};
use nbos_test_support::{wait_for, Options, TestCluster, TOKEN};
use notebookosd::jupyter::{wire, Message, Signer};
use notebookosd::kernel::connection::ConnectionInfo;
use notebookosd::link::client::GatewayClient;

fn nbos() -> std::path::PathBuf {
    nbos_test_support::bins::nbos()
}

const CELL_TIMEOUT: Duration = Duration::from_secs(90);
/// How long replicas may take to apply a cell before their digests are compared.
const DIGEST_WAIT: Duration = Duration::from_secs(60);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

fn start_cluster() -> TestCluster {
    // With the cluster's PKI: raft mutual TLS, HTTPS, node certificates between hosts.
    let c = TestCluster::start_tls(3, Options { fake_gpus: 1, host_ttl: Duration::from_secs(1), ..Options::default() });
    c.wait_ready(&[1, 2, 3], Duration::from_secs(60));
    c
}

fn gateway(c: &TestCluster, host: u64) -> GatewayClient {
    let ca = c.dir().join("pki/ca.pem");
    GatewayClient::new(&c.host(host).url, Some(TOKEN.to_owned()))
        .with_tls(notebookosd::link::tls::client_config(&ca, None).expect("tls"))
}

/// Creates a kernel through `host`'s gateway; returns its id once every replica is ready.
fn create_kernel(c: &TestCluster, host: u64, gpus: u32) -> String {
    let (code, model) = c.post(host, "/api/kernels", serde_json::json!({ "name": "python3", "gpus": gpus }));
    assert_eq!(code, 201, "create: {model}\n{}", c.logs());
    let replicas = model["replicas"].as_array().expect("replicas in the model");
    assert_eq!(replicas.len(), 3, "{model}");
    let hosts: BTreeSet<u64> = replicas.iter().filter_map(|r| r["node_id"].as_u64()).collect();
    assert_eq!(hosts.len(), 3, "replicas on three distinct hosts: {model}");
    assert!(replicas.iter().all(|r| r["ready"] == true), "201 only once every replica is ready: {model}");
    model["id"].as_str().expect("id").to_owned()
}

fn status_ok(run: &CellRun) -> bool {
    run.reply.get("status").and_then(|s| s.as_str()) == Some("ok")
}

/// The host that executed a cell, from its reply.
fn executor(run: &CellRun) -> u64 {
    run.reply_metadata["nbos_election"]["node_id"].as_u64().unwrap_or_else(|| panic!("no executor in {run:?}"))
}

fn revision(run: &CellRun) -> u64 {
    run.reply_metadata["nbos_election"]["revision"].as_u64().unwrap_or_else(|| panic!("no revision in {run:?}"))
}

/// The host running `kernel`'s current cell, as the front-end on `front` sees it.
fn current_executor(c: &TestCluster, front: u64, kernel: &str) -> u64 {
    wait_for(Duration::from_secs(60), "the gated cell to start", || {
        let (_, m) = c.get(front, &format!("/api/kernels/{kernel}"));
        m["execution"]["current_executor_node"].as_u64()
    })
}

fn gated(gate: &std::path::Path) -> String {
    format!("import os, time\nwhile not os.path.exists({:?}):\n    time.sleep(0.01)\nprint('released')", gate.display())
}

#[test]
fn ten_cells_move_between_replicas_and_every_replica_keeps_the_same_namespace() {
    let mut c = start_cluster();
    let k1 = create_kernel(&c, 1, 1);
    // Two more kernels whose long GPU cells occupy hosts (one GPU per host).
    let k2 = create_kernel(&c, 2, 1);
    let k3 = create_kernel(&c, 3, 1);
    let gates = kernel_tempdir();
    let cells = [
        "a = 1\ns = 'hello'",
        "l = [1, 2, 3]\nd = {'k': [1, 2], 'n': None}",
        "import numpy as np\narr = np.arange(10 * 1024 * 1024 // 8, dtype=np.float64)",
        "def f(x):\n    return x * 2 + a",
        "class Counter:\n    def __init__(self):\n        self.v = 1\n    def bump(self):\n        self.v += 1\nobj = Counter()",
        "obj.bump()\nl.append(4)",
        "d['k'].append(3)\na += 1",
        "arr[0] = 42.0",
        "s = s + ' world'\nr = f(a)",
        "print(a, s, l, d, float(arr[0]), r, obj.v)",
    ];
    let rt = runtime();
    let mut executors = Vec::new();
    rt.block_on(async {
        let mut client = CellClient::connect(&gateway(&c, 1), &k1).await.expect("connect k1");
        let mut client_host = 1;
        let mut other2 = CellClient::connect(&gateway(&c, 2), &k2).await.expect("connect k2");
        let mut other3 = CellClient::connect(&gateway(&c, 3), &k3).await.expect("connect k3");
        let mut occupied = BTreeSet::new();
        let mut pending = Vec::new();
        let mut stopped = None;
        for (i, code) in cells.iter().enumerate() {
            let n = i + 1;
            if n == 4 {
                // GPUs go: another kernel's long cell takes one host's GPU; if that is not
                // where k1 last ran, a third kernel takes a second host.
                let last = *executors.last().expect("ran");
                let gate = gates.path().join("k2");
                let (id, t) = other2.send(&gated(&gate)).await.expect("send k2");
                let h2 = current_executor(&c, 2, &k2);
                occupied.insert(h2);
                pending.push((2, id, t, gate));
                if h2 != last {
                    let gate = gates.path().join("k3");
                    let (id, t) = other3.send(&gated(&gate)).await.expect("send k3");
                    let h3 = current_executor(&c, 3, &k3);
                    assert_ne!(h3, h2, "one GPU per host: two long cells cannot share a host");
                    occupied.insert(h3);
                    pending.push((3, id, t, gate));
                }
            }
            if n == 7 {
                // GPUs come back.
                for (k, id, t, gate) in pending.drain(..) {
                    std::fs::write(&gate, "go").expect("gate");
                    let run = if k == 2 {
                        other2.wait(&id, t, CELL_TIMEOUT).await
                    } else {
                        other3.wait(&id, t, CELL_TIMEOUT).await
                    };
                    let run = run.expect("long cell ends");
                    assert!(status_ok(&run), "long cell: {run:?}");
                }
                occupied.clear();
                if executors.iter().collect::<BTreeSet<_>>().len() == 1 {
                    // The contention happened to leave k1's host free: take that host's GPU
                    // away by stopping it for one cell.
                    let last = *executors.last().expect("ran");
                    eprintln!("contention left host {last} free; stopping it for cell 7");
                    c.stop(last);
                    c.wait_ready(
                        &[1, 2, 3].into_iter().filter(|h| *h != last).collect::<Vec<_>>(),
                        Duration::from_secs(30),
                    );
                    stopped = Some(last);
                    if last == client_host {
                        // Pre-selection prefers the replica on the client's own gateway host,
                        // so that is often the one stopped: the client moves to another
                        // gateway, as `nbos kernel-proxy --gateway a,b,c` would.
                        client_host = if last == 1 { 2 } else { 1 };
                        client = CellClient::connect(&gateway(&c, client_host), &k1).await.expect("reconnect k1");
                    }
                }
            }
            if n == 8 {
                if let Some(h) = stopped.take() {
                    c.restart(h);
                    c.wait_ready(&[1, 2, 3], Duration::from_secs(60));
                    wait_for(Duration::from_secs(60), "the restarted host's replica to be ready", || {
                        let (_, m) = c.get(1, &format!("/api/kernels/{k1}"));
                        m["replicas"].as_array()?.iter().all(|r| r["ready"] == true).then_some(())
                    });
                }
            }
            let run = client.run(code, CELL_TIMEOUT).await.expect("cell");
            assert!(status_ok(&run), "cell {n} failed: {run:?}\n{}", c.logs());
            let ex = executor(&run);
            assert!(!occupied.contains(&ex), "cell {n} ran on host {ex}, whose GPU another kernel's cell holds");
            executors.push(ex);
            let digests = c.digests_after(&k1, revision(&run), DIGEST_WAIT);
            let distinct: BTreeSet<&String> = digests.values().collect();
            assert_eq!(distinct.len(), 1, "after cell {n} the replicas differ: {digests:?}");
            assert!(digests.len() >= 2, "cell {n}: digests from {digests:?}");
            if n == 6 {
                // What a platform engineer scrapes, summed over the hosts (no host restarted
                // yet): 6 cells exported, the 10 MiB array in the object store, every cell
                // applied by two followers with their kernels.
                let sums = sync_metric_sums(&c);
                let sum = |name: &str| sums.get(name).copied().unwrap_or_else(|| panic!("{name} missing in {sums:?}"));
                assert!(sum("notebookos_sync_cells_exported_total") >= 6.0, "{sums:?}");
                assert!(sum("notebookos_sync_export_seconds_count") >= 6.0, "{sums:?}");
                assert!(sum("notebookos_sync_bytes_total{path=\"object_store\"}") >= (10 << 20) as f64, "{sums:?}");
                assert!(sum("notebookos_sync_cells_applied_total{mode=\"kernel\"}") >= 12.0, "{sums:?}");
            }
            if n == 10 {
                assert_eq!(
                    run.stdout.trim(),
                    "2 hello world [1, 2, 3, 4] {'k': [1, 2, 3], 'n': None} 42.0 6 2",
                    "the last cell sees every earlier cell's state"
                );
            }
        }
    });
    let distinct: BTreeSet<u64> = executors.iter().copied().collect();
    assert!(distinct.len() >= 2, "cells were elected on one host only: {executors:?}");
    eprintln!("executors of the 10 cells: {executors:?}");
    // The print-only last cell: both followers kept only its count (a restarted host's
    // counters start again, so this is checked after cell 10 and the rest after cell 6).
    let sums = sync_metric_sums(&c);
    assert!(
        sums.get("notebookos_sync_cells_applied_total{mode=\"count_only\"}").copied().unwrap_or(0.0) >= 2.0,
        "{sums:?}"
    );
}

/// `notebookos_sync_*` samples summed over the three hosts' `/metrics`.
fn sync_metric_sums(c: &TestCluster) -> BTreeMap<String, f64> {
    let mut sums: BTreeMap<String, f64> = BTreeMap::new();
    for h in 1..=3 {
        let text =
            c.agent().get(&format!("{}/metrics", c.host(h).url)).call().expect("metrics").into_string().expect("text");
        for line in text.lines().filter(|l| l.starts_with("notebookos_sync_")) {
            if let Some((name, v)) = line.rsplit_once(' ') {
                *sums.entry(name.to_owned()).or_default() += v.parse::<f64>().unwrap_or(0.0);
            }
        }
    }
    sums
}

/// A Jupyter client of `nbos kernel-proxy` over ZMQ (shell + iopub), as nbclient would be.
struct ProxyClient {
    child: std::process::Child,
    signer: Signer,
    shell: zeromq::DealerSocket,
    iopub: zeromq::SubSocket,
    _dir: tempfile::TempDir,
}

impl Drop for ProxyClient {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ProxyClient {
    async fn start(kernel: &str, gateways: &[String], token_file: &std::path::Path) -> Self {
        use zeromq::Socket;
        let dir = tempfile::tempdir().expect("tmp");
        let conn = ConnectionInfo::new_loopback("python3").expect("ports");
        let file = dir.path().join("kernel.json");
        conn.write(&file).expect("connection file");
        let log = std::fs::File::create(dir.path().join("proxy.log")).expect("log");
        let child = std::process::Command::new(nbos())
            .args(["kernel-proxy", "-f"])
            .arg(&file)
            .args(["--kernel-id", kernel, "--gateway", &gateways.join(","), "--token-file"])
            .arg(token_file)
            // The hosts serve HTTPS: the proxy trusts the cluster CA (the harness's pki/, next to the token).
            .env("NBOS_CA_CERT", std::path::Path::new(token_file).with_file_name("pki").join("ca.pem"))
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn kernel-proxy");
        let mut shell = zeromq::DealerSocket::new();
        let mut iopub = zeromq::SubSocket::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        // The proxy binds once it is up.
        loop {
            if shell.connect(&conn.endpoint(conn.shell_port)).await.is_ok() {
                break;
            }
            assert!(Instant::now() < deadline, "kernel-proxy did not bind");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        iopub.connect(&conn.endpoint(conn.iopub_port)).await.expect("iopub");
        iopub.subscribe("").await.expect("subscribe");
        Self { child, signer: Signer::new(conn.key.as_bytes()), shell, iopub, _dir: dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("proxy.log")).unwrap_or_default()
    }

    async fn send(&mut self, code: &str) -> String {
        let content = serde_json::json!({ "code": code, "silent": false, "store_history": true });
        self.request("execute_request", &content).await
    }

    async fn request(&mut self, msg_type: &str, content: &serde_json::Value) -> String {
        use zeromq::SocketSend;
        let msg =
            Message::new(msg_type, "proxy-test", &uuid::Uuid::new_v4().to_string(), SystemTime::now(), None, content);
        let id = msg.header().expect("header").msg_id;
        let frames = wire::serialize(&[], &msg, &self.signer);
        self.shell.send(zeromq::ZmqMessage::try_from(frames).expect("frames")).await.expect("send");
        id
    }

    /// `kernel_info_request` → the reply's content (what every Jupyter client sends first).
    async fn kernel_info(&mut self, timeout: Duration) -> serde_json::Value {
        use zeromq::SocketRecv;
        let id = self.request("kernel_info_request", &serde_json::json!({})).await;
        let wait = async {
            loop {
                let m = self.shell.recv().await.expect("shell");
                let (_, msg) = wire::parse(m.into_vec(), &self.signer).expect("signed reply");
                if parent(&msg) == id {
                    return msg.content_json().expect("content");
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.unwrap_or_else(|_| panic!("no kernel_info_reply\n{}", self.log()))
    }

    /// Runs a cell; (reply content, stdout). Output that misses the subscription (slow
    /// joiner) only shows as a missing stdout, never as a hang.
    async fn run(&mut self, code: &str, timeout: Duration) -> (serde_json::Value, String) {
        use zeromq::SocketRecv;
        let id = self.send(code).await;
        let deadline = tokio::time::Instant::now() + timeout;
        let (mut reply, mut idle, mut out) = (None, false, String::new());
        while reply.is_none() || !idle {
            tokio::select! {
                m = self.shell.recv() => {
                    let (_, msg) = wire::parse(m.expect("shell").into_vec(), &self.signer).expect("signed reply");
                    if parent(&msg) == id {
                        reply = Some(msg.content_json().expect("content"));
                    }
                }
                m = self.iopub.recv() => {
                    let (_, msg) = wire::parse(m.expect("iopub").into_vec(), &self.signer).expect("signed iopub");
                    if parent(&msg) != id { continue }
                    let c = msg.content_json().expect("content");
                    match msg.header().expect("h").msg_type.as_str() {
                        "stream" => out.push_str(c["text"].as_str().unwrap_or_default()),
                        "status" => idle |= c["execution_state"] == "idle",
                        _ => {}
                    }
                }
                () = tokio::time::sleep_until(deadline) => panic!("cell {code:?} through the proxy: no reply in {timeout:?}\n{}", self.log()),
            }
        }
        (reply.unwrap_or_default(), out)
    }
}

fn parent(msg: &Message) -> String {
    let v: serde_json::Value = serde_json::from_slice(&msg.parent_header).unwrap_or_default();
    v["msg_id"].as_str().unwrap_or_default().to_owned()
}

#[test]
fn killing_the_executing_host_fails_over_with_state_and_no_hang() {
    let mut c = start_cluster();
    let k = create_kernel(&c, 1, 1);
    let rt = runtime();
    rt.block_on(async {
        let mut client = CellClient::connect(&gateway(&c, 1), &k).await.expect("connect");
        let mut last = 0;
        for n in 1..=5 {
            let run = client.run(&format!("x{n} = {n}\nprint('cell', {n})"), CELL_TIMEOUT).await.expect("cell");
            assert!(status_ok(&run), "cell {n}: {run:?}");
            last = executor(&run);
            c.digests_after(&k, revision(&run), DIGEST_WAIT);
        }
        let dead = last;
        let survivors: Vec<u64> = [1, 2, 3].into_iter().filter(|h| *h != dead).collect();
        // A client on a surviving gateway and a kernel-proxy client whose gateway is the
        // executing host (then the survivors).
        let mut watcher = CellClient::connect(&gateway(&c, survivors[0]), &k).await.expect("connect survivor");
        let urls: Vec<String> =
            std::iter::once(dead).chain(survivors.iter().copied()).map(|h| c.host(h).url.clone()).collect();
        let mut proxy = ProxyClient::start(&k, &urls, &c.dir().join("token")).await;
        // Clients ask kernel_info first, while the gateway's front-end is still opening.
        let info = proxy.kernel_info(CELL_TIMEOUT).await;
        assert_eq!(info["status"], "ok", "{info}");
        assert_eq!(info["language_info"]["name"], "python", "{info}");
        // Slow joiner: wait until the proxy's IOPub reaches us.
        wait_ready_output(&mut proxy).await;

        // A cell in flight on the executing host when it dies.
        let gate = c.dir().join("never");
        let (inflight, t) = watcher.send(&gated(&gate)).await.expect("send");
        assert_eq!(current_executor(&c, survivors[0], &k), dead, "the previous executor takes the cell");
        assert!(!c.kernel_pids(dead).is_empty(), "no kernel processes found for host {dead}");
        c.kill(dead);
        let run = watcher.wait(&inflight, t, Duration::from_secs(30)).await.expect("the in-flight cell is answered");
        assert_eq!(run.reply["status"], "error", "{run:?}");
        assert_eq!(run.reply["ename"], "ExecutorHostDied", "{run:?}");
        assert!(run.reply["evalue"].as_str().unwrap_or_default().contains(&format!("node {dead}")), "{run:?}");

        // Cell 6 runs on a survivor with all state from cells 1-5.
        let run = watcher.run("print(x1 + x2 + x3 + x4 + x5)", CELL_TIMEOUT).await.expect("cell 6");
        // The dead daemon's kernels (their own process groups) do not run on as orphans.
        let deadline = Instant::now() + Duration::from_secs(15);
        while !c.kernel_pids(dead).is_empty() {
            assert!(Instant::now() < deadline, "orphaned kernels of host {dead}: {:?}", c.kernel_pids(dead));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(status_ok(&run), "cell 6: {run:?}\n{}", c.logs());
        assert_eq!(run.stdout.trim(), "15");
        assert!(survivors.contains(&executor(&run)), "cell 6 ran on {}", executor(&run));
        let digests = c.digests_after(&k, revision(&run), DIGEST_WAIT);
        assert_eq!(digests.values().collect::<BTreeSet<_>>().len(), 1, "{digests:?}");

        // The survivor's front-end counted both.
        let metrics = c
            .agent()
            .get(&format!("{}/metrics", c.host(survivors[0]).url))
            .call()
            .expect("metrics")
            .into_string()
            .expect("text");
        let value = |name: &str| {
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or_else(|| panic!("{name} missing"))
        };
        assert!(value("notebookos_cells_executor_died_total") >= 1.0);
        assert!(value("notebookos_cells_failed_over_total") >= 1.0);

        // The proxy's gateway died: it reconnects to a survivor on its own (besides the
        // watcher, a second client appears there) and keeps the kernel.
        wait_for(Duration::from_secs(60), "the proxy to reconnect to a survivor", || {
            let clients: u64 = survivors
                .iter()
                .map(|h| c.get(*h, &format!("/api/kernels/{k}")).1["connections"].as_u64().unwrap_or(0))
                .sum();
            (clients >= 2).then_some(())
        });
        let (reply, out) = proxy.run("x6 = x5 + 1\nprint(x6)", CELL_TIMEOUT).await;
        assert_eq!(reply["status"], "ok", "{reply}\n{}", proxy.log());
        assert_eq!(out.trim(), "6");
        assert!(proxy.log().contains("reconnected"), "{}", proxy.log());
        let (code, model) = c.get(survivors[1], &format!("/api/kernels/{k}"));
        assert_eq!(code, 200, "the kernel is still there: {model}");
    });
}

/// Runs `print('ready')` through the proxy until its output is seen (the SUB socket is
/// subscribed), with a deadline.
async fn wait_ready_output(proxy: &mut ProxyClient) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (reply, out) = proxy.run("print('ready')", CELL_TIMEOUT).await;
        assert_eq!(reply["status"], "ok", "{reply}\n{}", proxy.log());
        if out.trim() == "ready" {
            return;
        }
        assert!(Instant::now() < deadline, "no IOPub through the proxy\n{}", proxy.log());
    }
}

#[test]
fn two_hundred_cells_under_random_host_kills_run_exactly_once_each() {
    let mut c = start_cluster();
    let k = create_kernel(&c, 1, 1);
    let rt = runtime();
    // A deterministic "random" kill schedule: (after cell, host).
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut seen: Vec<(u64, u64)> = Vec::new(); // (counter, executor)
    let mut cell_ids = Vec::new();
    rt.block_on(async {
        let mut front = 1;
        let mut client = CellClient::connect(&gateway(&c, front), &k).await.expect("connect");
        let run = client.run("counter = 0", CELL_TIMEOUT).await.expect("init");
        assert!(status_ok(&run), "{run:?}");
        let mut last = executor(&run);
        let mut down: Option<(u64, usize)> = None;
        for n in 1..=200usize {
            if let Some((h, since)) = down {
                if n >= since + 5 {
                    c.restart(h);
                    c.wait_ready(&[1, 2, 3], Duration::from_secs(60));
                    wait_for(Duration::from_secs(60), "the restarted replica to be ready", || {
                        let (_, m) = c.get(front, &format!("/api/kernels/{k}"));
                        m["replicas"].as_array()?.iter().all(|r| r["ready"] == true).then_some(())
                    });
                    down = None;
                }
            } else if n % 25 == 0 {
                // Every other kill takes the executing host; the others a random host.
                let victim = if n % 50 == 25 { last } else { 1 + next() % 3 };
                c.kill(victim);
                down = Some((victim, n));
                if victim == front {
                    // This client's gateway died with it: reconnect to a live host.
                    front = [1, 2, 3].into_iter().find(|h| *h != victim).expect("a live host");
                    client = CellClient::connect(&gateway(&c, front), &k).await.expect("reconnect");
                }
            }
            let (id, t) = client
                .send("counter += 1\nimport os\nprint(counter, os.environ.get('NBOS_REPLICA'))")
                .await
                .expect("send");
            let run = client.wait(&id, t, CELL_TIMEOUT).await.expect("cell");
            assert!(status_ok(&run), "cell {n}: {run:?}\n{}", c.logs());
            let counter: u64 = run
                .stdout
                .split_whitespace()
                .next()
                .and_then(|w| w.parse().ok())
                .unwrap_or_else(|| panic!("cell {n} printed {:?}", run.stdout));
            last = executor(&run);
            seen.push((counter, last));
            cell_ids.push(id);
        }
    });
    let counters: Vec<u64> = seen.iter().map(|(n, _)| *n).collect();
    assert_eq!(counters, (1..=200).collect::<Vec<u64>>(), "every cell ran exactly once, in order");
    let executors: BTreeSet<u64> = seen.iter().map(|(_, e)| *e).collect();
    assert!(executors.len() >= 2, "the kills moved execution: {executors:?}");
    // The kernel's election record: one committed winner for every cell sent.
    let host = [1, 2, 3].into_iter().find(|h| c.host(*h).running()).expect("a running host");
    let (code, v) = c.get(host, &format!("/api/v1/cluster/kernels/{k}/elections"));
    assert_eq!(code, 200, "{v}");
    let winners: BTreeMap<String, u64> = v["cells"]
        .as_array()
        .expect("cells")
        .iter()
        .filter(|r| !r["record"]["winner"].is_null())
        .map(|r| (r["cell"].as_str().expect("cell").to_owned(), r["record"]["winner"].as_u64().expect("winner")))
        .collect();
    for id in &cell_ids {
        assert!(winners.contains_key(id), "cell {id} has no committed winner");
    }
}

/// The fault campaign's lost update (tests/chaos/FINDINGS.md #2): two clients send cells of
/// one kernel at the same time through two gateways. Each front-end elected its own cells on
/// a different replica; they ran side by side from the same namespace and the later commit
/// dropped the earlier cells' changes (44 of 60 appends left). Now the kernel's lock makes
/// them take turns: every acknowledged append is in the namespace exactly once, each
/// client's in its order, and the replicas agree.
#[test]
fn two_gateways_sending_cells_at_once_lose_no_acknowledged_cell() {
    const CELLS: usize = 20;
    let c = start_cluster();
    let kernel = create_kernel(&c, 1, 0);
    let rt = runtime();
    rt.block_on(async {
        let mut setup = CellClient::connect(&gateway(&c, 1), &kernel).await.expect("connect");
        assert!(status_ok(&setup.run("log = []", CELL_TIMEOUT).await.expect("cell")));
        let client = |host: u64| {
            let (gw, kernel) = (gateway(&c, host), kernel.clone());
            async move {
                let mut client = CellClient::connect(&gw, &kernel).await.expect("connect");
                let mut acked = Vec::new();
                for i in 0..CELLS {
                    let run = client.run(&format!("log.append('g{host}-{i}')"), CELL_TIMEOUT).await.expect("cell");
                    assert!(status_ok(&run), "gateway {host} cell {i}: {run:?}");
                    acked.push((format!("g{host}-{i}"), executor(&run)));
                }
                acked
            }
        };
        let (one, two) = tokio::join!(client(1), client(2));
        let executors: BTreeSet<u64> = one.iter().chain(&two).map(|(_, e)| *e).collect();
        eprintln!("executors of the 2 x {CELLS} cells: {executors:?}");
        let run = setup.run("import json\nprint(json.dumps(log))", CELL_TIMEOUT).await.expect("cell");
        assert!(status_ok(&run), "{run:?}");
        let log: Vec<String> = serde_json::from_str(run.stdout.trim()).expect("the log as JSON");
        assert_eq!(log.len(), 2 * CELLS, "every acknowledged append, none lost or doubled: {log:?}\n{}", c.logs());
        for (host, acked) in [(1, &one), (2, &two)] {
            let mine: Vec<&String> = log.iter().filter(|e| e.starts_with(&format!("g{host}-"))).collect();
            let sent: Vec<&String> = acked.iter().map(|(e, _)| e).collect();
            assert_eq!(mine, sent, "gateway {host}'s cells in their order");
        }
        let digests = c.digests_after(&kernel, revision(&run), DIGEST_WAIT);
        let distinct: BTreeSet<&String> = digests.values().collect();
        assert_eq!(distinct.len(), 1, "every replica has the same namespace: {digests:?}");
    });
}

/// The fault campaign's `kill_restart` (tests/chaos/FINDINGS.md #1): `kill -9` of a host's
/// daemon outside systemd left its kernel processes running (each is its own process group),
/// holding their memory (and GPUs) next to the replicas the restarted daemon starts. The
/// restarted daemon now kills what its predecessor left in its kernels directory.
#[test]
fn a_killed_hosts_kernels_are_killed_when_its_daemon_starts_again() {
    let mut c = start_cluster();
    let _kernel = create_kernel(&c, 1, 0);
    let before = c.kernel_pids(3);
    assert!(!before.is_empty(), "host 3 runs a replica's kernel");
    c.kill(3);
    // Running, not a zombie waiting for its new parent to reap it.
    let alive = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().chars().next()))
            .is_some_and(|state| state != Some('Z'))
    };
    assert!(before.iter().any(|&p| alive(p)), "the daemon's group kill leaves its kernels (each its own group)");
    // What ends them by itself about a second later: in a PID namespace of its own, the
    // daemon's child that watches the namespace (the kernel's grandparent); otherwise
    // ipykernel's parent poller (`parent_handle`). Stopped, it leaves them for the new
    // daemon to find however long its start takes (a restart slower than the poller made
    // this test flaky under CI load).
    let watchers: Vec<i32> = before.iter().map(|&p| namespace_watcher(p).unwrap_or(p)).collect();
    for &w in &watchers {
        // SAFETY: kill(2) with SIGSTOP on a process this test saw its host start.
        unsafe { libc::kill(w, libc::SIGSTOP) };
    }
    c.restart(3);
    wait_for(Duration::from_secs(20), "the killed daemon's kernels to be gone", || {
        before.iter().all(|&p| !alive(p)).then_some(())
    });
    wait_for(Duration::from_secs(10), "the new daemon to say it killed them", || {
        c.host(3).log().contains("killed kernel processes a previous daemon of this host left running").then_some(())
    });
    for &w in &watchers {
        // SAFETY: as above; a watcher let go finds its namespace ended and exits.
        unsafe { libc::kill(w, libc::SIGCONT) };
    }
}

/// The parent's parent of kernel process `pid` when the kernel is in a PID namespace of
/// its own (`NSpid` names two pids): the daemon's child that ends the namespace once the
/// daemon is gone (sys/pid_namespace.rs).
fn namespace_watcher(pid: i32) -> Option<i32> {
    let field = |pid: i32, name: &str| -> Option<String> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim().to_owned())
    };
    (field(pid, "NSpid:")?.split_whitespace().count() > 1).then_some(())?;
    let init: i32 = field(pid, "PPid:")?.parse().ok()?;
    field(init, "PPid:")?.parse().ok()
}

#[test]
fn cells_wait_for_gpus_and_say_so_interrupts_reach_the_executor_and_bad_requests_are_refused() {
    let mut c = start_cluster();
    // Bad input, in cluster mode, through any host.
    let (code, v) = c.post(2, "/api/kernels", serde_json::json!({ "name": "no-such-spec" }));
    assert_eq!(code, 404, "{v}");
    assert!(v["message"].as_str().unwrap_or_default().contains("no-such-spec"), "{v}");
    let (code, v) = c.post(2, "/api/kernels", serde_json::json!({ "name": "python3", "gpus": 1000 }));
    assert_eq!(code, 400, "{v}");
    let (code, v) = c.get(3, "/api/kernels/00000000-0000-4000-8000-000000000000");
    assert_eq!(code, 404, "{v}");
    let (code, v) = c.delete(3, "/api/kernels/00000000-0000-4000-8000-000000000000");
    assert_eq!(code, 404, "{v}");

    let k1 = create_kernel(&c, 1, 1);
    let k2 = create_kernel(&c, 2, 1);
    let k3 = create_kernel(&c, 3, 1);
    // One GPU per host, ratio 3: a fourth GPU kernel cannot be placed, and says why.
    let (code, v) = c.post(1, "/api/kernels", serde_json::json!({ "name": "python3", "gpus": 1 }));
    assert_eq!(code, 409, "{v}");
    assert!(v["message"].as_str().unwrap_or_default().contains("cannot place"), "{v}");
    // Every host lists every kernel with its replicas.
    for h in 1..=3 {
        let (code, list) = c.get(h, "/api/kernels");
        assert_eq!(code, 200);
        let ids: BTreeSet<&str> = list.as_array().expect("list").iter().filter_map(|m| m["id"].as_str()).collect();
        assert_eq!(ids, [k1.as_str(), k2.as_str(), k3.as_str()].into_iter().collect(), "host {h}: {list}");
    }
    // The internal replica socket takes a host's node certificate: the users' token is refused.
    let (code, _) = {
        let r = c
            .agent()
            .get(&format!("{}/api/kernels/{k1}/channels?replica=local", c.host(1).url))
            .set("Authorization", &format!("token {TOKEN}"))
            .set("Connection", "Upgrade")
            .set("Upgrade", "websocket")
            .set("Sec-WebSocket-Version", "13")
            .set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
            .call();
        match r {
            Ok(r) => (r.status(), ()),
            Err(ureq::Error::Status(code, _)) => (code, ()),
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(code, 403);

    let gates = kernel_tempdir();
    let rt = runtime();
    rt.block_on(async {
        // Hosts fill up: k2 and k3 hold two GPUs, k1's first client holds the third.
        let mut b = CellClient::connect(&gateway(&c, 2), &k2).await.expect("k2");
        let mut d = CellClient::connect(&gateway(&c, 3), &k3).await.expect("k3");
        let mut x = CellClient::connect(&gateway(&c, 1), &k1).await.expect("k1 on host 1");
        let mut y = CellClient::connect(&gateway(&c, 2), &k1).await.expect("k1 on host 2");
        let mut held = Vec::new();
        for (client, front, kernel, name) in [(&mut b, 2, &k2, "b"), (&mut d, 3, &k3, "d"), (&mut x, 1, &k1, "x")] {
            let gate = gates.path().join(name);
            let (id, t) = client.send(&gated(&gate)).await.expect("send");
            current_executor(&c, front, kernel);
            held.push((id, t, gate));
        }
        // A second client of k1, through another gateway: no host can commit a GPU now.
        let (waiting, t) = y.send("print('finally')").await.expect("send");
        let stderr = wait_for_stderr(&mut y, &waiting, "waiting for 1 GPU").await;
        assert!(stderr.contains("GPU"), "{stderr}");
        // Interrupt through a host that is not the executor's: k1's long cell stops.
        let interrupted = SystemTime::now();
        let (code, v) = c.post(3, &format!("/api/kernels/{k1}/interrupt"), serde_json::json!({}));
        assert_eq!(code, 204, "{v}");
        let (id, sent, _) = held.pop().expect("x");
        let run = x.wait(&id, sent, CELL_TIMEOUT).await.expect("interrupted cell answers");
        assert_eq!(run.reply["status"], "error", "{run:?}");
        assert_eq!(run.reply["ename"], "KeyboardInterrupt", "{run:?}");
        // A GPU comes back: the waiting cell runs.
        let (id, sent, gate) = held.pop().expect("d");
        std::fs::write(&gate, "go").expect("gate");
        d.wait(&id, sent, CELL_TIMEOUT).await.expect("k3 cell ends");
        let run = y.wait(&waiting, t, CELL_TIMEOUT).await.expect("the waiting cell runs");
        assert!(status_ok(&run), "{run:?}");
        assert_eq!(run.stdout.trim(), "finally");
        // It reached its kernel once a GPU was free again, after binding committed it there.
        let stamp = |k: &str| run.reply_metadata["nbos_election"][k].as_u64().unwrap_or_else(|| panic!("{k}: {run:?}"));
        let since = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64);
        assert!(stamp("gpus_bound_unix_us") >= since(interrupted), "{run:?}");
        assert!(stamp("dispatched_unix_us") >= stamp("gpus_bound_unix_us"), "{run:?}");
        let (id, sent, gate) = held.pop().expect("b");
        std::fs::write(&gate, "go").expect("gate");
        b.wait(&id, sent, CELL_TIMEOUT).await.expect("k2 cell ends");
    });
    // Every host's model shows the replicas and the same last executor; the metrics
    // count the rounds.
    let mut roles = BTreeSet::new();
    for h in 1..=3 {
        let (code, m) = c.get(h, &format!("/api/kernels/{k1}"));
        assert_eq!(code, 200, "{m}");
        let replicas = m["replicas"].as_array().expect("replicas");
        assert_eq!(replicas.len(), 3, "{m}");
        let executors: Vec<u64> =
            replicas.iter().filter(|r| r["role"] == "executor").filter_map(|r| r["node_id"].as_u64()).collect();
        assert_eq!(executors.len(), 1, "host {h}: {m}");
        roles.insert(executors[0]);
    }
    assert_eq!(roles.len(), 1, "the hosts disagree on the executor: {roles:?}");
    let metrics =
        c.agent().get(&format!("{}/metrics", c.host(2).url)).call().expect("metrics").into_string().expect("text");
    let rounds = metrics
        .lines()
        .find_map(|l| l.strip_prefix("notebookos_election_rounds_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .expect("notebookos_election_rounds_total");
    assert!(rounds >= 2.0, "the waiting cell took more than one round: {rounds}");
    assert!(metrics.contains("notebookos_election_latency_seconds_count"), "{metrics}");
    // A name from before the restart, synchronised to every replica.
    rt.block_on(async {
        let mut b = CellClient::connect(&gateway(&c, 2), &k2).await.expect("k2 before restart");
        let run = b.run("before_restart = 41", CELL_TIMEOUT).await.expect("cell before restart");
        assert!(status_ok(&run), "{run:?}");
        c.digests_after(&k2, revision(&run), DIGEST_WAIT);
    });
    // Restart through any host restarts every replica (fresh processes), the kernel group
    // forgets the old namespace, and the kernel keeps serving cells.
    let pids_before: Vec<serde_json::Value> =
        (1..=3).map(|h| c.get(h, &format!("/api/kernels/{k2}?replica=local")).1["pids"].clone()).collect();
    let (code, v) = c.post(1, &format!("/api/kernels/{k2}/restart"), serde_json::json!({}));
    assert_eq!(code, 200, "{v}");
    for (h, before) in (1..=3).zip(&pids_before) {
        let (_, m) = c.get(h, &format!("/api/kernels/{k2}?replica=local"));
        assert_ne!(&m["pids"], before, "host {h}'s replica was not restarted: {m}");
    }
    rt.block_on(async {
        let mut b = CellClient::connect(&gateway(&c, 2), &k2).await.expect("k2 after restart");
        let run = b.run("print('before_restart' in globals(), 1 + 1)", CELL_TIMEOUT).await.expect("cell after restart");
        assert!(status_ok(&run), "{run:?}");
        assert_eq!(run.stdout.trim(), "False 2");
    });
    // A replica that catches up from the group afterwards (its host restarted, a fresh
    // replica) does not bring the pre-restart name back: every replica has the same namespace.
    c.stop(3);
    c.restart(3);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(60));
    wait_for(Duration::from_secs(60), "host 3's new replica of k2 to be ready", || {
        let (_, m) = c.get(1, &format!("/api/kernels/{k2}"));
        m["replicas"].as_array()?.iter().all(|r| r["ready"] == true).then_some(())
    });
    rt.block_on(async {
        let mut b = CellClient::connect(&gateway(&c, 2), &k2).await.expect("k2 after host 3 came back");
        let run = b.run("after_restart = 'x'", CELL_TIMEOUT).await.expect("cell after host 3 came back");
        assert!(status_ok(&run), "{run:?}");
        let digests = c.digests_after(&k2, revision(&run), DIGEST_WAIT);
        assert_eq!(digests.len(), 3, "{digests:?}");
        assert_eq!(digests.values().collect::<BTreeSet<_>>().len(), 1, "pre-restart names came back: {digests:?}");
    });
    // Delete through the meta store, from any host: gone everywhere.
    let (code, v) = c.delete(3, &format!("/api/kernels/{k1}"));
    assert_eq!(code, 204, "{v}");
    for h in 1..=3 {
        wait_for(Duration::from_secs(30), "the deleted kernel to vanish", || {
            (c.get(h, &format!("/api/kernels/{k1}")).0 == 404).then_some(())
        });
    }
}

/// Reads `id`'s messages until a stderr stream containing `needle` arrives; returns it.
async fn wait_for_stderr(client: &mut CellClient, id: &str, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = client.next_stderr(id, Duration::from_secs(30)).await.expect("stderr");
        if text.contains(needle) {
            return text;
        }
        assert!(Instant::now() < deadline, "no {needle:?} on stderr");
    }
}

#[test]
fn bench_election_prints_one_json_object_with_the_promised_keys() {
    let python = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    let out = std::process::Command::new(nbos())
        .args(["bench", "election", "--json", "--cells", "10", "--warmup", "1", "--small-objects", "200"])
        .args(["--large-mib", "2", "--python"])
        .arg(&python)
        .output()
        .expect("run nbos bench election");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one JSON object: {stdout}");
    let v: serde_json::Value = serde_json::from_str(lines[0]).expect("json");
    for key in [
        "election_p50_ms",
        "election_p99_ms",
        "election_remote_p50_ms",
        "election_remote_p99_ms",
        "first_output_p50_ms",
        "first_output_remote_p50_ms",
        "sync_small_mib_s",
        "sync_large_mib_s",
    ] {
        let x = v[key].as_f64().unwrap_or_else(|| panic!("{key} missing in {v}"));
        assert!(x.is_finite() && x > 0.0, "{key} = {x}");
    }
    assert!(v["election_p99_ms"].as_f64() >= v["election_p50_ms"].as_f64(), "{v}");
    // The election ends when the cell is handed to the kernel, before its first output.
    assert!(v["first_output_p50_ms"].as_f64() > v["election_p50_ms"].as_f64(), "{v}");
    assert!(v["first_output_remote_p50_ms"].as_f64() > v["election_remote_p50_ms"].as_f64(), "{v}");
    assert_eq!(v["hosts"], 4, "three GPU hosts and a gateway-only one: {v}");
    assert_eq!(v["sync_large_bytes"], 2 * 1024 * 1024, "{v}");
    let bad = std::process::Command::new(nbos())
        .args(["bench", "election", "--json", "--cells", "3"])
        .output()
        .expect("run nbos bench election");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--cells must be at least 10"));
}

/// A temporary directory a root daemon's kernels can pass through (0711: enter, not
/// list): they run as another uid (kernel.user) and refuse to start under a 0700 one.
#[allow(dead_code)]
fn kernel_tempdir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).expect("chmod 0711");
    dir
}
