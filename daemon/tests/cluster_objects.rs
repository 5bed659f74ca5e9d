//! The large-object store of a 3-host cluster over months, compressed (issue 18): values
//! overwritten cell after cell and kernels deleted leave objects no replica refers to, and
//! the meta leader's collector deletes exactly those; the live ones stay readable (a
//! restarted replica loads its whole namespace from the store). Run against a local
//! directory and against an S3 server with a prefix (moto). A store that stalls mid-upload
//! fails that cell's sync with a clear reply, loses nothing acknowledged, and the next cells
//! are synchronised again.

#[path = "common/s3.rs"]
mod s3;

use std::collections::BTreeMap;
use std::time::Duration;

use nbos_test_support::cell_client::{CellClient, CellRun};
use nbos_test_support::{wait_for, Options, TestCluster, TOKEN};
use notebookosd::link::client::GatewayClient;
use s3::{Fault, FaultProxy, S3Server};

const CELL_TIMEOUT: Duration = Duration::from_secs(90);
/// How long replicas may take to apply a cell (a restarted one: its whole namespace).
const DIGEST_WAIT: Duration = Duration::from_secs(90);
/// Arrays of 256 KiB go to the object store (inline up to 64 KiB here); the collector runs
/// only when asked, with no grace (every unreferenced object may go at once).
const GC_TOML: &str = "sync_inline_max_bytes = 65536\nobject_gc_interval = \"0s\"\nobject_gc_grace = \"0s\"\n";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

fn start(object_store: Option<String>, env: Vec<(String, String)>, extra: &str) -> TestCluster {
    let options =
        Options { fake_gpus: 0, object_store, env, overlay: format!("[cluster]\n{extra}"), ..Options::default() };
    let c = TestCluster::start(3, options);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(60));
    c
}

fn gateway(c: &TestCluster, host: u64) -> GatewayClient {
    GatewayClient::new(&c.host(host).url, Some(TOKEN.to_owned()))
}

fn create_kernel(c: &TestCluster) -> String {
    let (code, model) = c.post(1, "/api/kernels", serde_json::json!({ "name": "python3" }));
    assert_eq!(code, 201, "create: {model}\n{}", c.logs());
    model["id"].as_str().expect("id").to_owned()
}

fn revision(run: &CellRun) -> u64 {
    run.reply_metadata["nbos_election"]["revision"].as_u64().unwrap_or_else(|| panic!("no revision in {run:?}"))
}

fn executor(run: &CellRun) -> u64 {
    run.reply_metadata["nbos_election"]["node_id"].as_u64().unwrap_or_else(|| panic!("no executor in {run:?}"))
}

fn ok(run: &CellRun) -> bool {
    run.reply["status"] == "ok"
}

async fn run(c: &TestCluster, kernel: &str, code: &str) -> CellRun {
    let mut client = CellClient::connect(&gateway(c, 1), kernel).await.expect("connect");
    client.run(code, CELL_TIMEOUT).await.expect("cell")
}

fn assert_same(digests: &BTreeMap<u64, String>, what: &str) {
    let first = digests.values().next().expect("a digest");
    assert!(digests.values().all(|d| d == first), "{what}: replicas differ: {digests:?}");
}

