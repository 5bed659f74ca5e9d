//! Kernel groups (issue 7): executor election over a real 3-node raft group, and
//! namespace sync between three real ipykernel replicas through it.

#[path = "common/group_store.rs"]
mod group_store;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use group_store::{Rng, Stores};
use notebookosd::cluster::cells::election::{self, Decision, Outcome, Proposer};
use notebookosd::cluster::control::records::{ElectionRecord, RunningRecord};

const GROUP: u64 = 1001;

/// What every proposal of one cell returned, and who it was.
type Log = Arc<Mutex<HashMap<String, Vec<(Proposer, u32, Outcome)>>>>;

/// One election request as a front-end sends it to a replica.
#[derive(Clone)]
struct Request {
    cell: String,
    round: u32,
    expected: Option<ElectionRecord>,
    replica: u32,
    decision: Decision,
}

async fn propose_after(stores: &Stores, delay_ms: u64, req: Request, log: &Log) -> Outcome {
    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
    // Replica n lives on node n and proposes through its own node (followers forward).
    let me = Proposer { replica: req.replica, node_id: u64::from(req.replica) };
    let kv = stores.node(u64::from(req.replica)).kv(GROUP);
    let outcome = election::propose(&kv, &req.cell, req.round, req.expected.as_ref(), me, req.decision, None)
        .await
        .expect("propose");
    if matches!(outcome, Outcome::Won(_)) {
        // The cell ran: its end frees the kernel's lock for the next cell.
        let held = RunningRecord { cell: req.cell.clone(), replica: me.replica, node_id: me.node_id };
        election::release_running(&kv, &held).await;
    }
    log.lock().unwrap().entry(req.cell.clone()).or_default().push((me, req.round, outcome.clone()));
    outcome
}

/// One simulated front-end driving one cell: each round designates a random replica,
/// which proposes LEAD or YIELD at random; a second, confused front-end sometimes
/// designates another replica for the same round; old rounds' requests are replayed
/// late (stale); everything is delayed at random, so messages arrive in any order.
async fn drive_cell(stores: Arc<Stores>, cell: String, seed: u64, log: Log) {
    let mut rng = Rng::from_seed(seed);
    let mut expected: Option<ElectionRecord> = None;
    let mut replays = Vec::new();
    for round in 0u32.. {
        assert!(round < 200, "cell {cell} undecided after 200 rounds");
        let designee = 1 + rng.below(3) as u32;
        let mut proposals = Vec::new();
        let mut who = vec![designee];
        if rng.chance(30) {
            who.push(1 + rng.below(3) as u32);
        }
        for replica in who {
            let decision = if rng.chance(35) { Decision::Lead } else { Decision::Yield { reason: "busy".into() } };
            let req = Request { cell: cell.clone(), round, expected: expected.clone(), replica, decision };
            let delay = rng.below(15);
            let (s, l, r) = (stores.clone(), log.clone(), req.clone());
            proposals.push(tokio::spawn(async move { propose_after(&s, delay, r, &l).await }));
            if rng.chance(30) {
                // The same request delivered again much later, maybe to another replica (stale).
                let delay = 20 + rng.below(200);
                let (s, l) = (stores.clone(), log.clone());
                let r = Request { replica: 1 + rng.below(3) as u32, ..req };
                replays.push(tokio::spawn(async move { propose_after(&s, delay, r, &l).await }));
            }
        }
        let mut outcomes = Vec::new();
        for p in proposals {
            outcomes.push(p.await.expect("proposal task"));
        }
        if outcomes.iter().any(|o| matches!(o, Outcome::Won(_) | Outcome::Taken(_))) {
            break;
        }
        // The front-end continues from the newest record it was told about.
        expected = outcomes.iter().filter_map(|o| o.record().cloned()).max_by_key(|r| r.round).or(expected);
    }
    for r in replays {
        r.await.expect("replay task");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_one_replica_wins_each_cell_under_reordering_and_stale_rounds() {
    let stores = Arc::new(Stores::open(3));
    stores.create_group(GROUP).await;
    let mut rng = Rng::seeded();
    let log: Log = Arc::default();
    let cells: Vec<String> = (0..60).map(|i| format!("cell-{i:03}")).collect();
    let drivers: Vec<_> = cells
        .iter()
        .map(|cell| tokio::spawn(drive_cell(stores.clone(), cell.clone(), rng.next(), log.clone())))
        .collect();
    for d in drivers {
        d.await.expect("driver");
    }
    let log = log.lock().unwrap().clone();
    // The run exercised every path, not only first-try wins.
    for kind in ["won", "yielded", "taken", "stale"] {
        let n = log.values().flatten().filter(|(_, _, o)| o.name() == kind).count();
        assert!(n > 0, "no proposal ended {kind}");
    }
    for cell in &cells {
        let outcomes = &log[cell];
        let wins: Vec<&ElectionRecord> =
            outcomes.iter().filter_map(|(_, _, o)| if let Outcome::Won(r) = o { Some(r) } else { None }).collect();
        assert_eq!(wins.len(), 1, "cell {cell}: {} winners: {outcomes:?}", wins.len());
        let winner = wins[0].clone();
        // Final: what is stored is the winner's record, on every node's view of the group.
        for id in stores.ids() {
            let now = election::current(&stores.node(id).kv(GROUP), cell).await.expect("read");
            assert_eq!(now.as_ref(), Some(&winner), "cell {cell} record changed after its win");
        }
        // Everyone who lost after the win was told who won.
        for (_, _, o) in outcomes {
            if let Outcome::Taken(r) = o {
                assert_eq!(r, &winner, "cell {cell}: a taken outcome names another winner");
            }
        }
        // And a proposal from any older record now can only be told the winner.
        let late = election::propose(
            &stores.node(1).kv(GROUP),
            cell,
            winner.round + 1,
            None,
            Proposer { replica: 1, node_id: 1 },
            Decision::Lead,
            None,
        )
        .await
        .expect("late proposal");
        assert_eq!(late, Outcome::Taken(winner.clone()));
    }
}

/// Two front-ends send different cells of one kernel at once (the fault campaign's lost
/// update: both won, ran side by side from the same namespace, and the later commit dropped
/// the earlier cell). The LEAD swap takes the kernel's lock: the second cell is told `busy`
/// until the first ends; a lock whose holder's host is gone is taken over only by naming it
/// exactly, and its old holder's release then frees nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_cells_of_one_kernel_run_one_at_a_time() {
    let stores = Stores::open(3);
    stores.create_group(GROUP).await;
    let kv = stores.node(1).kv(GROUP);
    let (r1, r2) = (Proposer { replica: 1, node_id: 1 }, Proposer { replica: 2, node_id: 2 });
    let lead = |cell: &'static str, me: Proposer, steal: Option<RunningRecord>| {
        let kv = stores.node(me.node_id).kv(GROUP);
        async move { election::propose(&kv, cell, 0, None, me, Decision::Lead, steal.as_ref()).await.expect("propose") }
    };
    assert!(matches!(lead("cell-a", r1, None).await, Outcome::Won(_)));
    let a = RunningRecord { cell: "cell-a".into(), replica: 1, node_id: 1 };
    assert_eq!(lead("cell-b", r2, None).await, Outcome::Busy(a.clone()), "cell-a runs: cell-b waits");
    // A YIELD needs no lock; cell-b's record is unchanged by the busy LEAD.
    assert_eq!(election::current(&kv, "cell-b").await.expect("read"), None);
    // Taking over a lock means naming it exactly: a wrong record does not.
    let wrong = RunningRecord { cell: "cell-z".into(), replica: 3, node_id: 3 };
    assert_eq!(lead("cell-b", r2, Some(wrong)).await, Outcome::Busy(a.clone()));
    // Host 1 is gone (as the front-end sees it): cell-b takes its lock over.
    assert!(matches!(lead("cell-b", r2, Some(a.clone())).await, Outcome::Won(_)));
    let b = RunningRecord { cell: "cell-b".into(), replica: 2, node_id: 2 };
    // The old holder's late release frees nothing: cell-b still holds the kernel.
    election::release_running(&kv, &a).await;
    assert_eq!(lead("cell-c", r1, None).await, Outcome::Busy(b.clone()));
    election::release_running(&stores.node(2).kv(GROUP), &b).await;
    assert!(matches!(lead("cell-c", r1, None).await, Outcome::Won(_)), "cell-b ended: cell-c runs");
}

