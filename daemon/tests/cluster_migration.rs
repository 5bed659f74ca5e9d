//! Replica moves (issue 14) on real daemons over loopback with the cluster's PKI:
//!
//! - a cell that waits because every replica's host is busy (other kernels' long cells
//!   hold their only GPU) runs after a replica moves to a fourth host, with the
//!   kernel's namespace intact; the client is told it waits and that a replica moves;
//! - a host drained under load (`nbos cluster leave` while a cell runs on it, another
//!   queued behind it) loses no cell: the running cell ends there, the queued one runs
//!   elsewhere, the replica moves, and the host leaves.

use std::collections::BTreeSet;
use std::time::Duration;

use nbos_test_support::cell_client::{CellClient, CellRun};
use nbos_test_support::{wait_for, Options, TestCluster, TOKEN};
use notebookosd::link::client::GatewayClient;

const CELL_TIMEOUT: Duration = Duration::from_secs(120);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

fn gateway(c: &TestCluster, host: u64) -> GatewayClient {
    let ca = c.dir().join("pki/ca.pem");
    GatewayClient::new(&c.host(host).url, Some(TOKEN.to_owned()))
        .with_tls(notebookosd::link::tls::client_config(&ca, None).expect("tls"))
}

/// Creates a one-GPU kernel through `host`'s gateway; returns its id once every replica is ready.
fn create_kernel(c: &TestCluster, host: u64) -> String {
    let (code, model) = c.post(host, "/api/kernels", serde_json::json!({ "name": "python3", "gpus": 1 }));
    assert_eq!(code, 201, "create: {model}\n{}", c.logs());
    model["id"].as_str().expect("id").to_owned()
}

fn replica_hosts(c: &TestCluster, via: u64, kernel: &str) -> BTreeSet<u64> {
    let (code, record) = c.get(via, &format!("/api/v1/cluster/kernels/{kernel}"));
    assert_eq!(code, 200, "{record}");
    record["replicas"].as_array().expect("replicas").iter().filter_map(|r| r["node_id"].as_u64()).collect()
}

fn ok(run: &CellRun) -> bool {
    run.reply["status"] == "ok"
}

fn executor(run: &CellRun) -> u64 {
    run.reply_metadata["nbos_election"]["node_id"].as_u64().unwrap_or_else(|| panic!("no executor in {run:?}"))
}

/// The host whose replica runs `kernel`'s current cell (as `front`'s gateway sees it).
fn current_executor(c: &TestCluster, front: u64, kernel: &str) -> u64 {
    wait_for(Duration::from_secs(60), "the gated cell to start", || {
        let (_, m) = c.get(front, &format!("/api/kernels/{kernel}"));
        m["execution"]["current_executor_node"].as_u64()
    })
}

fn gated(gate: &std::path::Path, then: &str) -> String {
    format!("import os, time\nwhile not os.path.exists({:?}):\n    time.sleep(0.01)\n{then}", gate.display())
}

/// `notebookos_migrations_total{…}` summed over the running hosts (only the meta leader counts).
fn migrations(c: &TestCluster, labels: &str) -> f64 {
    let needle = format!("notebookos_migrations_total{{{labels}}} ");
    c.hosts
        .iter()
        .filter(|h| h.running())
        .filter_map(|h| c.agent().get(&format!("{}/metrics", h.url)).call().ok()?.into_string().ok())
        .flat_map(|text| {
            text.lines().filter_map(|l| l.strip_prefix(&needle)?.trim().parse::<f64>().ok()).collect::<Vec<_>>()
        })
        .sum()
}

fn kernel_tempdir() -> tempfile::TempDir {
    // Kernels run as kernel.user: they look the gate files up (0711), never list.
    let d = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(d.path(), std::os::unix::fs::PermissionsExt::from_mode(0o711)).expect("chmod");
    d
}

