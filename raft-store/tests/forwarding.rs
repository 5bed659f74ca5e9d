//! Forwarding to the leader and transactions on 3-node clusters inside the test process (real
//! stores, real TLS connections on loopback): any member node serves writes and linearizable reads.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use raft_store::{
    Compare, Error, Kv, MembershipChange, NodeTlsFiles, RaftStore, StoreConfig, Txn, TxnOp, TxnOpResult, WatchEventKind,
};

const G: u64 = 1;

fn free_addr() -> SocketAddr {
    raft_store::service::free_loopback_addr().expect("free port")
}

struct Nodes {
    dir: tempfile::TempDir,
    addrs: BTreeMap<u64, SocketAddr>,
    stores: BTreeMap<u64, RaftStore>,
    request_timeout: Duration,
    max_frame_bytes: usize,
}

impl Nodes {
    async fn start(n: u64, request_timeout: Duration) -> Nodes {
        Nodes::start_with(n, request_timeout, 16 << 20).await
    }

    async fn start_with(n: u64, request_timeout: Duration, max_frame_bytes: usize) -> Nodes {
        let dir = tempfile::tempdir().expect("tempdir");
        let ids: Vec<u64> = (1..=n).collect();
        raft_store::generate_cluster_pki(&dir.path().join("pki"), &ids).expect("pki");
        let addrs: BTreeMap<u64, SocketAddr> = ids.iter().map(|id| (*id, free_addr())).collect();
        let mut nodes = Nodes { dir, addrs, stores: BTreeMap::new(), request_timeout, max_frame_bytes };
        for id in ids.clone() {
            nodes.open(id);
            nodes.stores[&id].create_group(G, &ids).await.expect("create group");
        }
        nodes
    }

    fn config(&self, id: u64) -> StoreConfig {
        let pki = self.dir.path().join("pki");
        let data: PathBuf = self.dir.path().join(format!("node-{id}"));
        let mut cfg = StoreConfig::new(id, data, self.addrs[&id], NodeTlsFiles::in_dir(&pki, id).security());
        cfg.peers = self.addrs.iter().filter(|(n, _)| **n != id).map(|(n, a)| (*n, *a)).collect();
        cfg.tick_interval = Duration::from_millis(50);
        cfg.request_timeout = self.request_timeout;
        cfg.snapshot_interval = 50;
        cfg.max_frame_bytes = self.max_frame_bytes;
        cfg
    }

    fn open(&mut self, id: u64) {
        let store = RaftStore::open(self.config(id)).expect("open store");
        self.stores.insert(id, store);
    }

    /// Stops a node (its connections close, as when the process dies).
    fn stop(&mut self, id: u64) {
        self.stores.remove(&id);
    }

