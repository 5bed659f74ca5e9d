//! Cluster membership (issue 7) with real daemon processes on loopback: three hosts form a
//! cluster, a `kill -9`ed host is seen down and comes back with its durable log, a fourth
//! host joins with `nbos cluster join`, placement refuses with too few hosts, the replicas
//! of a dead host are re-placed, and `nbos cluster leave` moves replicas or refuses.

#[allow(dead_code, reason = "the kernel-group tests' store harness; this file uses part of it")]
#[path = "common/group_store.rs"]
mod group_store;

use std::process::Command;
use std::time::{Duration, Instant};

use nbos_test_support::{wait_for, Options, TestCluster};
use serde_json::{json, Value};

fn nbos() -> std::path::PathBuf {
    nbos_test_support::bins::nbos()
}
const NOTEBOOKOSD: &str = env!("CARGO_BIN_EXE_notebookosd");

/// Node ids of a kernel record's replicas, sorted.
fn replica_nodes(record: &Value) -> Vec<u64> {
    let mut v: Vec<u64> = record["replicas"]
        .as_array()
        .map(|r| r.iter().filter_map(|r| r["node_id"].as_u64()).collect())
        .unwrap_or_default();
    v.sort_unstable();
    v
}

/// `nbos kernels --json` replica rows of one kernel, as seen through host `via`.
fn replica_rows(c: &TestCluster, via: u64, kernel: &str) -> Vec<Value> {
    let (ok, out, _) = c.nbos(via, &["kernels", "--json"]);
    if !ok {
        return Vec::new();
    }
    let v: Value = serde_json::from_str(&out).unwrap_or_default();
    v["replicas"]
        .as_array()
        .map(|rows| rows.iter().filter(|r| r["kernel_id"] == kernel).cloned().collect())
        .unwrap_or_default()
}