#[test]
fn a_cell_every_replica_yields_runs_after_a_replica_moves_to_a_fourth_host_with_its_namespace() {
    // One GPU per host; four one-GPU kernels on three hosts need a ratio of 4.
    let mut c =
        TestCluster::start_tls(3, Options { fake_gpus: 1, subscription_ratio: Some(4.0), ..Options::default() });
    c.wait_ready(&[1, 2, 3], Duration::from_secs(60));
    let k = create_kernel(&c, 1);
    let blockers: Vec<String> = (1..=3).map(|h| create_kernel(&c, h)).collect();
    let gates = kernel_tempdir();
    let rt = runtime();
    let mut client = rt.block_on(CellClient::connect(&gateway(&c, 1), &k)).expect("connect");
    let run = rt
        .block_on(client.run("x = 41\nimport numpy as np\narr = np.arange(1 << 18)", CELL_TIMEOUT))
        .expect("first cell");
    assert!(ok(&run), "{run:?}");
    // Other kernels' long cells take every host's GPU.
    let mut held = Vec::new();
    let mut busy = BTreeSet::new();
    for (i, b) in blockers.iter().enumerate() {
        let mut bc = rt.block_on(CellClient::connect(&gateway(&c, 1), b)).expect("connect blocker");
        let gate = gates.path().join(format!("b{i}"));
        let (id, t) = rt.block_on(bc.send(&gated(&gate, "print('released')"))).expect("send");
        busy.insert(current_executor(&c, 1, b));
        held.push((bc, id, t, gate));
    }
    assert_eq!(busy, BTreeSet::from([1, 2, 3]), "one long cell per host");
    // A fourth host joins, with a free GPU.
    let four = c.add_host();
    let (joined, out, err) = c.nbos(four, &["cluster", "join", &c.host(1).url.clone()]);
    assert!(joined, "join: {out}{err}");
    c.wait_ready(&[1, 2, 3, 4], Duration::from_secs(60));
    assert!(!replica_hosts(&c, 1, &k).contains(&four));

    let run = rt.block_on(client.run("print(x + 1, int(arr.sum()))", CELL_TIMEOUT)).expect("the waiting cell");
    assert!(ok(&run), "{run:?}\n{}", c.logs());
    assert_eq!(run.stdout.trim(), format!("42 {}", (1u64 << 18) * ((1 << 18) - 1) / 2), "the namespace moved along");
    assert_eq!(executor(&run), four, "the cell ran on the fourth host: {run:?}");
    assert!(run.stderr.contains("waiting for 1 GPU"), "the client was told the cell waits: {:?}", run.stderr);
    assert!(run.stderr.contains("moving replica"), "the client was told a replica moves: {:?}", run.stderr);
    // The kernel's record: the moved replica's host replaced by the fourth, no move left.
    let hosts = replica_hosts(&c, 2, &k);
    assert_eq!(hosts.len(), 3, "{hosts:?}");
    assert!(hosts.contains(&four), "{hosts:?}");
    let (_, record) = c.get(3, &format!("/api/v1/cluster/kernels/{k}"));
    assert!(record.get("moving").is_none(), "{record}");
    assert_eq!(migrations(&c, "reason=\"all_yield\",result=\"completed\""), 1.0);
    // The old host stopped its replica; the kernel keeps working on its new set.
    let gone: Vec<u64> = [1, 2, 3].into_iter().filter(|h| !hosts.contains(h)).collect();
    assert_eq!(gone.len(), 1);
    wait_for(Duration::from_secs(30), "the moved replica to stop on its old host", || {
        (c.get(gone[0], &format!("/api/kernels/{k}?replica=local")).0 == 404).then_some(())
    });
    for (mut bc, id, t, gate) in held {
        std::fs::write(&gate, "go").expect("gate");
        let run = rt.block_on(bc.wait(&id, t, CELL_TIMEOUT)).expect("blocker ends");
        assert!(ok(&run), "{run:?}");
    }
    let run = rt.block_on(client.run("x += 1\nprint(x)", CELL_TIMEOUT)).expect("a cell after the move");
    assert!(ok(&run), "{run:?}");
    assert_eq!(run.stdout.trim(), "42");
}