    async fn leader(&self, within: Duration) -> u64 {
        let deadline = Instant::now() + within;
        loop {
            for (id, s) in &self.stores {
                if s.status(G).await.is_ok_and(|st| st.role == "leader") {
                    return *id;
                }
            }
            assert!(Instant::now() < deadline, "no leader of group {G} within {within:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn kv(&self, id: u64) -> Kv {
        self.stores[&id].kv(G)
    }
}

fn value(kv: Option<raft_store::KeyValue>) -> Option<String> {
    kv.map(|k| String::from_utf8_lossy(&k.value).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_works_from_each_follower() {
    let nodes = Nodes::start(3, Duration::from_secs(5)).await;
    let leader = nodes.leader(Duration::from_secs(20)).await;
    let followers: Vec<u64> = nodes.stores.keys().copied().filter(|&n| n != leader).collect();
    for &f in &followers {
        // A follower names the leader once it has heard from it (the first heartbeat).
        let deadline = Instant::now() + Duration::from_secs(10);
        while !nodes.stores[&f].status(G).await.is_ok_and(|st| st.leader == Some(leader)) {
            assert!(Instant::now() < deadline, "follower {f} never learned leader {leader}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let kv = nodes.kv(f);
        let k = format!("f{f}");
        // Without forwarding a follower refuses and names the leader, as before.
        let refused = kv.clone().local_only().put(k.clone(), "x").await;
        assert!(matches!(refused, Err(Error::NotLeader { hint: Some(h), .. }) if h == leader), "{refused:?}");
        kv.put(format!("{k}/a"), "1").await.expect("put from follower");
        assert_eq!(value(kv.get(format!("{k}/a")).await.expect("get")), Some("1".into()));
        let cas = kv.cas(format!("{k}/a"), Some(b"1".to_vec()), "2").await.expect("cas");
        assert!(cas.succeeded);
        let cas = kv.cas(format!("{k}/a"), Some(b"1".to_vec()), "3").await.expect("cas");
        assert!(!cas.succeeded && cas.previous == Some(b"2".to_vec()));
        kv.put(format!("{k}/b"), "b").await.expect("put");
        let keys: Vec<_> = kv.range(format!("{k}/"), 0).await.expect("range").into_iter().map(|kv| kv.key).collect();
        assert_eq!(keys, vec![format!("{k}/a").into_bytes(), format!("{k}/b").into_bytes()]);
        assert!(kv.delete(format!("{k}/b")).await.expect("delete"));
        assert!(!kv.delete(format!("{k}/b")).await.expect("delete"));
        // Leases: grant, attach, keep alive and revoke, all from the follower.
        let lease = kv.lease_grant(Duration::from_secs(30)).await.expect("grant");
        kv.put_with_lease(format!("{k}/leased"), "up", lease).await.expect("put with lease");
        assert_eq!(kv.lease_keepalive(lease).await.expect("keepalive"), 30_000);
        assert!(matches!(kv.lease_keepalive(7).await, Err(Error::LeaseNotFound(7))), "typed error carried back");
        assert!(matches!(kv.put_with_lease("x", "y", 7).await, Err(Error::LeaseNotFound(7))));
        assert!(kv.lease_revoke(lease).await.expect("revoke"));
        assert!(kv.get(format!("{k}/leased")).await.expect("get").is_none(), "revoke deleted the leased key");
        // A transaction from the follower.
        let txn = Txn::new()
            .when(Compare::value_equals(format!("{k}/a"), "2"))
            .and_then(TxnOp::put(format!("{k}/t1"), "x"))
            .and_then(TxnOp::delete(format!("{k}/a")))
            .or_else(TxnOp::put(format!("{k}/failed"), "x"));
        let r = kv.txn(txn).await.expect("txn");
        assert!(r.succeeded);
        assert_eq!(r.results, vec![TxnOpResult::Put, TxnOpResult::Delete { existed: true }]);
        // Linearizable: the leader sees it at once, and the follower's own linearizable read too.
        assert_eq!(value(nodes.kv(leader).get(format!("{k}/t1")).await.expect("get")), Some("x".into()));
        assert!(kv.get(format!("{k}/a")).await.expect("get").is_none());
        let m = nodes.stores[&f].metrics();
        assert!(m.forwarded_count("write", "ok") >= 8, "{}", nodes.stores[&f].metrics_text());
        assert!(m.forwarded_count("read", "ok") >= 4);
    }
    assert!(nodes.stores[&leader]
        .metrics_text()
        .contains("notebookos_raft_forward_served_requests_total{outcome=\"ok\"}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_is_one_revision_for_watchers_and_survives_snapshot_and_restart() {
    let mut nodes = Nodes::start(3, Duration::from_secs(5)).await;
    let leader = nodes.leader(Duration::from_secs(20)).await;
    let followers: Vec<u64> = nodes.stores.keys().copied().filter(|&n| n != leader).collect();
    let (watching, writing) = (followers[0], followers[1]);
    let kv = nodes.kv(writing);
    for i in 0..3 {
        kv.put(format!("ns/old{i}"), "x").await.expect("put");
    }
    // The watch is served by a follower from its own applied state (which may lag: start it
    // from a known revision rather than from "now").
    let last = kv.get("ns/old2").await.expect("get").expect("present").mod_revision;
    let mut watch = nodes.kv(watching).watch("ns", last + 1).await.expect("watch");
    let txn = Txn::new()
        .when(Compare::absent("ns-cell"))
        .when(Compare::present("ns/old0"))
        .and_then(TxnOp::delete_prefix("ns/old"))
        .and_then(TxnOp::put("ns/a", "1"))
        .and_then(TxnOp::put("ns/b", "2"))
        .and_then(TxnOp::put("ns-cell", "1"));
    let r = kv.txn(txn.clone()).await.expect("txn");
    assert!(r.succeeded);
    assert_eq!(r.results[0], TxnOpResult::DeletePrefix { deleted: 3 });
    let mut events = Vec::new();
    while events.len() < 6 {
        let ev =
            tokio::time::timeout(Duration::from_secs(10), watch.next()).await.expect("event in time").expect("event");
        events.push(ev);
    }
    assert!(events.iter().all(|e| e.revision == r.revision), "one txn, one revision: {events:?}");
    let kinds: Vec<_> = events.iter().map(|e| e.kind).collect();
    assert_eq!(kinds.iter().filter(|k| **k == WatchEventKind::Delete).count(), 3);
    // Compares fail now: the failure branch (empty) runs and nothing changes.
    let again = kv.txn(txn).await.expect("txn");
    assert!(!again.succeeded && again.results.is_empty());
    // A lease that does not exist refuses the whole transaction.
    let bad = Txn::new().and_then(TxnOp::delete("ns/a")).and_then(TxnOp::put_with_lease("ns/c", "3", 12345));
    assert!(matches!(kv.txn(bad).await, Err(Error::LeaseNotFound(12345))));
    assert!(kv.get("ns/a").await.expect("get").is_some(), "a refused txn changes nothing");
    // Past the snapshot interval: the transaction now lives in a snapshot, not in the log.
    for i in 0..60 {
        kv.put(format!("fill/{i}"), "x").await.expect("put");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    for id in [1, 2, 3] {
        while nodes.stores[&id].status(G).await.expect("status").snapshot_index <= r.revision {
            assert!(Instant::now() < deadline, "node {id} took no snapshot past the txn");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    drop((kv, watch)); // every handle of a store must go for it to close
    for id in [1, 2, 3] {
        nodes.stop(id);
    }
    for id in [1, 2, 3] {
        nodes.open(id);
    }
    nodes.leader(Duration::from_secs(20)).await;
    for id in [1, 2, 3] {
        let kv = nodes.kv(id);
        let got: Vec<(Vec<u8>, Vec<u8>)> =
            kv.range("ns", 0).await.expect("range").into_iter().map(|k| (k.key, k.value)).collect();
        let want = vec![
            (b"ns-cell".to_vec(), b"1".to_vec()),
            (b"ns/a".to_vec(), b"1".to_vec()),
            (b"ns/b".to_vec(), b"2".to_vec()),
        ];
        assert_eq!(got, want, "node {id} after restart");
        let rec = kv.get("ns/a").await.expect("get").expect("present");
        assert_eq!(rec.mod_revision, r.revision);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_to_a_dead_leader_ends_with_a_clear_error() {
    let timeout = Duration::from_millis(1500);
    let mut nodes = Nodes::start(3, timeout).await;
    let leader = nodes.leader(Duration::from_secs(20)).await;
    let followers: Vec<u64> = nodes.stores.keys().copied().filter(|&n| n != leader).collect();
    let (survivor, other) = (followers[0], followers[1]);
    nodes.kv(survivor).put("k", "v").await.expect("put through the live leader");
    // A leader that went silent without closing its connection: the forwarded write is sent and
    // never answered. The call must end at its deadline, saying the outcome is unknown (or, if the
    // survivor had already given up on that leader, that nothing was proposed).
    nodes.stop(other);
    nodes.stores[&survivor].set_peer_blocked(leader, true);
    nodes.stores[&leader].set_peer_blocked(survivor, true);
    let started = Instant::now();
    let r = tokio::time::timeout(timeout * 3, nodes.kv(survivor).put("k", "w")).await.expect("no hang");
    let e = r.expect_err("no quorum: the write cannot succeed");
    eprintln!("silent leader: {e} after {:?}", started.elapsed());
    assert!(
        matches!(e, Error::Timeout { .. } | Error::NotLeader { hint: None, .. } | Error::LeaderUnreachable { .. }),
        "unexpected error: {e:?}"
    );
    if matches!(e, Error::Timeout { .. }) {
        assert!(e.outcome_unknown());
    }
    // The leader's process is gone (connection closed): reads and writes end with "not proposed".
    nodes.stop(leader);
    for read in [false, true] {
        let kv = nodes.kv(survivor);
        let started = Instant::now();
        let r = if read {
            tokio::time::timeout(timeout * 3, kv.get("k")).await.expect("no hang").map(|_| ())
        } else {
            tokio::time::timeout(timeout * 3, kv.put("k", "x")).await.expect("no hang")
        };
        let e = r.expect_err("no leader");
        eprintln!("dead leader: {e} after {:?}", started.elapsed());
        assert!(
            matches!(e, Error::NotLeader { hint: None, .. } | Error::LeaderUnreachable { .. }),
            "unexpected error: {e:?}"
        );
        assert!(!e.outcome_unknown(), "nothing was sent, so nothing was proposed: {e}");
    }
    // Stale reads still answer from the survivor's own state.
    let stale = nodes.kv(survivor).get_stale("k").await.expect("stale read");
    assert_eq!(stale.kvs[0].value, b"v".to_vec());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_requests_and_answers_get_a_clear_error_and_change_nothing() {
    const MAX: usize = 64 << 10;
    let nodes = Nodes::start_with(3, Duration::from_secs(5), MAX).await;
    let leader = nodes.leader(Duration::from_secs(20)).await;
    let follower = nodes.stores.keys().copied().find(|&n| n != leader).expect("follower");
    let kv = nodes.kv(follower);
    // A write that cannot fit in one log entry frame is refused before anything is proposed,
    // on a follower and on the leader alike.
    for id in [follower, leader] {
        let e = nodes.kv(id).put("big", vec![b'x'; MAX]).await.expect_err("too large");
        assert!(matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("limit"), "{e}");
        let big_txn =
            Txn::new().and_then(TxnOp::put("a", vec![b'x'; MAX / 2])).and_then(TxnOp::put("b", vec![b'x'; MAX]));
        assert!(matches!(nodes.kv(id).txn(big_txn).await, Err(Error::InvalidArgument(_))));
    }
    assert!(kv.get("big").await.expect("get").is_none());
    // Many values that fit one by one, but not all in one forwarded answer.
    for i in 0..12 {
        kv.put(format!("r/{i:02}"), vec![b'v'; 8 << 10]).await.expect("put");
    }
    let e = kv.range("r/", 0).await.expect_err("answer too large for one frame");
    assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("frame cap")), "{e}");
    assert_eq!(kv.range("r/", 4).await.expect("a limited range fits").len(), 4);
    assert_eq!(nodes.kv(leader).range("r/", 0).await.expect("at the leader").len(), 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_lost_its_log_stops_that_group_only_and_is_repaired_by_rejoining() {
    let nodes = Nodes::start(3, Duration::from_secs(5)).await;
    let leader = nodes.leader(Duration::from_secs(20)).await;
    let f = nodes.stores.keys().copied().find(|&n| n != leader).expect("follower");
    for i in 0..20 {
        nodes.kv(leader).put(format!("k{i:02}"), format!("{i}")).await.expect("put");
    }
    // Another group on the same node, which must keep working.
    let store = &nodes.stores[&f];
    store.create_group(2, &[f]).await.expect("create group 2");
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.kv(2).put("mine", "1").await.is_err() {
        assert!(Instant::now() < deadline, "group 2 never took a write");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The member's log of G is lost while the group still counts it as caught up (a wiped
    // disk, a node id reused): raft asserts on the leader's next heartbeat. That must stop G on
    // this node, not the process.
    store.destroy_group(G).await.expect("destroy");
    store.join_group(G).await.expect("join with an empty log");
    let deadline = Instant::now() + Duration::from_secs(10);
    let reason = loop {
        match store.status(G).await {
            Err(Error::GroupFailed { group, reason }) => {
                assert_eq!(group, G);
                break reason;
            }
            other => assert!(Instant::now() < deadline, "group {G} not stopped on node {f}: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(reason.contains("panicked"), "{reason}");
    let e = store.kv(G).put("x", "y").await.expect_err("a stopped group refuses calls");
    assert!(matches!(e, Error::GroupFailed { .. }) && !e.outcome_unknown(), "{e:?}");
    assert_eq!(store.metrics().groups_failed.get(), 1, "{}", store.metrics_text());
    // The node and its other group go on; the other members keep the group available.
    store.kv(2).put("mine", "2").await.expect("group 2 still works");
    assert_eq!(value(store.kv(2).get("mine").await.expect("get")), Some("2".into()));
    nodes.kv(leader).put("after", "1").await.expect("the other two members still commit");
    assert!(matches!(store.create_group(G, &[f]).await, Err(Error::GroupExists(G))));

    // Repair: out of the group, destroyed here, joined again; it catches up.
    nodes.stores[&leader].change_membership(G, &[MembershipChange::Remove(f)]).await.expect("remove");
    store.destroy_group(G).await.expect("destroy the stopped group");
    store.join_group(G).await.expect("join again");
    nodes.stores[&leader].change_membership(G, &[MembershipChange::AddVoter(f)]).await.expect("add back");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = store.kv(G).get_stale("after").await.ok().and_then(|o| o.kvs.into_iter().next());
        if got.is_some_and(|kv| kv.value == b"1") {
            break;
        }
        assert!(Instant::now() < deadline, "the rejoined member never caught up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(value(store.kv(G).get("k07").await.expect("linearizable get")), Some("7".into()));
}