#[test]
fn hosts_form_a_cluster_fail_rejoin_join_and_leave() {
    let ttl = Duration::from_secs(1);
    let mut c = TestCluster::start(3, Options::default());

    // Three seeds elect a meta leader and register; every host sees all three up.
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30));
    let (ok, out, err) = c.nbos(2, &["cluster", "status", "--json"]);
    assert!(ok, "nbos cluster status failed: {err}");
    let s: Value = serde_json::from_str(&out).expect("status JSON");
    let members = s["members"].as_array().expect("members");
    assert_eq!(members.len(), 3, "{s}");
    for m in members {
        assert_eq!(m["role"], "voter", "{m}");
        assert_eq!(m["up"], true, "{m}");
        assert_eq!(m["host"]["gpus"].as_array().map(Vec::len), Some(1), "each host has its simulated GPU: {m}");
        assert_eq!(m["load"]["gpus_total"], 1, "{m}");
    }
    let (ok, table, _) = c.nbos(1, &["cluster", "status"]);
    assert!(ok && table.contains("3 of 3 host(s) up"), "{table}");

    // kill -9 host 3: the others see it down within a few TTLs (lease expiry on the leader;
    // when host 3 led the meta group, an election first, and the new leader restarts the TTL).
    // The deadlines are generous for a loaded 2-core CI machine; the time taken is printed.
    c.kill(3);
    let killed = Instant::now();
    wait_for(ttl * 10, "hosts 1 and 2 to see host 3 down", || {
        (c.up_seen_by(1) == [1, 2] && c.up_seen_by(2) == [1, 2]).then_some(())
    });
    eprintln!("host 3 seen down {:?} after kill -9 (host_ttl {ttl:?})", killed.elapsed());
    let (ok, table, _) = c.nbos(1, &["cluster", "status"]);
    assert!(ok && table.contains("2 of 3 host(s) up") && table.contains("DOWN"), "{table}");

    // A kernel id that is not a UUID (it would become a directory on every host) is refused.
    for bad in ["..", "../../etc", "K1"] {
        let (code, body) =
            c.post_as_operator(1, "/api/v1/cluster/kernels", json!({ "id": bad, "name": "python3", "gpus": 0 }));
        assert_eq!(code, 400, "{bad}: {body}");
        assert!(body["message"].as_str().unwrap_or_default().contains("UUID"), "{body}");
    }

    // Placement needs three live hosts: refused, naming what is up.
    let (code, body) = c.post_as_operator(1, "/api/v1/cluster/kernels", json!({ "name": "python3", "gpus": 0 }));
    assert_eq!(code, 409, "{body}");
    let msg = body["message"].as_str().unwrap_or_default();
    assert!(msg.contains("needs 3 replicas") && msg.contains("only 2 host(s) are up"), "{msg}");

    // Restart host 3 on the same state dir: it recovers the meta group from its log (no
    // second bootstrap) and is up again.
    c.restart(3);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30));
    let log = c.host(3).log();
    assert!(log.contains("meta group recovered from the durable log"), "{log}");
    assert!(!log.contains("meta group created"), "host 3 bootstrapped the meta group again:\n{log}");

    // A fourth host outside the seeds is not a member until it joins through any member.
    let four = c.add_host();
    let s4 = c.status(four).expect("host 4 status");
    assert_eq!(s4["registered"], false, "{s4}");
    let (ok, out, err) = c.nbos(four, &["cluster", "join", &c.host(2).url.clone()]);
    assert!(ok, "join failed: {out}{err}");
    c.wait_ready(&[1, 2, 3, 4], Duration::from_secs(30));
    let s1 = c.status(1).expect("status");
    let m4 = s1["members"].as_array().and_then(|m| m.iter().find(|m| m["node_id"] == 4)).cloned();
    assert_eq!(m4.as_ref().map(|m| m["role"].clone()), Some(json!("voter")), "{s1}");
    // Joining again is harmless.
    let (ok, out, _) = c.nbos(four, &["cluster", "join", &c.host(1).url.clone()]);
    assert!(ok && out.contains("already a member"), "{out}");

    // Placement: 3 distinct hosts, the least subscribed (all empty: lowest ids), through a
    // follower (forwarded to the meta leader).
    let leader = s1["meta_leader"].as_u64().expect("leader");
    let via = (1..=4).find(|&id| id != leader).expect("a follower");
    let (code, kernel) = c.post_as_operator(via, "/api/v1/cluster/kernels", json!({ "name": "python3", "gpus": 1 }));
    assert_eq!(code, 201, "{kernel}");
    assert_eq!(replica_nodes(&kernel), vec![1, 2, 3], "{kernel}");
    let id = kernel["id"].as_str().expect("id").to_owned();
    // `nbos kernels` shows its replicas: host, role and lag once each host runs its replica.
    let rows = wait_for(Duration::from_secs(90), "nbos kernels to show the three replicas running", || {
        let rows = replica_rows(&c, 1, &id);
        let running = rows.len() == 3 && rows.iter().all(|r| r["role"] == "follower" && r["lag"] == 0);
        running.then_some(rows)
    });
    let hosts: Vec<&str> = rows.iter().filter_map(|r| r["host"].as_str()).collect();
    assert_eq!(hosts, vec!["host1", "host2", "host3"], "{rows:?}");
    let (ok, table, _) = c.nbos(2, &["kernels"]);
    assert!(ok && table.lines().filter(|l| l.contains(&id) && l.contains("follower")).count() == 3, "{table}");
    // The next kernel goes to the least subscribed hosts: 4 first.
    let (code, second) = c.post_as_operator(1, "/api/v1/cluster/kernels", json!({ "name": "python3", "gpus": 1 }));
    assert_eq!(code, 201, "{second}");
    assert!(replica_nodes(&second).contains(&4), "{second}");
    let (code, _) = c.delete(1, &format!("/api/v1/cluster/kernels/{}", second["id"].as_str().unwrap_or_default()));
    assert_eq!(code, 200);

    // Host 3 dies for good: after its lease lapses and another TTL, the meta leader moves
    // its replica to host 4, the only live host not holding the kernel.
    c.kill(3);
    let record = wait_for(ttl * 20, "the replica of host 3 to be re-placed", || {
        let (code, r) = c.get(1, &format!("/api/v1/cluster/kernels/{id}"));
        (code == 200 && replica_nodes(&r) == [1, 2, 4]).then_some(r)
    });
    let rows = wait_for(Duration::from_secs(90), "the replacement replica on host 4 to run", || {
        let rows = replica_rows(&c, 1, &id);
        rows.iter().any(|r| r["node_id"] == 4 && r["role"] == "follower").then_some(rows)
    });
    assert!(!rows.iter().any(|r| r["node_id"] == 3), "{rows:?}");
    let numbers: Vec<u64> =
        record["replicas"].as_array().expect("replicas").iter().filter_map(|r| r["replica"].as_u64()).collect();
    assert!(numbers.contains(&4), "the new replica gets a new number: {record}");

    // Host 4 cannot leave now: both other live hosts already hold the kernel. Nothing changes.
    let (ok, out, err) = c.nbos(four, &["cluster", "leave"]);
    assert!(!ok, "leave should be refused: {out}");
    assert!(err.contains("cannot leave") && err.contains(&id) && err.contains("nothing was changed"), "{err}");
    assert!(c.up_seen_by(1).contains(&4));
    // Leaving is the operator's: the users' token is refused (and nothing changes).
    let (code, body) = c.post(four, "/api/v1/cluster/leave", json!({ "phase": "remove" }));
    assert_eq!(code, 403, "{body}");
    let (code, body) = c.post_as_operator(four, "/api/v1/cluster/leave", json!({ "phase": "remove" }));
    assert_eq!(code, 409, "a host holding a replica is not removed: {body}");
    assert!(body["message"].as_str().unwrap_or_default().contains("still holds a replica"), "{body}");

    // With a fifth host up, host 4 leaves: its replica moves to host 5, and only once that
    // replica is ready does host 4 leave the meta group. (A fresh host: giving the replica back
    // to host 3, which hosted it before, is a kernel-group concern — node id reuse.)
    let five = c.add_host();
    let (ok, out, err) = c.nbos(five, &["cluster", "join", &c.host(1).url.clone()]);
    assert!(ok, "join failed: {out}{err}");
    c.wait_ready(&[1, 2, 4, 5], Duration::from_secs(30));
    let (ok, out, err) = c.nbos(four, &["cluster", "leave"]);
    assert!(ok, "leave failed: {out}{err}");
    assert!(out.contains(&format!("kernel {id}: replica moved to host {five}")), "{out}");
    let (_, r) = c.get(1, &format!("/api/v1/cluster/kernels/{id}"));
    assert_eq!(replica_nodes(&r), vec![1, 2, five], "{r}");
    let (_, ready) = c.get(1, &format!("/api/v1/cluster/kernels/{id}/ready"));
    assert!(
        ready.as_array().is_some_and(|r| r.contains(&json!(five))),
        "left before the new replica was ready: {ready}"
    );
    wait_for(ttl * 10, "host 4 to be gone from the cluster", || {
        let s = c.status(1)?;
        let gone = !s["members"].as_array()?.iter().any(|m| m["node_id"] == 4);
        gone.then_some(())
    });

    // A dead host (its disk full, say) is removed through another with `nbos cluster
    // remove`, the operator's: without the operator token it is refused and nothing changes.
    c.kill(3);
    let users_only = std::process::Command::new(nbos())
        .args(["--url", &c.host(1).url])
        .env("NBOS_TOKEN", c.token())
        .env_remove("NBOS_OPERATOR_TOKEN")
        .args(c.layout_ca_args())
        .args(["cluster", "remove", "3"])
        .output()
        .expect("run nbos");
    let err = String::from_utf8_lossy(&users_only.stderr);
    assert!(!users_only.status.success() && err.contains("operator token"), "{err}");
    let member_ids = || -> Vec<u64> {
        let s = c.status(1).expect("cluster status");
        s["members"].as_array().expect("members").iter().filter_map(|m| m["node_id"].as_u64()).collect()
    };
    assert!(member_ids().contains(&3));
    let (ok, out, err) = c.nbos(1, &["cluster", "remove", "3"]);
    assert!(ok, "remove failed: {out}{err}");
    assert!(out.contains("host 3 removed from the cluster"), "{out}");
    assert!(!member_ids().contains(&3), "{:?}", member_ids());
}

