//! Host memory is a placement resource (issue 34), on four real daemons over loopback:
//! host 4's memory for kernels (`cluster.kernel_memory_mib`) is configured small, room
//! for one new replica (placement expects 64 MiB of a new one) but not for a second once
//! the first is running and measured. Host 4 takes a replica while it is empty; once its
//! load record reports the replica's measured memory, placement puts no new replica there
//! although host 4 holds the fewest replicas (the next host by placement's own order);
//! the other hosts take them, and every kernel, the one on host 4 included, runs its cells.

use std::collections::BTreeSet;
use std::time::Duration;

use nbos_test_support::cell_client::CellClient;
use nbos_test_support::{wait_for, Options, TestCluster, TOKEN};
use notebookosd::link::client::GatewayClient;

const CELL_TIMEOUT: Duration = Duration::from_secs(90);
/// Host 4's memory for kernels, MiB: 64 MiB (a new replica's estimate) fits an empty
/// host 4, not one whose kernel measures more than 36 MiB (an idle ipykernel is ~47 MiB).
const SMALL_MIB: u64 = 100;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

/// Creates a CPU-only kernel through host 1 (placement orders hosts by replicas held, then
/// node id); returns its id and its replicas' hosts once every replica is ready.
fn create_kernel(c: &TestCluster) -> (String, BTreeSet<u64>) {
    let (code, model) = c.post(1, "/api/kernels", serde_json::json!({ "name": "python3", "gpus": 0 }));
    assert_eq!(code, 201, "create: {model}\n{}", c.logs());
    let hosts: BTreeSet<u64> =
        model["replicas"].as_array().expect("replicas").iter().filter_map(|r| r["node_id"].as_u64()).collect();
    assert_eq!(hosts.len(), 3, "three distinct hosts: {model}");
    (model["id"].as_str().expect("id").to_owned(), hosts)
}

/// Host `node`'s load record as the cluster status on host 1 shows it.
fn load_of(c: &TestCluster, node: u64) -> Option<serde_json::Value> {
    let (_, st) = c.get(1, "/api/v1/cluster/status");
    st["members"].as_array()?.iter().find(|m| m["node_id"] == node)?.get("load").cloned()
}

#[test]
fn a_host_whose_kernels_fill_its_memory_gets_no_new_replica_and_loses_nothing() {
    let mut c = TestCluster::create(4, Options { fake_gpus: 1, ..Options::default() });
    c.reconfigure(4, |cfg| {
        cfg.overlay(&format!("[cluster]\nkernel_memory_mib = {SMALL_MIB}\n")).expect("overlay");
    });
    for h in 1..=4 {
        c.restart(h);
    }
    c.wait_ready(&[1, 2, 3, 4], Duration::from_secs(60));
    let capacity = wait_for(Duration::from_secs(30), "host 4 to report its memory for kernels", || {
        load_of(&c, 4)?["memory_capacity_mib"].as_u64().filter(|&m| m > 0)
    });
    assert_eq!(capacity, SMALL_MIB);
    let other = load_of(&c, 1).expect("host 1's load");
    assert!(other["memory_capacity_mib"].as_u64().unwrap_or(0) > SMALL_MIB, "host 1: MemTotal less a reserve: {other}");

    // Hosts 1-3 take the first kernel; host 4, empty, the second.
    let (first, hosts) = create_kernel(&c);
    assert_eq!(hosts, BTreeSet::from([1, 2, 3]));
    let (on_four, hosts) = create_kernel(&c);
    assert!(hosts.contains(&4), "an empty host 4 has room for one replica: {hosts:?}");
    let used = wait_for(Duration::from_secs(30), "host 4 to report its replica's measured memory", || {
        let load = load_of(&c, 4)?;
        load["kernel_memory_mib"].get(&on_four)?;
        load["memory_used_mib"].as_u64().filter(|&m| m + 64 > SMALL_MIB)
    });
    let measured = c.metric(4, "notebookos_host_memory_replicas_bytes").expect("the gauge");
    assert!(measured > 0.0, "host 4 measures its kernel: {measured}");
    assert_eq!(
        c.metric(4, "notebookos_host_memory_replicas_capacity_bytes"),
        Some((SMALL_MIB << 20) as f64),
        "{}",
        c.logs()
    );

    // Host 4 holds the fewest replicas, so placement would pick it first; it is full.
    let mut later = Vec::new();
    for _ in 0..2 {
        let (k, hosts) = create_kernel(&c);
        assert!(!hosts.contains(&4), "kernel {k} placed on host 4, whose kernels use {used} of {SMALL_MIB} MiB");
        later.push(k);
    }

    // Nothing is lost: every kernel runs a cell, the one with a replica on host 4 included.
    let rt = runtime();
    let gateway = GatewayClient::new(&c.host(1).url, Some(TOKEN.to_owned()));
    for k in [&first, &on_four].into_iter().chain(&later) {
        let mut client = rt.block_on(CellClient::connect(&gateway, k)).expect("connect");
        let run = rt.block_on(client.run("x = 6 * 7\nprint(x)", CELL_TIMEOUT)).expect("a cell");
        assert_eq!(run.reply["status"], "ok", "kernel {k}: {run:?}\n{}", c.logs());
        assert_eq!(run.stdout.trim(), "42");
    }
}