#[test]
fn a_host_drained_under_load_loses_no_cell() {
    let mut c = TestCluster::start_tls(3, Options { fake_gpus: 1, ..Options::default() });
    c.wait_ready(&[1, 2, 3], Duration::from_secs(60));
    let four = c.add_host();
    let (joined, out, err) = c.nbos(four, &["cluster", "join", &c.host(1).url.clone()]);
    assert!(joined, "join: {out}{err}");
    c.wait_ready(&[1, 2, 3, 4], Duration::from_secs(60));
    let k = create_kernel(&c, 1);
    let before = replica_hosts(&c, 1, &k);
    let gates = kernel_tempdir();
    let gate = gates.path().join("running");
    let rt = runtime();
    // Through a gateway that holds no replica, so the drained host is not the client's own.
    let front = (1..=4).find(|h| !before.contains(h)).expect("a host without a replica");
    let mut client = rt.block_on(CellClient::connect(&gateway(&c, front), &k)).expect("connect");
    let run = rt.block_on(client.run("n = 0", CELL_TIMEOUT)).expect("first cell");
    assert!(ok(&run), "{run:?}");
    let (running, t1) = rt.block_on(client.send(&gated(&gate, "n += 1\nprint('ran', n)"))).expect("send");
    let drained = current_executor(&c, front, &k);
    let (queued, t2) = rt.block_on(client.send("n += 10\nprint('queued', n)")).expect("send");
    std::thread::scope(|s| {
        let leaving = s.spawn(|| c.nbos(drained, &["cluster", "leave", "--timeout", "180s"]));
        // The host shows as draining and the replica as moving; the running cell keeps running.
        wait_for(Duration::from_secs(60), "the host to drain and its replica to move", || {
            let (_, st) = c.get(front, "/api/v1/cluster/status");
            let draining = st["members"].as_array()?.iter().any(|m| m["node_id"] == drained && m["draining"] == true);
            let moving = st["moving"].as_array()?.iter().any(|m| m["kernel"] == k.as_str() && m["from"] == drained);
            (draining && moving).then_some(())
        });
        let (ok_, out, _) = c.nbos(front, &["cluster", "status"]);
        assert!(ok_ && out.contains("drain") && out.contains(&format!("moving    kernel {k}")), "{out}");
        std::fs::write(&gate, "go").expect("gate");
        let run = rt.block_on(client.wait(&running, t1, CELL_TIMEOUT)).expect("the running cell ends");
        assert!(ok(&run), "{run:?}\n{}", c.logs());
        assert_eq!(run.stdout.trim(), "ran 1");
        assert_eq!(executor(&run), drained, "it ran to its end where it started");
        let run = rt.block_on(client.wait(&queued, t2, CELL_TIMEOUT)).expect("the queued cell is answered");
        assert!(ok(&run), "{run:?}\n{}", c.logs());
        assert_eq!(run.stdout.trim(), "queued 11", "it saw the running cell's state");
        assert_ne!(executor(&run), drained, "a draining replica runs no new cell");
        let (left, out, err) = leaving.join().expect("leave thread");
        assert!(left, "leave: {out}{err}\n{}", c.logs());
        assert!(out.contains("left the cluster"), "{out}");
    });
    let after = replica_hosts(&c, front, &k);
    assert!(!after.contains(&drained), "{after:?}");
    assert_eq!(after.len(), 3, "{after:?}");
    assert!(migrations(&c, "reason=\"drain\",result=\"completed\"") >= 1.0);
    c.stop(drained);
    let run = rt.block_on(client.run("print(n)", CELL_TIMEOUT)).expect("a cell after the drain");
    assert!(ok(&run), "{run:?}");
    assert_eq!(run.stdout.trim(), "11");
}

/// Begins moving `kernel`'s replica on host `from` (reason `drain`: to the least subscribed
/// host without one) and waits until the move is done; returns the replica hosts then.
fn move_off(c: &TestCluster, kernel: &str, from: u64) -> BTreeSet<u64> {
    let path = format!("/api/v1/cluster/kernels/{kernel}/migrate");
    let (code, answer) = c.post_as_operator(1, &path, serde_json::json!({ "reason": "drain", "from": from }));
    assert_eq!((code, answer["outcome"].as_str()), (200, Some("moving")), "{answer}");
    wait_for(Duration::from_secs(120), "the move to finish", || {
        let (_, record) = c.get(1, &format!("/api/v1/cluster/kernels/{kernel}"));
        let hosts = replica_hosts(c, 1, kernel);
        (record.get("moving").is_none_or(serde_json::Value::is_null) && !hosts.contains(&from)).then_some(hosts)
    })
}