#[test]
fn a_host_without_a_quorum_serves_and_says_not_ready() {
    let mut c = TestCluster::create(3, Options { fake_gpus: 0, ..Options::default() });
    c.restart(1);
    // Up and serving, but the meta group has no leader: not ready, not registered.
    let (code, _) = c.get(1, "/healthz");
    assert_eq!(code, 200);
    let s = c.status(1).expect("status");
    assert_eq!((s["ready"].clone(), s["registered"].clone()), (json!(false), json!(false)), "{s}");
    let (ok, table, _) = c.nbos(1, &["cluster", "status"]);
    assert!(ok && table.contains("meta leader none (not ready)"), "{table}");
    let (code, body) = c.post_as_operator(1, "/api/v1/cluster/kernels", json!({ "name": "python3" }));
    assert_eq!(code, 503, "{body}");
    // A second seed makes a quorum of the three.
    c.restart(2);
    c.wait_ready(&[1, 2], Duration::from_secs(30));
}

#[test]
fn hosts_form_a_cluster_over_mutual_tls() {
    let c = TestCluster::start_tls(3, Options { fake_gpus: 0, ..Options::default() });
    c.wait_ready(&[1, 2, 3], Duration::from_secs(30));
    let log = c.host(1).log();
    assert!(!log.contains("PLAINTEXT"), "the raft transport must use the configured TLS:\n{log}");
    let (code, k) = c.post_as_operator(2, "/api/v1/cluster/kernels", json!({ "name": "python3", "gpus": 0 }));
    assert_eq!(code, 201, "{k}");
    assert_eq!(replica_nodes(&k), vec![1, 2, 3], "{k}");
}