mod sync {
    use std::path::Path;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant, SystemTime};

    use notebookosd::cluster::cells::objects::Objects;
    use notebookosd::cluster::cells::replica_host::{Handled, ReplicaHost};
    use notebookosd::cluster::cells::state_sync::{self, namespace_digest, SyncConfig};
    use notebookosd::cluster::control::records::keys;
    use notebookosd::jupyter::{Channel, Message};
    use notebookosd::kernel::binding::{Binder, LeaseControl, LogOnlyLeases};
    use notebookosd::kernel::hub::{ClientId, Outgoing};
    use notebookosd::kernel::{Kernels, LocalKernel};
    use notebookosd::metrics::Metrics;
    use tokio::sync::mpsc;

    use super::group_store::{python, Stores};

    const KERNEL: &str = "0b7c6c52-4b8e-4f0e-9d3a-6a1f1f0c2a01";
    /// A second kernel on one host, outside the group, that takes the host's GPU.
    const OTHER: &str = "5d1e0a8e-8c1b-4a57-9b0e-2f7d9c3e6b02";
    const GROUP: u64 = 2002;
    const WAIT: Duration = Duration::from_secs(60);

    /// One host: its kernel registry, its replica of the kernel, a client on it.
    struct Host {
        node: u64,
        kernels: Arc<Kernels>,
        host: Arc<ReplicaHost>,
        kernel: Arc<LocalKernel>,
        client: ClientId,
        rx: mpsc::Receiver<Outgoing>,
    }

    async fn start_host(stores: &Stores, node: u64, dir: &Path, objects: &Path) -> Host {
        start_host_with(stores, node, dir, objects, 0, Arc::new(LogOnlyLeases)).await
    }

    /// A host with `gpus` GPUs (room for two kernels on each) whose lease server is `leases`;
    /// its replica of the kernel asks for `gpus` GPUs per cell.
    async fn start_host_with(
        stores: &Stores,
        node: u64,
        dir: &Path,
        objects: &Path,
        gpus: u32,
        leases: Arc<dyn LeaseControl>,
    ) -> Host {
        let metrics = Arc::new(Metrics::new());
        let binder = Binder::new(gpus, Duration::from_secs(60), 2.0, leases, metrics.clone());
        let kernels = Arc::new(Kernels::new(python(), dir.join("kernels"), Vec::new(), metrics, binder, 0));
        let mut sync = SyncConfig::new(dir.join("sync"));
        sync.kernel_timeout = WAIT;
        sync.elect_history = 4;
        let objects = Objects::open(None, objects).expect("objects");
        let host = Arc::new(ReplicaHost::new(node, stores.node(node).clone(), kernels.clone(), objects, sync));
        let (kernel, client, rx) = start_replica_with(&kernels, &host, node, gpus).await;
        Host { node, kernels, host, kernel, client, rx }
    }

    async fn start_replica(
        kernels: &Kernels,
        host: &ReplicaHost,
        node: u64,
    ) -> (Arc<LocalKernel>, ClientId, mpsc::Receiver<Outgoing>) {
        start_replica_with(kernels, host, node, 0).await
    }

    async fn start_replica_with(
        kernels: &Kernels,
        host: &ReplicaHost,
        node: u64,
        gpus: u32,
    ) -> (Arc<LocalKernel>, ClientId, mpsc::Receiver<Outgoing>) {
        let replica = u32::try_from(node).expect("small");
        let kernel = kernels.create_replica(KERNEL, replica, None, Some(gpus), &[], None).await.expect("start replica");
        host.attach(kernel.clone(), replica, GROUP);
        let (client, rx, _) = kernel.hub.connect();
        (kernel, client, rx)
    }

    fn request(msg_id: &str, code: &str, cell: &str, role: &str) -> Message {
        let mut msg = Message::new(
            "execute_request",
            "test-session",
            msg_id,
            SystemTime::now(),
            None,
            &serde_json::json!({ "code": code, "silent": false, "store_history": true, "user_expressions": {}, "allow_stdin": false }),
        );
        let meta = serde_json::json!({ "nbos_election": { "cell": cell, "round": 0, "role": role, "expected": null } });
        msg.metadata = meta.to_string().into();
        msg
    }

    fn parent_of(msg: &Message) -> String {
        let v: serde_json::Value = serde_json::from_slice(&msg.parent_header).unwrap_or_default();
        v["msg_id"].as_str().unwrap_or_default().to_owned()
    }

    /// Waits for the reply to `msg_id` on `h`'s client; returns (content, metadata, stream text).
    /// Shell and IOPub have no order between them, so when this host executed the cell
    /// it also waits for the cell's `idle` status, which follows the cell's output.
    async fn reply_to(h: &mut Host, msg_id: &str) -> (serde_json::Value, serde_json::Value, String) {
        let deadline = Instant::now() + WAIT;
        let mut streams = String::new();
        let mut idle = false;
        let mut reply: Option<(serde_json::Value, serde_json::Value)> = None;
        loop {
            if let Some((content, meta)) = &reply {
                let executed = meta["nbos_election"]["outcome"] == "executed";
                if idle || !executed {
                    return (content.clone(), meta.clone(), streams);
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let (channel, msg) = tokio::time::timeout(left, h.rx.recv())
                .await
                .unwrap_or_else(|_| panic!("no reply to {msg_id} from node {} within {WAIT:?}", h.node))
                .expect("client queue open");
            if parent_of(&msg) != msg_id {
                continue;
            }
            let header = msg.header().expect("header");
            let content = msg.content_json().expect("content");
            if channel == Channel::Iopub && header.msg_type == "stream" {
                streams.push_str(content["text"].as_str().unwrap_or_default());
            }
            if channel == Channel::Iopub && header.msg_type == "status" {
                idle |= content["execution_state"] == "idle";
            }
            if channel == Channel::Shell && header.msg_type == "execute_reply" {
                let meta: serde_json::Value = serde_json::from_slice(&msg.metadata).expect("metadata");
                reply = Some((content, meta));
            }
        }
    }

    fn unix_us(t: SystemTime) -> u64 {
        u64::try_from(t.duration_since(SystemTime::UNIX_EPOCH).expect("after 1970").as_micros()).expect("u64")
    }

    /// Checks the reply's stamps of when the cell reached its kernel: written between the
    /// request and its reply, and for a kernel with GPUs after binding committed them.
    fn assert_dispatch_stamps(meta: &serde_json::Value, gpus: u32, sent: SystemTime, replied: SystemTime) {
        let e = &meta["nbos_election"];
        let dispatched = e["dispatched_unix_us"].as_u64().unwrap_or_else(|| panic!("no dispatch stamp: {meta}"));
        assert!(unix_us(sent) <= dispatched && dispatched <= unix_us(replied), "{meta}");
        match e["gpus_bound_unix_us"].as_u64() {
            Some(bound) => {
                assert!(gpus > 0, "a kernel without GPUs had them bound: {meta}");
                assert!(unix_us(sent) <= bound && bound <= dispatched, "{meta}");
            }
            None => assert_eq!(gpus, 0, "no GPU binding stamp: {meta}"),
        }
    }

    /// Runs a cell the way a front-end does: `lead` to the designee, `yield` to the rest.
    async fn run_cell(hosts: &mut [Host], designee: usize, code: &str) -> (serde_json::Value, u64, String) {
        let cell = uuid::Uuid::new_v4().to_string();
        let sent = SystemTime::now();
        for (i, h) in hosts.iter().enumerate() {
            let role = if i == designee { "lead" } else { "yield" };
            let handled = h.host.handle_execute(&h.kernel, h.client, request(&cell, code, &cell, role)).await;
            assert!(matches!(handled, Handled::Handled), "an election request passed through");
        }
        let (content, meta, streams) = reply_to(&mut hosts[designee], &cell).await;
        assert_dispatch_stamps(&meta, hosts[designee].kernel.gpus, sent, SystemTime::now());
        let e = &meta["nbos_election"];
        assert_eq!(e["outcome"], "executed", "cell {code:?}: {meta}");
        assert_eq!(e["node_id"], hosts[designee].node);
        assert_eq!(content["status"], "ok", "cell {code:?} failed: {content}");
        let revision = e["revision"].as_u64().expect("revision");
        assert!(revision > 0, "the cell's namespace was not committed: {streams}");
        (content, revision, streams)
    }

    /// Every replica applied `revision` and hashes its namespace the same.
    async fn assert_same_namespace(hosts: &[Host], revision: u64, what: &str) {
        let mut digests = Vec::new();
        for h in hosts {
            let local = h.host.replica(KERNEL).expect("local replica");
            local.applier.wait_applied(revision, WAIT).await.expect("applied");
            digests.push(namespace_digest(&h.kernel, WAIT).await.expect("digest"));
        }
        assert!(digests.iter().all(|d| d == &digests[0] && d.len() >= 32), "{what}: digests differ: {digests:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn replicas_follow_the_executor_and_a_fresh_replica_catches_up() {
        let stores = Stores::open(3);
        stores.create_group(GROUP).await;
        let dir = crate::kernel_tempdir();
        let objects = dir.path().join("objects");
        let mut hosts = Vec::new();
        for node in stores.ids() {
            hosts.push(start_host(&stores, node, &dir.path().join(format!("host-{node}")), &objects).await);
        }

        // Cell 5 changes no names: the followers apply it without running their kernels,
        // and replica 2 still numbers cell 6 after it.
        let cells: [(usize, &str); 6] = [
            (0, "a = 1\ns = 'hello'\nxs = [1, 2, 3]\nd = {'k': [1, 2], 'n': None}\ngone = 0"),
            (1, "import numpy as np\narr = np.arange(10 * 1024 * 1024 // 8, dtype=np.float64)"),
            (2, "def f(x):\n    return x * a + len(s)\nclass C:\n    def __init__(self):\n        self.v = f(2)\nc = C()"),
            (0, "xs.append(4)\nd['k'].append(3)\narr[5] = -1.0\ndel gone"),
            (0, "print(a)"),
            (1, "t = f(10)"),
        ];
        for (n, (designee, code)) in cells.iter().enumerate() {
            let (content, revision, _) = run_cell(&mut hosts, *designee, code).await;
            assert_eq!(content["execution_count"], n + 1, "execution counts follow the cells across replicas");
            assert_same_namespace(&hosts, revision, code).await;
        }
        // The 10 MiB array went to the object store, not through the log.
        let stored = std::fs::read_dir(objects.join("objects")).expect("objects dir").count();
        assert!(stored >= 1, "no large object was stored");

        // A replica that never executed anything sees every value, mutations included.
        let check = "print(xs, d['k'], c.v, f(1), t, arr[5], arr.nbytes, np.__name__, 'gone' in dir())";
        let (_, revision, out) = run_cell(&mut hosts, 2, check).await;
        assert_eq!(out.trim(), "[1, 2, 3, 4] [1, 2, 3] 7 6 15 -1.0 10485760 numpy False");
        assert_same_namespace(&hosts, revision, "check").await;

        // Election records stay bounded: after 6 cells the oldest one's is gone (history 4 + last).
        let kv = hosts[0].host.store().kv(GROUP);
        let elect = kv.range(keys::ELECT.as_bytes(), 0).await.expect("range elect/");
        assert_eq!(elect.len(), 5, "election records of 6 cells with a history of 4: {elect:?}");

        // Inline payloads stay under the group's budget: past it they spill to the object store.
        let before = std::fs::read_dir(objects.join("objects")).expect("objects dir").count();
        let blobs = "for i in range(12):\n    globals()[f'blob{i}'] = bytes([i]) * (900 * 1024)";
        let (_, revision, _) = run_cell(&mut hosts, 0, blobs).await;
        assert_same_namespace(&hosts, revision, "blobs").await;
        let spilled = std::fs::read_dir(objects.join("objects")).expect("objects dir").count() - before;
        assert!(spilled >= 3, "only {spilled} of 12 x 900 KiB values spilled past the 8 MiB inline budget");
        for h in &hosts {
            let inline = h.host.replica(KERNEL).expect("replica").applier.inline_bytes_excluding(&Default::default());
            assert!(inline <= state_sync::GROUP_INLINE_BUDGET, "inline total {inline} over the budget");
            assert!(inline >= 6 * 900 * 1024, "inline total {inline}: small values did not go through the log");
        }
        let (_, revision, _) = run_cell(&mut hosts, 2, "for i in range(12):\n    del globals()[f'blob{i}']").await;
        assert_same_namespace(&hosts, revision, "blobs deleted").await;

        // A cell with more changes than a watch buffers (1,024 events) reaches every replica by
        // catch-up instead: still applied in order, deletes included. The followers are kept
        // busy applying a slow value (its unpickling sleeps) while the big cell commits, so
        // their watches overflow whatever the machine's speed.
        let catch_ups: Vec<u64> =
            hosts.iter().map(|h| h.host.replica(KERNEL).expect("replica").applier.catch_ups()).collect();
        let slow =
            "class Slow:\n    def __setstate__(self, state):\n        import time\n        time.sleep(1.5)\n        \
                    self.__dict__.update(state)\nslow = Slow()\nslow.v = 1";
        run_cell(&mut hosts, 1, slow).await;
        let (_, revision, _) = run_cell(&mut hosts, 1, "for i in range(1500):\n    globals()[f'n{i}'] = i").await;
        assert_same_namespace(&hosts, revision, "1500 names").await;
        let followers: Vec<usize> = vec![0, 2];
        for i in &followers {
            let now = hosts[*i].host.replica(KERNEL).expect("replica").applier.catch_ups();
            assert!(now > catch_ups[*i], "node {}: the big cell did not go through catch-up", hosts[*i].node);
        }
        let (_, revision, out) = run_cell(
            &mut hosts,
            2,
            "print(sum(globals()[f'n{i}'] for i in range(1500)))\nfor i in range(1500):\n    del globals()[f'n{i}']",
        )
        .await;
        assert_eq!(out.trim(), "1124250");
        assert_same_namespace(&hosts, revision, "1500 names deleted").await;
        let (_, revision, _) = run_cell(&mut hosts, 2, "del slow, Slow").await;
        assert_same_namespace(&hosts, revision, "slow deleted").await;

        // An unpicklable value is named in a warning on the cell, not silently dropped.
        let (_, revision, warning) = run_cell(&mut hosts, 1, "import threading\nlock = threading.Lock()").await;
        assert!(warning.contains("lock") && warning.contains("pickle"), "no warning naming `lock`: {warning:?}");
        let (_, revision2, _) = run_cell(&mut hosts, 1, "del lock").await;
        assert!(revision2 > revision);
        assert_same_namespace(&hosts, revision2, "after del lock").await;

        // A second designation for a decided cell is told who won.
        let cell = uuid::Uuid::new_v4().to_string();
        let h0 = &hosts[0];
        h0.host.handle_execute(&h0.kernel, h0.client, request(&cell, "x = 1", &cell, "lead")).await;
        let (_, meta, _) = reply_to(&mut hosts[0], &cell).await;
        assert_eq!(meta["nbos_election"]["outcome"], "executed");
        let h1 = &hosts[1];
        h1.host.handle_execute(&h1.kernel, h1.client, request(&cell, "x = 1", &cell, "lead")).await;
        let (content, meta, _) = reply_to(&mut hosts[1], &cell).await;
        assert_eq!(meta["nbos_election"]["outcome"], "taken", "{meta}");
        assert_eq!(meta["nbos_election"]["record"]["winner"], 1);
        assert_eq!(content["status"], "aborted");
        // Bad election metadata gets an error outcome, not a hang.
        let mut bad = request("bad-1", "x = 2", "bad-1", "lead");
        bad.metadata = serde_json::json!({ "nbos_election": { "cell": 5 } }).to_string().into();
        let h1 = &hosts[1];
        h1.host.handle_execute(&h1.kernel, h1.client, bad).await;
        let (_, meta, _) = reply_to(&mut hosts[1], "bad-1").await;
        assert_eq!(meta["nbos_election"]["outcome"], "error");
        assert!(meta["nbos_election"]["reason"].as_str().unwrap_or_default().contains("nbos_election"), "{meta}");

        // Replica 2 loses its kernel and starts from scratch: it catches up from the group.
        {
            let h = &mut hosts[1];
            h.host.detach(KERNEL);
            assert!(h.kernels.remove(KERNEL).await);
            let (kernel, client, rx) = start_replica(&h.kernels, &h.host, h.node).await;
            (h.kernel, h.client, h.rx) = (kernel, client, rx);
        }
        let latest = hosts[0].host.replica(KERNEL).expect("replica").applier.applied();
        assert_same_namespace(&hosts, latest, "after the fresh replica caught up").await;
        let (content, _, out) = run_cell(&mut hosts, 1, "print(c.v + xs[-1], arr[5])").await;
        assert_eq!(out.trim(), "11 -1.0");
        assert_eq!(content["execution_count"], 17, "the fresh replica continues the execution count");
        // Its own commit reaches its applier and local state a moment after the reply: lag drops
        // to 0 and the replica reports itself as the executor.
        let deadline = Instant::now() + WAIT;
        loop {
            let status = hosts[1].host.replicas().await;
            assert_eq!(status.len(), 1);
            if status[0].lag_revisions == 0 && status[0].role == "executor" {
                break;
            }
            assert!(Instant::now() < deadline, "the executor's replica stays behind or standby: {status:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        // A restart of every replica empties the namespace; the group forgets it too.
        for h in &hosts {
            h.kernel.restart().await.expect("restart");
        }
        let revision = hosts[2].host.reset_namespace(KERNEL).await.expect("reset");
        assert_same_namespace(&hosts, revision, "after restart").await;
        let (content, _, out) = run_cell(&mut hosts, 0, "print('xs' in dir(), 'arr' in dir())").await;
        assert_eq!(out.trim(), "False False");
        assert_eq!(content["execution_count"], 1, "a restarted kernel counts cells from 1");

        for h in &hosts {
            h.kernels.shutdown_all().await;
        }
    }

    /// What a host's lease server was told: when each kernel's GPUs were bound.
    #[derive(Default)]
    struct RecordingLeases {
        bound: Mutex<Vec<(String, SystemTime)>>,
    }

    impl LeaseControl for RecordingLeases {
        fn bind(&self, kernel: &str, _pids: &[u32], _gpus: &[u32]) {
            self.bound.lock().unwrap().push((kernel.to_owned(), SystemTime::now()));
        }
        fn revoke(&self, _kernel: &str, _pids: &[u32], _gpus: &[u32], _preempted: bool) {}
        fn forget(&self, _kernel: &str, _pids: &[u32]) {}
    }

    /// Reads `h`'s client until a stderr stream of `msg_id` contains `needle`.
    async fn stream_of(h: &mut Host, msg_id: &str, needle: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (channel, msg) = tokio::time::timeout(left, h.rx.recv())
                .await
                .unwrap_or_else(|_| panic!("no {needle:?} for {msg_id} on node {} within {WAIT:?}", h.node))
                .expect("client queue open");
            if channel != Channel::Iopub || parent_of(&msg) != msg_id || msg.header().expect("h").msg_type != "stream" {
                continue;
            }
            let text = msg.content_json().expect("content")["text"].as_str().unwrap_or_default().to_owned();
            if text.contains(needle) {
                return text;
            }
        }
    }

    fn gated(gate: &Path) -> String {
        format!("import os, time\nwhile not os.path.exists({:?}):\n    time.sleep(0.01)", gate.display().to_string())
    }

    /// A won cell of a GPU kernel whose host's only GPU another kernel holds waits for it; the
    /// reply's `dispatched_unix_us` then lies after that kernel released the GPU and after the
    /// lease server was told the cell's GPU (when the cell was really written to its kernel).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_won_cell_that_waited_for_its_gpu_is_stamped_when_written_to_its_kernel() {
        let stores = Stores::open(3);
        stores.create_group(GROUP).await;
        let dir = crate::kernel_tempdir();
        let objects = dir.path().join("objects");
        let leases: Vec<Arc<RecordingLeases>> = (0..3).map(|_| Arc::new(RecordingLeases::default())).collect();
        let mut hosts = Vec::new();
        for (node, l) in stores.ids().into_iter().zip(&leases) {
            let d = dir.path().join(format!("host-{node}"));
            hosts.push(start_host_with(&stores, node, &d, &objects, 1, l.clone()).await);
        }
        // The other kernel on host 0 (not replicated), one GPU per cell too.
        let other = hosts[0].kernels.create_replica(OTHER, 0, None, Some(1), &[], None).await.expect("other kernel");
        let (other_client, _other_rx, _) = other.hub.connect();

        // Host 1 runs a cell whose value the followers cannot apply until `apply_gate`
        // exists: host 0's replica stays behind until the test opens it. (The instance
        // needs state: pickle calls `__setstate__` only for an object with some.)
        let apply_gate = dir.path().join("apply-gate");
        let held = format!(
            "class Held:\n    def __setstate__(self, state):\n        import os, time\n        \
             while not os.path.exists({gate:?}):\n            time.sleep(0.01)\n        \
             self.__dict__.update(state)\nheld = Held()\nheld.ready = True",
            gate = apply_gate.display().to_string()
        );
        run_cell(&mut hosts, 1, &held).await;

        // Host 0 wins the next cell while its GPU is free, then catches up before running it.
        let cell = uuid::Uuid::new_v4().to_string();
        let sent = SystemTime::now();
        for (i, h) in hosts.iter().enumerate() {
            let role = if i == 0 { "lead" } else { "yield" };
            let handled = h.host.handle_execute(&h.kernel, h.client, request(&cell, "print('ran')", &cell, role)).await;
            assert!(matches!(handled, Handled::Handled), "an election request passed through");
        }
        // Meanwhile the other kernel takes host 0's GPU until `run_gate` exists.
        let run_gate = dir.path().join("run-gate");
        let other_cell = uuid::Uuid::new_v4().to_string();
        let msg = Message::new(
            "execute_request",
            "other-session",
            &other_cell,
            SystemTime::now(),
            None,
            &serde_json::json!({ "code": gated(&run_gate), "silent": false, "store_history": true, "allow_stdin": false }),
        );
        let binder = hosts[0].kernels.binder().clone();
        assert!(binder.on_client_message(&other, other_client, Channel::Shell, msg).is_none(), "binding took the cell");
        assert_eq!(binder.snapshot().holders, vec![format!("committed:{OTHER}")]);
        // Host 0 catches up; its won cell now waits for the GPU, and its client is told so.
        std::fs::write(&apply_gate, "go").expect("apply gate");
        let waiting = stream_of(&mut hosts[0], &cell, "waiting for 1 GPU").await;
        assert!(waiting.contains("position 1"), "{waiting}");
        let released = SystemTime::now();
        std::fs::write(&run_gate, "go").expect("run gate");

        let (content, meta, _) = reply_to(&mut hosts[0], &cell).await;
        assert_eq!(content["status"], "ok", "{content}");
        assert_eq!(meta["nbos_election"]["node_id"], hosts[0].node, "{meta}");
        assert_dispatch_stamps(&meta, 1, sent, SystemTime::now());
        let bound = meta["nbos_election"]["gpus_bound_unix_us"].as_u64().expect("bound");
        let dispatched = meta["nbos_election"]["dispatched_unix_us"].as_u64().expect("dispatched");
        assert!(bound >= unix_us(released), "GPU bound before the other kernel let it go: {meta}");
        // The lease server was told the cell's GPU before the cell was written to the kernel.
        let told = leases[0].bound.lock().unwrap().iter().filter(|(k, _)| k == KERNEL).map(|(_, t)| *t).max();
        let told = told.expect("the lease server was never told the kernel's GPU");
        assert!(unix_us(released) <= unix_us(told) && unix_us(told) <= dispatched, "told {told:?}: {meta}");

        for h in &hosts {
            h.kernels.shutdown_all().await;
        }
    }
}

mod supervised {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::{Duration, Instant, SystemTime};

    use notebookosd::cluster::cells::objects::Objects;
    use notebookosd::cluster::cells::replica_host::ReplicaHost;
    use notebookosd::cluster::cells::state_sync::{namespace_digest, SyncConfig};
    use notebookosd::cluster::cells::supervisor::Supervisor;
    use notebookosd::cluster::control::records::{self, keys, KernelRecord, LoadRecord, RunningRecord};
    use notebookosd::cluster::{Cluster, ClusterSettings, KernelSpec};
    use notebookosd::jupyter::{Channel, Message};
    use notebookosd::kernel::binding::{Binder, LogOnlyLeases};
    use notebookosd::kernel::Kernels;
    use notebookosd::metrics::Metrics;

    use super::group_store::{python, Stores};

    const WAIT: Duration = Duration::from_secs(60);

    struct Node {
        id: u64,
        cluster: Arc<Cluster>,
        host: Arc<ReplicaHost>,
        kernels: Arc<Kernels>,
        supervisor: tokio::task::JoinHandle<()>,
    }

    fn pick(nodes: &[Node], id: u64) -> &Node {
        nodes.iter().find(|n| n.id == id).expect("node")
    }

    async fn wait_for<T, F: std::future::Future<Output = Option<T>>>(what: &str, mut f: impl FnMut() -> F) -> T {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(v) = f().await {
                return v;
            }
            assert!(Instant::now() < deadline, "{what} did not happen within {WAIT:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn start_node(
        stores: &Stores,
        id: u64,
        seeds: &BTreeMap<u64, std::net::SocketAddr>,
        dir: &std::path::Path,
    ) -> Node {
        let store = stores.node(id).clone();
        // The cluster API (what other hosts forward meta-leader calls to), as the gateway serves it.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the cluster API");
        listener.set_nonblocking(true).expect("nonblocking");
        let gateway_url = format!("http://{}", listener.local_addr().expect("addr"));
        let settings = ClusterSettings {
            node_id: id,
            name: format!("host-{id}"),
            gateway_url,
            raft_addr: store.config().listen,
            seeds: seeds.clone(),
            host_ttl: Duration::from_millis(800),
            replicas: 3,
            subscription_ratio: 1.0,
            placement_wait: std::time::Duration::ZERO,
            sync_inline_max_bytes: 1 << 20,
            object_store: String::new(),
            token: None,
            gpus: Vec::new(),
            memory_bytes: 0,
        };
        let probe: notebookosd::cluster::control::meta::LoadProbe =
            Arc::new(move || Box::pin(async move { LoadRecord { node_id: id, ..Default::default() } }));
        let cluster = Cluster::new(settings, store.clone(), probe);
        cluster.start();
        let objects = Objects::open(None, &dir.join("objects")).expect("objects");
        let collector = notebookosd::cluster::cells::object_collector::Collector::new(
            cluster.clone(),
            objects,
            Duration::from_secs(3600),
        );
        let api = notebookosd::cluster::http::router(cluster.clone(), collector, Default::default());
        let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
        tokio::spawn(async move { axum::serve(listener, api).await });
        let (host, kernels, supervisor) = start_replica_side(stores, id, &cluster, dir, 0);
        Node { id, cluster, host, kernels, supervisor }
    }

    /// The replica side of a host (what a daemon restart rebuilds): registry, replica host, supervisor.
    fn start_replica_side(
        stores: &Stores,
        id: u64,
        cluster: &Arc<Cluster>,
        dir: &std::path::Path,
        generation: u32,
    ) -> (Arc<ReplicaHost>, Arc<Kernels>, tokio::task::JoinHandle<()>) {
        let metrics = Arc::new(Metrics::new());
        let binder = Binder::new(0, Duration::from_secs(60), 1.0, Arc::new(LogOnlyLeases), metrics.clone());
        let kdir = dir.join(format!("host-{id}-{generation}"));
        let kernels = Arc::new(Kernels::new(python(), kdir.join("kernels"), Vec::new(), metrics, binder, 0));
        let mut sync = SyncConfig::new(kdir.join("sync"));
        sync.kernel_timeout = WAIT;
        let objects = Objects::open(None, &dir.join("objects")).expect("objects");
        let host = Arc::new(ReplicaHost::new(id, stores.node(id).clone(), kernels.clone(), objects, sync));
        let supervisor = Supervisor::start(cluster.clone(), host.clone());
        (host, kernels, supervisor)
    }

    /// Runs `code` as the won cell of `node` (round 0, designated lead); returns its stdout.
    async fn run_on(node: &Node, kernel_id: &str, code: &str) -> (String, u64) {
        let (out, reply, meta) = send_cell(node, kernel_id, code).await;
        assert_eq!(meta["nbos_election"]["outcome"], "executed", "{meta} {reply}");
        assert_eq!(reply["status"], "ok", "{reply}");
        (out, meta["nbos_election"]["revision"].as_u64().expect("revision"))
    }

    /// Sends `code` as the won cell of `node`; returns its stdout, reply content and metadata.
    async fn send_cell(node: &Node, kernel_id: &str, code: &str) -> (String, serde_json::Value, serde_json::Value) {
        let kernel = node.kernels.get(kernel_id).await.expect("local replica");
        let (client, mut rx, _) = kernel.hub.connect();
        let cell = uuid::Uuid::new_v4().to_string();
        let mut msg = Message::new(
            "execute_request",
            "s",
            &cell,
            SystemTime::now(),
            None,
            &serde_json::json!({ "code": code, "silent": false, "store_history": true, "user_expressions": {}, "allow_stdin": false }),
        );
        msg.metadata =
            serde_json::json!({ "nbos_election": { "cell": cell, "round": 0, "role": "lead", "expected": null } })
                .to_string()
                .into();
        node.host.handle_execute(&kernel, client, msg).await;
        let mut out = String::new();
        // Output (IOPub) and reply (shell) have no order between them: the cell is
        // over once the reply and the cell's idle status are both in.
        let mut idle = false;
        let mut reply = None;
        loop {
            if let (true, Some((content, meta))) = (idle, reply.take()) {
                kernel.hub.disconnect(client);
                return (out, content, meta);
            }
            let (channel, m) = tokio::time::timeout(WAIT, rx.recv()).await.expect("reply in time").expect("open");
            let parent: serde_json::Value = serde_json::from_slice(&m.parent_header).unwrap_or_default();
            if parent["msg_id"] != cell.as_str() {
                continue;
            }
            let h = m.header().expect("header");
            let c = m.content_json().expect("content");
            if channel == Channel::Iopub && h.msg_type == "stream" {
                out.push_str(c["text"].as_str().unwrap_or_default());
            }
            if channel == Channel::Iopub && h.msg_type == "status" {
                idle |= c["execution_state"] == "idle";
            }
            if channel == Channel::Shell && h.msg_type == "execute_reply" {
                let meta: serde_json::Value = serde_json::from_slice(&m.metadata).expect("meta");
                reply = Some((c, meta));
            }
        }
    }

    /// Four hosts (stores, meta group, supervisors) and one kernel placed on three of them,
    /// every replica ready.
    struct FourHosts {
        stores: Stores,
        dir: tempfile::TempDir,
        nodes: Vec<Node>,
        leader: u64,
        record: KernelRecord,
    }

    async fn four_hosts_with_a_kernel() -> FourHosts {
        let stores = Stores::open(4);
        let dir = crate::kernel_tempdir();
        let seeds: BTreeMap<u64, std::net::SocketAddr> =
            stores.ids().into_iter().map(|id| (id, stores.node(id).config().listen)).collect();
        let nodes: Vec<Node> = stores.ids().into_iter().map(|id| start_node(&stores, id, &seeds, dir.path())).collect();
        wait_for("every host registered", || async {
            (pick(&nodes, 1).cluster.hosts().await.ok()?.len() == 4).then_some(())
        })
        .await;
        let leader = wait_for("a meta leader", || async { pick(&nodes, 1).cluster.meta_leader().await }).await;
        let record: KernelRecord = pick(&nodes, leader)
            .cluster
            .create_kernel_here(KernelSpec { name: "python3".into(), ..Default::default() })
            .await
            .expect("create kernel");
        assert_eq!(record.replicas.len(), 3);
        let id = record.id.clone();
        wait_for("three ready replicas", || async {
            (pick(&nodes, 1).cluster.ready_hosts(&id).await.ok()?.len() == 3).then_some(())
        })
        .await;
        FourHosts { stores, dir, nodes, leader, record }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn supervisors_start_replicas_and_replace_a_lost_one() {
        if let Ok(filter) = std::env::var("NBOS_TEST_LOG") {
            let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
        }
        // A snapshot after every applied entry: a joining replica can only be sent a snapshot
        // whose membership includes it (raft refuses others), and the store takes snapshots
        // only every `snapshot_interval` entries (see the report on raft-store).
        let FourHosts { stores, dir, mut nodes, leader, record } = four_hosts_with_a_kernel().await;
        let id = record.id.clone();
        let placed: Vec<u64> = record.replicas.iter().map(|r| r.node_id).collect();
        for n in &placed {
            assert!(pick(&nodes, *n).kernels.get(&id).await.is_some(), "no local replica on host {n}");
        }
        let spare = stores.ids().into_iter().find(|n| !placed.contains(n)).expect("a spare host");
        assert!(pick(&nodes, spare).kernels.get(&id).await.is_none(), "a replica on the host without placement");

        let first = placed[0];
        let (_, rev) = run_on(pick(&nodes, first), &id, "v = 41\nclass K:\n    w = 1").await;

        // A daemon restart on a replica host: its replica comes back and catches up from the group.
        let restarted = placed[1];
        let digest_before =
            namespace_digest(&pick(&nodes, first).kernels.get(&id).await.expect("k"), WAIT).await.expect("digest");
        {
            let n = nodes.iter_mut().find(|n| n.id == restarted).expect("node");
            n.supervisor.abort();
            n.kernels.shutdown_all().await;
            n.host.detach(&id);
            (n.host, n.kernels, n.supervisor) = start_replica_side(&stores, restarted, &n.cluster, dir.path(), 1);
        }
        let again = wait_for("the restarted host's replica", || async {
            let r = pick(&nodes, restarted).host.replica(&id)?;
            (r.applier.catch_ups() >= 1 && r.applier.applied() >= rev).then_some(())
        })
        .await;
        let _: () = again;
        let k = pick(&nodes, restarted).kernels.get(&id).await.expect("restarted replica");
        assert_eq!(namespace_digest(&k, WAIT).await.expect("digest"), digest_before, "restarted replica differs");

        // Its kernel process is killed: the supervisor starts a new one, which catches up.
        let old_pid = k.pids()[0];
        // SAFETY: kill(2) on a kernel process this test started.
        unsafe { libc::kill(i32::try_from(old_pid).expect("pid"), libc::SIGKILL) };
        let k = wait_for("a new kernel after the old one died", || async {
            let k = pick(&nodes, restarted).kernels.get(&id).await?;
            let r = pick(&nodes, restarted).host.replica(&id)?;
            let fresh = k.pids().first().is_some_and(|p| *p != old_pid);
            (fresh && r.applier.catch_ups() >= 1 && r.applier.applied() >= rev).then_some(k)
        })
        .await;
        assert_eq!(namespace_digest(&k, WAIT).await.expect("digest"), digest_before, "re-created replica differs");

        // A replica host that does not lead the meta group dies.
        let dead = *placed.iter().find(|n| **n != leader && **n != first).expect("a non-leader replica host");
        pick(&nodes, dead).supervisor.abort();
        pick(&nodes, dead).cluster.shutdown().await;
        pick(&nodes, dead).kernels.shutdown_all().await;
        for other in stores.ids().into_iter().filter(|o| *o != dead) {
            stores.node(other).set_peer_blocked(dead, true);
            stores.node(dead).set_peer_blocked(other, true);
        }

        // The meta leader re-places it on the spare host, which joins the group and catches up.
        let replaced = wait_for("re-placement on the spare host", || async {
            let r = pick(&nodes, leader).cluster.kernel(&id).await.ok()??;
            r.replicas.iter().any(|x| x.node_id == spare).then_some(r)
        })
        .await;
        assert!(replaced.replicas.iter().all(|x| x.node_id != dead));
        wait_for("the spare host's replica ready", || async {
            pick(&nodes, leader).cluster.ready_hosts(&id).await.ok()?.contains(&spare).then_some(())
        })
        .await;
        let voters = wait_for("group voters follow the record", || async {
            let s = stores.node(first).status(record.group).await.ok()?;
            let mut v = s.membership.voters.clone();
            v.sort_unstable();
            (s.membership.voters_outgoing.is_empty() && !v.contains(&dead) && v.contains(&spare)).then_some(v)
        })
        .await;
        assert_eq!(voters.len(), 3, "{voters:?}");

        let a = namespace_digest(&pick(&nodes, first).kernels.get(&id).await.expect("k"), WAIT).await.expect("digest");
        let b = namespace_digest(&pick(&nodes, spare).kernels.get(&id).await.expect("k"), WAIT).await.expect("digest");
        assert_eq!(a, b, "the replacement replica's namespace differs");
        let (out, _) = run_on(pick(&nodes, spare), &id, "print(v + K.w)").await;
        assert_eq!(out.trim(), "42");

        // Deleting the kernel stops every replica and its group.
        pick(&nodes, leader).cluster.delete_kernel(&id).await.expect("delete");
        for n in nodes.iter().filter(|n| n.id != dead) {
            wait_for("replica stopped", || async { n.kernels.get(&id).await.is_none().then_some(()) }).await;
            let groups = wait_for("group destroyed", || async {
                let g = stores.node(n.id).groups().await.ok()?;
                (!g.contains(&record.group)).then_some(g)
            })
            .await;
            assert!(!groups.contains(&record.group));
        }
        for n in &nodes {
            n.supervisor.abort();
            n.kernels.shutdown_all().await;
            n.cluster.shutdown().await;
        }
    }

    /// Fault campaign, `kill_restart` and `cluster_restart`: the host whose replica executed the
    /// group's latest cell restarts; its new kernel process must get that cell's names too
    /// (it came back without them and every later cell there failed with a NameError).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn kill_restart_of_the_last_cells_executor_gives_its_new_kernel_every_name() {
        let FourHosts { stores, dir, mut nodes, leader: _, record } = four_hosts_with_a_kernel().await;
        let id = record.id.clone();
        let executor = record.replicas[0].node_id;
        run_on(pick(&nodes, executor), &id, "log = [1]\ncounter = 1").await;
        let (_, rev) = run_on(pick(&nodes, executor), &id, "log.append(2)").await;
        let digest_before =
            namespace_digest(&pick(&nodes, executor).kernels.get(&id).await.expect("k"), WAIT).await.expect("digest");
        {
            let n = nodes.iter_mut().find(|n| n.id == executor).expect("node");
            n.supervisor.abort();
            n.kernels.shutdown_all().await;
            n.host.detach(&id);
            (n.host, n.kernels, n.supervisor) = start_replica_side(&stores, executor, &n.cluster, dir.path(), 1);
        }
        wait_for("the restarted executor's replica", || async {
            let r = pick(&nodes, executor).host.replica(&id)?;
            (r.applier.catch_ups() >= 1 && r.applier.applied() >= rev).then_some(())
        })
        .await;
        let k = pick(&nodes, executor).kernels.get(&id).await.expect("restarted replica");
        assert_eq!(namespace_digest(&k, WAIT).await.expect("digest"), digest_before, "restarted executor differs");
        let (out, _) = run_on(pick(&nodes, executor), &id, "log.append(3)\nprint(log, counter)").await;
        assert_eq!(out.trim(), "[1, 2, 3] 1", "the restarted executor's kernel lost names of its last cell");
        for n in &nodes {
            n.supervisor.abort();
            n.kernels.shutdown_all().await;
            n.cluster.shutdown().await;
        }
    }

    /// Fault campaign, `isolate`: the executor's host is cut off while a cell runs there, and
    /// another host's front-end takes the kernel's running lock over; the cell's commit is
    /// refused (`NamespaceSyncFailed`). The names the refused cell created stayed in that
    /// replica's kernel for good, and its digest differed from the others' from then on: the
    /// kernel must be started afresh with the group's namespace.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn isolate_of_a_running_executor_restarts_its_kernel_without_the_refused_cell() {
        let FourHosts { stores, dir, nodes, leader: _, record } = four_hosts_with_a_kernel().await;
        let id = record.id.clone();
        let executor = record.replicas[0].node_id;
        let other = record.replicas[1].clone();
        let (_, rev) = run_on(pick(&nodes, executor), &id, "log = [1]").await;
        let old_pid = pick(&nodes, executor).kernels.get(&id).await.expect("k").pids()[0];
        let kv = stores.node(executor).kv(record.group);
        let gate = dir.path().join("gate");
        let code = format!(
            "import os, time\nf_refused = 1\nlog.append(2)\nwhile not os.path.exists({:?}): time.sleep(0.02)",
            gate.display().to_string()
        );
        let steal = async {
            // The cell holds the lock while it runs; the other front-end takes it over (its
            // rule when the holder's host looks gone), then the cell ends.
            wait_for("the running cell's lock", || async {
                let got = kv.get(keys::RUNNING.as_bytes()).await.ok()??;
                let r: RunningRecord = records::decode(&got.key, &got.value).ok()?;
                (r.node_id == executor).then_some(())
            })
            .await;
            let thief = RunningRecord {
                cell: "another-front-ends-cell".into(),
                replica: other.replica,
                node_id: other.node_id,
            };
            kv.put(keys::RUNNING.as_bytes(), records::encode(&thief)).await.expect("take the lock over");
            std::fs::write(&gate, b"").expect("open the gate");
        };
        let ((_, reply, _), ()) = tokio::join!(send_cell(pick(&nodes, executor), &id, &code), steal);
        assert_eq!(reply["ename"], "NamespaceSyncFailed", "{reply}");
        // The other front-end's cell ends.
        kv.delete(keys::RUNNING.as_bytes()).await.expect("release the lock");

        let k = wait_for("a new kernel in place of the diverged one", || async {
            let k = pick(&nodes, executor).kernels.get(&id).await?;
            let r = pick(&nodes, executor).host.replica(&id)?;
            let fresh = k.pids().first().is_some_and(|p| *p != old_pid);
            (fresh && r.applier.catch_ups() >= 1 && r.applier.applied() >= rev && r.applier.broken().is_none())
                .then_some(k)
        })
        .await;
        let theirs = namespace_digest(&pick(&nodes, other.node_id).kernels.get(&id).await.expect("k"), WAIT)
            .await
            .expect("digest");
        assert_eq!(
            namespace_digest(&k, WAIT).await.expect("digest"),
            theirs,
            "the isolated executor's replica differs"
        );
        let (out, _) = run_on(pick(&nodes, executor), &id, "print('f_refused' in globals(), log)").await;
        assert_eq!(out.trim(), "False [1]", "the refused cell's changes stayed in the replica's kernel");
        for n in &nodes {
            n.supervisor.abort();
            n.kernels.shutdown_all().await;
            n.cluster.shutdown().await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_replica_whose_group_failed_on_its_host_is_placed_elsewhere() {
        let FourHosts { stores, dir: _dir, nodes, leader, record } = four_hosts_with_a_kernel().await;
        let id = record.id.clone();
        let placed: Vec<u64> = record.replicas.iter().map(|r| r.node_id).collect();
        let spare = stores.ids().into_iter().find(|n| !placed.contains(n)).expect("a spare host");
        let first = placed[0];
        run_on(pick(&nodes, first), &id, "v = 41").await;
        // Leadership follows the executor. A follower then loses its log while that leader
        // still counts it as caught up (a replica that loses its log under a *new* leader is
        // caught up by snapshot instead, and nothing fails).
        wait_for("the executor's host leads the group", || async {
            (stores.node(first).status(record.group).await.ok()?.leader == Some(first)).then_some(())
        })
        .await;
        let broken = *placed.iter().find(|n| **n != first).expect("a follower");

        // Host `broken` loses its log of the group while the group still counts it: raft
        // asserts there; the store stops that group on that host only.
        stores.node(broken).destroy_group(record.group).await.expect("destroy");
        stores.node(broken).join_group(record.group).await.expect("join with an empty log");
        // The group hibernates while idle; its next cell wakes it, and the leader's heartbeats
        // reach the broken host.
        run_on(pick(&nodes, first), &id, "v += 0").await;
        wait_for("the group stopped on the broken host", || async {
            matches!(stores.node(broken).status(record.group).await, Err(raft_store::Error::GroupFailed { .. }))
                .then_some(())
        })
        .await;

        // Its supervisor has the replica placed elsewhere; the spare host takes it and catches up.
        let moved = wait_for("re-placement off the broken host", || async {
            let r = pick(&nodes, leader).cluster.kernel(&id).await.ok()??;
            r.replicas.iter().all(|x| x.node_id != broken).then_some(r)
        })
        .await;
        assert!(moved.replicas.iter().any(|x| x.node_id == spare), "{moved:?}");
        wait_for("the spare host's replica ready", || async {
            pick(&nodes, leader).cluster.ready_hosts(&id).await.ok()?.contains(&spare).then_some(())
        })
        .await;
        wait_for("the broken host's replica stopped and its group destroyed", || async {
            let gone = pick(&nodes, broken).kernels.get(&id).await.is_none();
            let groups = stores.node(broken).groups().await.ok()?;
            (gone && !groups.contains(&record.group)).then_some(())
        })
        .await;
        let (out, _) = run_on(pick(&nodes, spare), &id, "print(v + 1)").await;
        assert_eq!(out.trim(), "42");
        for n in &nodes {
            n.supervisor.abort();
            n.kernels.shutdown_all().await;
            n.cluster.shutdown().await;
        }
    }
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