/// Regressions of two fixes, in the scenario that found them (issue 32; the migration
/// bench): a replica moves off a host and straight back to it.
///
/// - The kernel group's leader still counts the host as the member it was (raft ids are
///   host ids) and sent the new, empty replica a commit index past its log: raft panicked and
///   the move failed. The left-over member is now removed first (and the target joins again
///   if its group failed anyway).
/// - The front-end's link to that host stayed on the stopped replica's kernel, and the
///   replica started there again yielded every cell as dead. A stopped kernel now closes its
///   sockets, so the link reconnects.
///
/// The cell after the move back can run only on that host: the other replicas' hosts are
/// busy with other kernels' long cells.
#[test]
fn a_replica_moved_straight_back_to_the_host_it_left_runs_the_next_cell_with_the_namespace() {
    // One GPU per host; the kernel and three blockers on four hosts need a ratio of 4.
    let c = TestCluster::start_tls(4, Options { fake_gpus: 1, subscription_ratio: Some(4.0), ..Options::default() });
    c.wait_ready(&[1, 2, 3, 4], Duration::from_secs(60));
    let k = create_kernel(&c, 1);
    let blockers: Vec<String> = (1..=3).map(|h| create_kernel(&c, h)).collect();
    let hosts = replica_hosts(&c, 1, &k);
    let gates = kernel_tempdir();
    let rt = runtime();
    // Long cells of other kernels until two of the kernel's three hosts are busy.
    let mut held = Vec::new();
    let mut busy = BTreeSet::new();
    for (i, b) in blockers.iter().enumerate() {
        if busy.intersection(&hosts).count() == 2 {
            break;
        }
        let mut bc = rt.block_on(CellClient::connect(&gateway(&c, 1), b)).expect("connect blocker");
        let gate = gates.path().join(format!("b{i}"));
        let (id, t) = rt.block_on(bc.send(&gated(&gate, "print('released')"))).expect("send");
        busy.insert(current_executor(&c, 1, b));
        held.push((bc, id, t, gate));
    }
    let back: Vec<u64> = hosts.difference(&busy).copied().collect();
    assert_eq!(back.len(), 1, "one of the kernel's hosts is free: replicas {hosts:?}, busy {busy:?}");
    let back = back[0];
    // The client's front-end is another host, so its link to `back` is a socket.
    let front = *hosts.iter().find(|h| **h != back).expect("a front-end");
    let mut client = rt.block_on(CellClient::connect(&gateway(&c, front), &k)).expect("connect");
    let run = rt.block_on(client.run("x = 41", CELL_TIMEOUT)).expect("first cell");
    assert!(ok(&run), "{run:?}");
    assert_eq!(executor(&run), back, "only its host is free: {run:?}");

    // Should a round of that cell have found every replica busy (a load record not yet
    // showing `back` free), the meta leader began a move of its own: let it finish first.
    let hosts = wait_for(Duration::from_secs(120), "no move of the kernel under way", || {
        let (_, record) = c.get(1, &format!("/api/v1/cluster/kernels/{k}"));
        record.get("moving").is_none_or(serde_json::Value::is_null).then(|| replica_hosts(&c, 1, &k))
    });
    assert!(hosts.contains(&back), "{hosts:?}");
    // Only `back` can run the last cell (the regression of the socket fix) while the kernel's
    // other hosts are busy; a move of the leader's own may have put a replica on a free host.
    let only_back = hosts.difference(&busy).count() == 1;
    let spare = (1..=4).find(|h| !hosts.contains(h)).expect("a host without a replica");
    let moved = move_off(&c, &k, back);
    assert!(moved.contains(&spare), "{moved:?}");
    let returned = move_off(&c, &k, spare);
    assert_eq!(returned, hosts, "the replica went back to host {back}");
    wait_for(Duration::from_secs(60), "the replica on the host it came back to to be ready", || {
        let (_, ready) = c.get(1, &format!("/api/v1/cluster/kernels/{k}/ready"));
        ready.as_array()?.iter().any(|h| h.as_u64() == Some(back)).then_some(())
    });

    let run = rt.block_on(client.run("x += 1\nprint(x)", CELL_TIMEOUT)).expect("a cell after the move back");
    assert!(ok(&run), "{run:?}\n{}", c.logs());
    assert_eq!(run.stdout.trim(), "42", "the namespace came back too");
    if only_back {
        assert_eq!(executor(&run), back, "it ran on the host the replica came back to: {run:?}");
    }
    for (mut bc, id, t, gate) in held {
        std::fs::write(&gate, "go").expect("gate");
        let run = rt.block_on(bc.wait(&id, t, CELL_TIMEOUT)).expect("blocker ends");
        assert!(ok(&run), "{run:?}");
    }
}