/// `nbos objects gc --json` (or `status`) on host 1, parsed; fails the test when it fails.
fn objects(c: &TestCluster, args: &[&str]) -> serde_json::Value {
    let (success, out, err) = c.nbos(1, &[&["objects"], args, &["--json"]].concat());
    assert!(success, "nbos objects {args:?}: {err}\n{out}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("nbos objects {args:?} printed no JSON ({e}): {out}"))
}

fn count(report: &serde_json::Value, key: &str) -> u64 {
    report[key]["objects"].as_u64().unwrap_or_else(|| panic!("{key} in {report}"))
}

/// Ten overwrites of one kernel's array, one other kernel's array, collection, a restarted
/// replica reloading from the store, then the first kernel deleted and collected too.
fn overwritten_and_deleted_values_are_collected(mut c: TestCluster) {
    let rt = runtime();
    let k1 = create_kernel(&c);
    let k2 = create_kernel(&c);
    let mut last = CellRun::default();
    rt.block_on(async {
        for i in 0..10 {
            let code = format!("import numpy as np\na = np.random.default_rng({i}).random(32768)");
            last = run(&c, &k1, &code).await;
            assert!(ok(&last), "cell {i}: {last:?}");
        }
        let r = run(&c, &k2, "import numpy as np\nb = np.full(32768, 7.0)").await;
        assert!(ok(&r), "{r:?}");
        c.digests_after(&k2, revision(&r), DIGEST_WAIT);
    });
    assert_same(&c.digests_after(&k1, revision(&last), DIGEST_WAIT), "before collection");

    let before = objects(&c, &["status"]);
    assert!(before["complete"] == true && before["dry_run"] == true, "{before}");
    assert!(count(&before, "stored") >= 11, "ten arrays of k1 and one of k2 were stored: {before}");
    assert_eq!(count(&before, "referenced"), 2, "one live array per kernel: {before}");
    assert_eq!(count(&before, "collectable"), count(&before, "stored") - 2, "{before}");
    let dry = objects(&c, &["gc", "--dry-run"]);
    assert_eq!(count(&dry, "collected"), 0, "a dry run deletes nothing: {dry}");
    assert_eq!(count(&objects(&c, &["status"]), "stored"), count(&before, "stored"));

    // Users' token: they may look, not collect, and not ask a host for its references.
    let (code, body) = c.post(1, "/api/v1/cluster/objects/gc", serde_json::json!({}));
    assert!(code == 401 || code == 403, "gc with the users' token: {code} {body}");
    let (code, body) = c.get(1, "/api/v1/cluster/objects/refs");
    assert!(code == 401 || code == 403, "refs with the users' token: {code} {body}");
    let (code, body) = c.post_as_operator(1, "/api/v1/cluster/objects/gc", serde_json::json!({ "dry_run": "yes" }));
    assert!((400..500).contains(&code), "a malformed gc body is refused: {code} {body}");
    assert_eq!(count(&objects(&c, &["status"]), "stored"), count(&before, "stored"), "nothing deleted so far");

    let gc = objects(&c, &["gc"]);
    assert_eq!(count(&gc, "collected"), count(&before, "stored") - 2, "{gc}");
    assert_eq!(gc["failed_deletes"], 0, "{gc}");
    let after = objects(&c, &["status"]);
    assert_eq!(
        (count(&after, "stored"), count(&after, "referenced"), after["dangling"].as_u64()),
        (2, 2, Some(0)),
        "{after}"
    );
    let metrics = c.agent().get(&format!("{}/metrics", c.host(gc["node_id"].as_u64().expect("leader")).url)).call();
    let metrics = metrics.expect("metrics").into_string().expect("text");
    assert!(metrics.contains("notebookos_object_store_collected_objects_total"), "{metrics}");

    // A replica that did not run the last cell restarts and loads its whole namespace from
    // the store: the live object is intact.
    let follower = (1..=3).find(|h| *h != executor(&last)).expect("a follower");
    c.kill(follower);
    c.restart(follower);
    c.wait_ready(&[1, 2, 3], Duration::from_secs(60));
    rt.block_on(async {
        let r = run(&c, &k1, "print(round(float(a.sum()), 6))").await;
        assert!(ok(&r), "{r:?}");
        assert_same(&c.digests_after(&k1, revision(&r), DIGEST_WAIT), "after collection and a restart");
    });

    // A deleted kernel's objects go too; the other kernel's stays.
    let (code, body) = c.delete(1, &format!("/api/kernels/{k1}"));
    assert!(code == 204 || code == 200, "delete k1: {code} {body}");
    let gc = wait_for(Duration::from_secs(60), "the deleted kernel's groups to be gone", || {
        let report = objects(&c, &["gc"]);
        (count(&report, "stored") - count(&report, "collected") == 1).then_some(report)
    });
    assert_eq!(count(&gc, "referenced"), 1, "{gc}");

    // A host that does not answer: nothing is deleted, and the CLI says why.
    c.stop(3);
    let (success, out, err) = c.nbos(1, &["objects", "gc"]);
    assert!(!success, "gc with a host down must fail: {out}");
    assert!(err.contains("nothing was deleted") && err.contains("host 3"), "{err}");
}

#[test]
fn a_directory_store_keeps_live_objects_and_collects_the_rest() {
    overwritten_and_deleted_values_are_collected(start(None, Vec::new(), GC_TOML));
}

#[test]
fn an_s3_store_with_a_prefix_keeps_live_objects_and_collects_the_rest() {
    let server = S3Server::start("nbos-gc", "cluster-a", false);
    let env = server.env(&server.admin, &server.endpoint);
    overwritten_and_deleted_values_are_collected(start(Some(server.url("cluster-a")), env, GC_TOML));
}

#[test]
fn a_store_that_stalls_mid_upload_fails_the_cells_sync_and_loses_nothing() {
    let server = S3Server::start("nbos-stall", "cluster-a", false);
    let proxy = FaultProxy::start(&server.endpoint);
    let env = server.env(&server.admin, &proxy.endpoint);
    let extra = format!("{GC_TOML}object_store_timeout = \"2s\"\n");
    let c = start(Some(server.url("cluster-a")), env, &extra);
    let k = create_kernel(&c);
    runtime().block_on(async {
        let first = run(&c, &k, "import numpy as np\na = np.full(32768, 1.0)").await;
        assert!(ok(&first), "{first:?}");
        c.digests_after(&k, revision(&first), DIGEST_WAIT);

        proxy.set(Fault::Stall);
        let stalled = run(&c, &k, "b = np.full(32768, 2.0)").await;
        assert_eq!(stalled.reply["ename"], "NamespaceSyncFailed", "{stalled:?}");
        assert!(stalled.stderr.contains("NOT synchronised"), "the cell's output says so: {stalled:?}");

        proxy.set(Fault::Pass);
        // Nothing acknowledged is lost; the unsynchronised cell's value is not on the others.
        let check = run(&c, &k, "print(float(a.sum()), 'b' in dir())").await;
        assert!(ok(&check), "{check:?}");
        assert_eq!(check.stdout.trim(), "32768.0 False", "{check:?}");
        // The next cells are synchronised again.
        let next = run(&c, &k, "c = np.full(32768, 3.0)").await;
        assert!(ok(&next), "{next:?}");
        assert_same(&c.digests_after(&k, revision(&next), DIGEST_WAIT), "after the stall");
    });
    let failures: f64 = (1..=3)
        .map(|h| {
            let text = c.agent().get(&format!("{}/metrics", c.host(h).url)).call().expect("metrics");
            let text = text.into_string().expect("text");
            text.lines()
                .filter(|l| l.starts_with("notebookos_sync_failures_total{side=\"export\"}"))
                .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
                .sum::<f64>()
        })
        .sum();
    assert!(failures >= 1.0, "the failed export is counted in notebookos_sync_failures_total");
}

/// 100 cells each overwriting one array, the store's size before and after one collection
/// (issue 18's measurement). The array is 256 KiB in `make test`; the closing note's run
/// sets `NBOS_OVERWRITE_MIB=32` (3.2 GB written):
/// `NBOS_OVERWRITE_MIB=32 cargo nextest run -p notebookosd -E 'test(hundred_overwrites)' --no-capture`.
#[test]
fn hundred_overwrites_of_an_array_leave_one_after_collection() {
    let kib: u64 =
        std::env::var("NBOS_OVERWRITE_MIB").ok().and_then(|m| m.parse::<u64>().ok()).map_or(256, |m| m * 1024);
    let c = start(None, Vec::new(), GC_TOML);
    let k = create_kernel(&c);
    let mut last = CellRun::default();
    runtime().block_on(async {
        let mut client = CellClient::connect(&gateway(&c, 1), &k).await.expect("connect");
        for i in 0..100 {
            let code = format!("import numpy as np\nx = np.random.default_rng({i}).random({kib} * 128)");
            last = client.run(&code, CELL_TIMEOUT).await.expect("cell");
            assert!(ok(&last), "cell {i}: {last:?}");
        }
    });
    c.digests_after(&k, revision(&last), DIGEST_WAIT);
    let before = objects(&c, &["status"]);
    let gc = objects(&c, &["gc"]);
    let after = objects(&c, &["status"]);
    let mib = |r: &serde_json::Value| r["stored"]["bytes"].as_u64().unwrap_or(0) as f64 / 1048576.0;
    eprintln!(
        "MEASURED: {kib} KiB arrays: before collection {} objects, {:.1} MiB; collected {} objects in {} ms; after {} objects, {:.1} MiB",
        count(&before, "stored"),
        mib(&before),
        count(&gc, "collected"),
        gc["took_ms"],
        count(&after, "stored"),
        mib(&after)
    );
    assert_eq!(count(&before, "stored"), 100, "{before}");
    assert_eq!(count(&after, "stored"), 1, "one array per live kernel: {after}");
}