/// Fault campaign (`cluster_restart`, `kill_restart`, a full disk's fail-stop): a daemon killed
/// during a namespace export or apply leaves its scratch directory, a cell's payloads, under
/// `state_dir/sync`; the 100-round run's hosts filled their state disks with them and raft
/// log. The next start removes them, and only them.
#[test]
fn kill_restart_removes_the_sync_scratch_directories_the_killed_daemon_left() {
    let mut c = TestCluster::start(1, Options { fake_gpus: 0, ..Options::default() });
    c.wait_ready(&[1], Duration::from_secs(30));
    c.kill(1);
    let sync = c.host(1).dir.join("state/sync");
    for d in ["export-Ab3dEf", "apply-Gh5jKl"] {
        std::fs::create_dir_all(sync.join(d)).expect("scratch dir");
        std::fs::write(sync.join(d).join("payloads.pack"), vec![7u8; 1 << 20]).expect("pack");
        std::fs::write(sync.join(d).join("manifest.json"), b"{}").expect("manifest");
    }
    std::fs::write(sync.join("operator-notes"), b"not the daemon's").expect("other file");
    c.restart(1);
    c.wait_ready(&[1], Duration::from_secs(30));
    let mut left: Vec<String> = std::fs::read_dir(&sync)
        .expect("sync dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["operator-notes"], "{}", c.host(1).log());
    assert!(c.host(1).log().contains("removed the namespace sync scratch directories a previous run left"));
}

#[test]
fn single_host_commands_say_the_cluster_is_off_and_bad_cluster_config_names_the_key() {
    let dir = tempfile::tempdir().expect("tmp");
    for (toml, key) in [
        ("[cluster]\nenabled = true\nseeds = [\"1=127.0.0.1:7001\"]\n", "cluster.node_id"),
        ("[cluster]\nenabled = true\nnode_id = 1\nraft_listen = \"127.0.0.1:7001\"\n", "cluster.seeds"),
        (
            "[cluster]\nenabled = true\nnode_id = 1\nraft_listen = \"0.0.0.0:7001\"\nseeds = [\"1=10.1.1.1:7001\"]\n",
            "cluster.tls",
        ),
        (
            "[cluster]\nenabled = true\nnode_id = 1\nraft_listen = \"127.0.0.1:7001\"\nseeds = [\"1=127.0.0.1:7001\"]\nhost_ttl = \"1ms\"\n",
            "cluster.host_ttl",
        ),
        ("[cluster]\nenabled = true\nnode_id = 1\nseeds = \"1=127.0.0.1:7001\"\n", "cluster.seeds"),
    ] {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, toml).expect("write");
        let out = Command::new(NOTEBOOKOSD).arg("--config").arg(&path).arg("--check-config").output().expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{toml}: {err}");
        assert!(err.contains(key), "{toml}: expected `{key}` in: {err}");
    }

    // The --dev cluster flags go through the same checks.
    let dev = |args: &[&str]| {
        let out = Command::new(NOTEBOOKOSD).args(["--dev", "--check-config"]).args(args).output().expect("run");
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
    };
    // A dev cluster always runs with a PKI (raft mutual TLS, HTTPS, node certificates).
    let pki = notebookosd::pki::Pki::at(&dir.path().join("pki"));
    pki.init().expect("pki");
    pki.issue_node(2, &[], &["127.0.0.1".parse().expect("ip")]).expect("node cert");
    let pki_dir = dir.path().join("pki").display().to_string();
    let seeds = ["--seeds", "1=127.0.0.1:7001,2=127.0.0.1:7002"];
    let (code, text) = dev(&[&["--cluster-node-id", "2", "--pki", &pki_dir][..], &seeds].concat());
    assert_eq!(code, Some(0), "{text}");
    let (code, text) = dev(&[&["--cluster-node-id", "2"][..], &seeds].concat());
    assert!(code == Some(2) && text.contains("--pki"), "a plaintext dev cluster is refused: {text}");
    let (code, text) = dev(&[&["--cluster-node-id", "1", "--pki", &pki_dir][..], &seeds].concat());
    assert!(code == Some(2) && text.contains("node-1.pem is missing"), "{text}");
    let (code, text) = dev(&["--cluster-node-id", "1"]);
    assert!(code == Some(2) && text.contains("--seeds"), "{text}");

    // A single host (no [cluster]) serves no cluster API; `nbos cluster status` says so.
    let out = Command::new(NOTEBOOKOSD)
        .args(["--dev", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(dir.path().join("single"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let mut daemon = KillOnDrop(out);
    let endpoint = dir.path().join("single/run/endpoint.json");
    let url = wait_for(Duration::from_secs(30), "the single host to start", || {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&endpoint).ok()?).ok()?;
        v["url"].as_str().map(str::to_owned)
    });
    let out = Command::new(nbos()).args(["--url", &url, "cluster", "status"]).output().expect("nbos");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("single host"), "{err}");
    daemon.stop();
}

struct KillOnDrop(std::process::Child);

impl KillOnDrop {
    fn stop(&mut self) {
        if let Ok(pid) = libc::pid_t::try_from(self.0.id()) {
            // SAFETY: kill(2) on our own unreaped child.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let _ = self.0.wait();
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.stop();
    }
}

/// In-process: three raft stores with a `Cluster` handle each (no daemons), for what needs a
/// network partition (the raft transport's partition seam) and the kernel watch.
mod in_process {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::group_store::Stores;
    use notebookosd::cluster::control::records::LoadRecord;
    use notebookosd::cluster::{Cluster, ClusterSettings, KernelEvent, KernelSpec};

    const TTL: Duration = Duration::from_millis(800);
    const WAIT: Duration = Duration::from_secs(20);

    fn clusters(stores: &Stores) -> Vec<Arc<Cluster>> {
        let seeds: BTreeMap<u64, std::net::SocketAddr> =
            stores.ids().into_iter().map(|id| (id, stores.node(id).config().listen)).collect();
        stores
            .ids()
            .into_iter()
            .map(|id| {
                let store = stores.node(id).clone();
                let settings = ClusterSettings {
                    node_id: id,
                    name: format!("host-{id}"),
                    gateway_url: format!("http://127.0.0.1:{}", 9 + id),
                    raft_addr: store.config().listen,
                    seeds: seeds.clone(),
                    host_ttl: TTL,
                    replicas: 3,
                    subscription_ratio: 3.0,
                    placement_wait: std::time::Duration::ZERO,
                    sync_inline_max_bytes: 1 << 20,
                    object_store: String::new(),
                    token: None,
                    gpus: Vec::new(),
                    memory_bytes: 0,
                };
                let probe: notebookosd::cluster::control::meta::LoadProbe =
                    Arc::new(move || Box::pin(async move { LoadRecord { node_id: id, ..Default::default() } }));
                let c = Cluster::new(settings, store, probe);
                c.start();
                c
            })
            .collect()
    }

    async fn up(c: &Cluster) -> Vec<u64> {
        c.hosts().await.map(|h| h.iter().map(|h| h.node_id).collect()).unwrap_or_default()
    }

    async fn wait_until<F, Fut>(what: &str, mut f: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = Instant::now() + WAIT;
        while !f().await {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn leader(cs: &[Arc<Cluster>]) -> Arc<Cluster> {
        let deadline = Instant::now() + WAIT;
        loop {
            for c in cs {
                if c.meta_leader().await == Some(c.node_id()) {
                    return c.clone();
                }
            }
            assert!(Instant::now() < deadline, "no meta leader");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_partitioned_host_is_down_then_registers_again_and_watchers_follow_kernels() {
        let stores = Stores::open_with(3, |c| c.tick_interval = Duration::from_millis(20));
        let cs = clusters(&stores);
        for c in &cs {
            wait_until("every host to see 3 hosts up", || async { up(c).await == [1, 2, 3] }).await;
        }

        // A watcher on every host sees a new kernel, then its deletion.
        let mut watch = cs[2].watch_kernels().await.expect("watch");
        let lead = leader(&cs).await;
        let k = lead.create_kernel(KernelSpec { name: "python3".into(), ..Default::default() }).await.expect("create");
        let mut nodes: Vec<u64> = k.replicas.iter().map(|r| r.node_id).collect();
        nodes.sort_unstable();
        assert_eq!(nodes, vec![1, 2, 3]);
        let ev = tokio::time::timeout(WAIT, watch.recv()).await.expect("watch event").expect("open");
        assert_eq!(ev, KernelEvent::Put(k.clone()));
        // A kernel id is placed once.
        let again = lead
            .create_kernel(KernelSpec { id: Some(k.id.clone()), name: "python3".into(), ..Default::default() })
            .await
            .expect_err("duplicate id");
        assert!(again.to_string().contains("already exists"), "{again}");

        // Cut one follower off for longer than the TTL: the others see it down, its lease is
        // gone; once healed it grants a new lease and registers again by itself.
        let cut = cs.iter().find(|c| c.node_id() != lead.node_id()).expect("a follower").clone();
        let old_lease = cut.host_lease().expect("registered");
        for c in &cs {
            if c.node_id() != cut.node_id() {
                c.store().set_peer_blocked(cut.node_id(), true);
                cut.store().set_peer_blocked(c.node_id(), true);
            }
        }
        let others: Vec<u64> = (1..=3).filter(|&id| id != cut.node_id()).collect();
        wait_until("the others to see the cut host down", || async { up(&lead).await == others }).await;
        // Past the re-placement delay too: with no fourth host the replica stays where it is.
        tokio::time::sleep(TTL * 2).await;
        let still = lead.kernel(&k.id).await.expect("read").expect("kernel");
        assert_eq!(still.replicas, k.replicas, "no host could take the replica, so nothing moved");
        for c in &cs {
            c.store().set_peer_blocked(cut.node_id(), false);
            cut.store().set_peer_blocked(c.node_id(), false);
        }
        wait_until("the healed host to be up again", || async {
            up(&lead).await == [1, 2, 3] && cut.host_lease().is_some()
        })
        .await;
        let new_lease = cut.host_lease().expect("registered again");
        assert_ne!(new_lease, old_lease, "the lost lease was re-granted");

        assert!(lead.delete_kernel(&k.id).await.expect("delete"));
        let ev = tokio::time::timeout(WAIT, watch.recv()).await.expect("watch event").expect("open");
        assert_eq!(ev, KernelEvent::Delete(k.id.clone()));
        for c in &cs {
            c.shutdown().await;
        }
    }

    /// Fault campaign, `cluster_restart` after `migrate`/`leave`: a restarted host's replica of
    /// the meta group replays its log, and the supervisor followed that replica's watch, so it
    /// acted on every past version of each kernel record (starting and destroying kernel-group
    /// replicas of moves long finished) until two kernel groups had no leader left. A replica
    /// that is behind is modelled here by cutting it off while the records change: its watch
    /// must start from the records as they are, never from older versions.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cluster_restart_a_host_behind_the_meta_group_watches_only_current_kernel_records() {
        use notebookosd::cluster::control::records::{self, keys};
        let stores = Stores::open_with(3, |c| c.tick_interval = Duration::from_millis(20));
        let cs = clusters(&stores);
        for c in &cs {
            wait_until("every host to see 3 hosts up", || async { up(c).await == [1, 2, 3] }).await;
        }
        let lead = leader(&cs).await;
        let k = lead.create_kernel(KernelSpec { name: "v1".into(), ..Default::default() }).await.expect("create");
        let behind = cs.iter().find(|c| c.node_id() != lead.node_id()).expect("a follower").clone();
        wait_until("the follower to have the record", || async {
            behind.kernel(&k.id).await.ok().flatten().is_some_and(|r| r.name == "v1")
        })
        .await;
        let cut = |blocked: bool| {
            for c in cs.iter().filter(|c| c.node_id() != behind.node_id()) {
                c.store().set_peer_blocked(behind.node_id(), blocked);
                behind.store().set_peer_blocked(c.node_id(), blocked);
            }
        };
        cut(true);
        // The record changes twice while the follower's replica is behind.
        for name in ["v2", "v3"] {
            let record = notebookosd::cluster::control::records::KernelRecord { name: name.into(), ..k.clone() };
            lead.meta().put(keys::kernel(&k.id), records::encode(&record)).await.expect("update the record");
        }
        assert_eq!(behind.kernel(&k.id).await.expect("stale read").expect("record").name, "v1", "still behind");
        let tries = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let watcher = {
            let (behind, tries) = (behind.clone(), tries.clone());
            tokio::spawn(async move {
                // As the supervisor does: retry until the meta group answers.
                loop {
                    tries.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    match behind.watch_kernels().await {
                        Ok(rx) => return rx,
                        Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                }
            })
        };
        // The watch is tried while the follower is still behind (at least one failed attempt).
        wait_until("a watch attempt while cut off", || async { tries.load(std::sync::atomic::Ordering::SeqCst) >= 2 })
            .await;
        cut(false);
        let mut watch = tokio::time::timeout(WAIT, watcher).await.expect("a watch once healed").expect("task");
        let mut seen = Vec::new();
        while !seen.contains(&"v3".to_owned()) {
            let ev = tokio::time::timeout(WAIT, watch.recv()).await.expect("watch event").expect("open");
            if let KernelEvent::Put(r) = ev {
                seen.push(r.name);
            }
        }
        assert_eq!(seen, ["v3"], "the watch showed records that were no longer true");
        for c in &cs {
            c.shutdown().await;
        }
    }
}

/// The meta leader itself leaves: it hands its leadership to another voter first (a leader
/// that removed itself could commit nothing more, and the group would wait an election
/// timeout for a new one), so its peer record goes too and the cluster keeps a leader.
#[test]
fn the_meta_leader_leaves_after_handing_off_its_leadership() {
    let mut c = TestCluster::start(3, Options { fake_gpus: 0, ..Options::default() });
    let four = c.add_host();
    let (joined, out, err) = c.nbos(four, &["cluster", "join", &c.host(1).url.clone()]);
    assert!(joined, "join: {out}{err}");
    c.wait_ready(&[1, 2, 3, four], Duration::from_secs(60));
    let leader = c.status(1).and_then(|s| s["meta_leader"].as_u64()).expect("a meta leader");
    let (left, out, err) = c.nbos(leader, &["cluster", "leave"]);
    assert!(left && out.contains("left the cluster"), "leave: {out}{err}\n{}", c.logs());
    let log = c.host(leader).log();
    assert!(log.contains("meta leadership handed off before leaving"), "{log}");
    assert!(!log.contains("could not delete the peer record"), "{log}");
    let other = [1, 2, 3, four].into_iter().find(|&h| h != leader).expect("another host");
    wait_for(Duration::from_secs(30), "the left host to be gone under a new leader", || {
        let s = c.status(other)?;
        let new_leader = s["meta_leader"].as_u64().filter(|&l| l != leader)?;
        let gone = !s["members"].as_array()?.iter().any(|m| m["node_id"] == leader);
        (gone && new_leader != 0).then_some(())
    });
}

/// A kernel deleted while one of its hosts is down (issue 33): back, that host counts the
/// kernel's group replica, which no record names any more, as unknown
/// (`notebookos_sync_groups_unknown`), destroys it, and ends with the meta group alone, as
/// the others do, and no kernel process. Before, it kept the group for ever, its peers
/// logging every message of it as one for a group they do not host.
#[test]
fn a_kernel_deleted_while_a_host_is_down_is_removed_from_it_when_it_returns() {
    let mut c = TestCluster::start(3, Options::default());
    c.wait_ready(&[1, 2, 3], Duration::from_secs(60));
    let (code, model) = c.post(1, "/api/kernels", serde_json::json!({ "name": "python3", "gpus": 0 }));
    assert_eq!(code, 201, "create: {model}\n{}", c.logs());
    let id = model["id"].as_str().expect("id").to_owned();
    let groups = |c: &TestCluster, h: u64| c.metric(h, "notebookos_raft_groups");
    wait_for(Duration::from_secs(60), "every host to hold the kernel's group", || {
        (1..=3).all(|h| groups(&c, h) == Some(2.0)).then_some(())
    });
    let kernel_dir = c.host(3).dir.join("state/kernels").join(&id);
    assert!(kernel_dir.exists(), "host 3 runs the kernel's replica in {}", kernel_dir.display());
    // A process of the kernel names it in its command line, its cgroups or its working
    // directory (a pre-warmed process taken over names it only in the last two).
    let names_kernel = |pid: &i32| {
        let named = |text: Vec<u8>| String::from_utf8_lossy(&text).contains(&id);
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(named)
            || std::fs::read(format!("/proc/{pid}/cgroup")).is_ok_and(named)
            || std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|d| d.to_string_lossy().contains(&id))
    };
    let of_kernel = |c: &TestCluster| c.kernel_pids(3).into_iter().filter(names_kernel).collect::<Vec<i32>>();
    assert!(!of_kernel(&c).is_empty(), "the check below finds no process of the kernel on host 3 while it runs");
    c.kill(3);
    let (code, body) = c.delete(1, &format!("/api/kernels/{id}"));
    assert_eq!(code, 204, "delete with host 3 down: {body}");
    wait_for(Duration::from_secs(60), "hosts 1 and 2 to drop the kernel's group", || {
        (1..=2).all(|h| groups(&c, h) == Some(1.0)).then_some(())
    });
    c.restart(3);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(60));
    let unknown = |c: &TestCluster| c.metric(3, "notebookos_sync_groups_unknown");
    wait_for(Duration::from_secs(60), "host 3 to count the deleted kernel's group as unknown", || {
        (unknown(&c) == Some(1.0)).then_some(())
    });
    wait_for(Duration::from_secs(60), "host 3 to destroy it", || {
        (groups(&c, 3) == Some(1.0) && unknown(&c) == Some(0.0)).then_some(())
    });
    // The pre-warm pool's processes belong to no kernel.
    assert_eq!(of_kernel(&c), Vec::<i32>::new(), "processes of the deleted kernel on host 3");
    assert!(!kernel_dir.exists(), "the deleted kernel's directory on host 3");
    let (_, kernels) = c.get(3, "/api/kernels");
    assert_eq!(kernels, serde_json::json!([]), "host 3 lists no kernel");
}
