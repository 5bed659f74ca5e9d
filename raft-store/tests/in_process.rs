//! Stores inside the test process: API semantics, 1,000 groups, watches, leases, restart.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use raft_store::{Error, RaftStore, StoreConfig, TransportSecurity, WatchEventKind};

fn free_addr() -> SocketAddr {
    raft_store::service::free_loopback_addr().expect("free port")
}

fn single_node(dir: &std::path::Path) -> StoreConfig {
    let mut cfg = StoreConfig::new(1, dir.to_path_buf(), free_addr(), TransportSecurity::Plaintext);
    cfg.tick_interval = Duration::from_millis(20);
    cfg
}

async fn wait_leader(store: &RaftStore, group: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(s) = store.status(group).await {
            if s.role == "leader" {
                return;
            }
        }
        assert!(Instant::now() < deadline, "group {group} elected no leader in time");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn kv_api_semantics_on_one_node() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = RaftStore::open(single_node(dir.path())).expect("open");
    store.create_group(1, &[1]).await.expect("create");
    assert!(matches!(store.create_group(1, &[1]).await, Err(Error::GroupExists(1))));
    wait_leader(&store, 1).await;
    let kv = store.kv(1);
    kv.put("a/1", "x").await.expect("put");
    kv.put("a/2", "y").await.expect("put");
    kv.put("b/1", "z").await.expect("put");
    assert_eq!(kv.get("a/1").await.expect("get").map(|k| k.value), Some(b"x".to_vec()));
    let keys: Vec<_> = kv.range("a/", 0).await.expect("range").into_iter().map(|k| k.key).collect();
    assert_eq!(keys, vec![b"a/1".to_vec(), b"a/2".to_vec()]);
    let cas = kv.cas("a/1", Some(b"nope".to_vec()), "w").await.expect("cas");
    assert!(!cas.succeeded);
    assert_eq!(cas.previous, Some(b"x".to_vec()));
    assert!(kv.cas("a/1", Some(b"x".to_vec()), "w").await.expect("cas").succeeded);
    assert!(kv.delete("a/2").await.expect("delete"));
    assert!(!kv.delete("a/2").await.expect("delete"));
    let stale = kv.get_stale("a/1").await.expect("stale get");
    assert!(stale.stale);
    assert_eq!(stale.kvs[0].value, b"w".to_vec());
    assert!(matches!(store.kv(99).put("k", "v").await, Err(Error::GroupNotFound(99))));
    assert!(matches!(kv.watch("", 1).await, Err(Error::Compacted { requested: 1, .. })));

    // A destroyed group is gone, also after a restart.
    store.create_group(2, &[1]).await.expect("create");
    store.destroy_group(2).await.expect("destroy");
    assert!(matches!(store.status(2).await, Err(Error::GroupNotFound(2))));
    assert!(matches!(store.destroy_group(2).await, Err(Error::GroupNotFound(2))));
    let cfg = store.config().clone();
    drop(kv);
    drop(store);
    let store = RaftStore::open(cfg).expect("reopen");
    assert_eq!(store.groups().await.expect("groups"), vec![1]);
    wait_leader(&store, 1).await;
    assert_eq!(store.kv(1).get("a/1").await.expect("get").map(|k| k.value), Some(b"w".to_vec()));
}

#[tokio::test]
async fn watch_and_leases() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = RaftStore::open(single_node(dir.path())).expect("open");
    store.create_group(3, &[1]).await.expect("create");
    wait_leader(&store, 3).await;
    let kv = store.kv(3);
    kv.put("w/before", "0").await.expect("put");
    let rev = kv.get("w/before").await.expect("get").expect("present").mod_revision;
    let mut from_past = kv.watch("w/", rev).await.expect("watch");
    let mut live = kv.watch("w/", 0).await.expect("watch");
    kv.put("w/a", "1").await.expect("put");
    kv.put("other", "1").await.expect("put");
    kv.delete("w/a").await.expect("delete");
    let ev = from_past.next().await.expect("event");
    assert_eq!((ev.key.as_slice(), ev.revision), (&b"w/before"[..], rev));
    for w in [&mut from_past, &mut live] {
        let put = w.next().await.expect("event");
        assert_eq!((put.kind, put.key.as_slice()), (WatchEventKind::Put, &b"w/a"[..]));
        let del = w.next().await.expect("event");
        assert_eq!((del.kind, del.key.as_slice()), (WatchEventKind::Delete, &b"w/a"[..]));
    }

    // TTLs out of range are refused before anything is proposed (an overflowing deadline would
    // otherwise panic every leader that applies the grant).
    for bad in [Duration::MAX, Duration::ZERO, raft_store::MAX_LEASE_TTL + Duration::from_secs(1)] {
        assert!(matches!(kv.lease_grant(bad).await, Err(Error::InvalidArgument(_))), "TTL {bad:?} accepted");
    }
    // A TTL 20 keep-alive periods long: a loaded machine that stalls the loop for a moment does
    // not let it lapse (how soon an expired lease goes is no figure this test holds).
    let ttl = Duration::from_secs(2);
    let lease = kv.lease_grant(ttl).await.expect("grant");
    kv.put_with_lease("live/1", "up", lease).await.expect("put with lease");
    assert!(matches!(kv.put_with_lease("live/2", "up", 12345).await, Err(Error::LeaseNotFound(12345))));
    // Kept alive it outlives its TTL twice over; let go it expires.
    let keep_until = Instant::now() + ttl * 2 + Duration::from_millis(500);
    while Instant::now() < keep_until {
        kv.lease_keepalive(lease).await.expect("keepalive");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(kv.get("live/1").await.expect("get").is_some(), "a kept-alive lease must not expire");
    let deadline = Instant::now() + Duration::from_secs(60);
    while kv.get("live/1").await.expect("get").is_some() {
        assert!(Instant::now() < deadline, "lease did not expire");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(matches!(kv.lease_keepalive(lease).await, Err(Error::LeaseNotFound(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_groups_in_one_process_survive_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = single_node(dir.path());
    cfg.hibernate_after_ticks = 5;
    let n = 1000u64;
    {
        let store = RaftStore::open(cfg.clone()).expect("open");
        for g in 1..=n {
            store.create_group(g, &[1]).await.expect("create");
        }
        for g in 1..=n {
            wait_leader(&store, g).await;
        }
        let writes_before = store.metrics().log_writes.get();
        let mut tasks = tokio::task::JoinSet::new();
        for g in 1..=n {
            let kv = store.kv(g);
            tasks.spawn(async move { kv.put("k", format!("v{g}")).await });
        }
        while let Some(r) = tasks.join_next().await {
            r.expect("join").expect("put");
        }
        // One log write (one fsync) per loop iteration carries every group's entries: 1,000
        // concurrent puts to 1,000 groups share batches instead of costing one fsync each.
        let writes = store.metrics().log_writes.get() - writes_before;
        eprintln!("{n} puts to {n} groups took {writes} log writes");
        // Without batching every put costs at least one write of its own.
        assert!(writes < n, "{n} puts to {n} groups took {writes} log writes: not batched");
        assert_eq!(store.groups().await.expect("groups").len(), 1000);
        // Idle groups hibernate.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = store.metrics_text();
            if text.lines().any(|l| l == "notebookos_raft_groups_hibernating 1000") {
                break;
            }
            assert!(Instant::now() < deadline, "groups did not hibernate:\n{text}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let store = RaftStore::open(cfg).expect("reopen");
    assert_eq!(store.groups().await.expect("groups").len(), 1000);
    for g in 1..=n {
        wait_leader(&store, g).await;
        let v = store.kv(g).get("k").await.expect("get").map(|k| k.value);
        assert_eq!(v, Some(format!("v{g}").into_bytes()), "group {g} after restart");
    }
}

#[tokio::test]
async fn outbound_queue_to_an_unreachable_peer_is_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = single_node(dir.path());
    cfg.peer_queue_depth = 4;
    cfg.peers.insert(2, free_addr()); // nobody listens there
    let store = RaftStore::open(cfg).expect("open");
    // Each of these groups campaigns towards node 2, which never answers.
    for g in 1..=50 {
        store.create_group(g, &[1, 2]).await.expect("create");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.metrics().dropped_count("queue_full") == 0 {
        assert!(Instant::now() < deadline, "no message was dropped:\n{}", store.metrics_text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Dropping is back-pressure, not failure: the node still answers.
    let s = store.status(1).await.expect("status");
    assert_ne!(s.role, "leader", "one of two voters cannot lead alone");
}

#[tokio::test]
async fn a_write_costs_one_fsync_and_survives_restart_with_its_commit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = single_node(dir.path());
    let store = RaftStore::open(cfg.clone()).expect("open");
    store.create_group(1, &[1]).await.expect("create");
    wait_leader(&store, 1).await;
    let kv = store.kv(1);
    kv.put("warm", "up").await.expect("put");
    // The commit index that follows each append is written without an fsync of its own (it
    // is not needed for safety), so N acknowledged writes cost about N fsyncs, not 2N.
    const N: u64 = 50;
    let before = store.metrics().log_writes.get();
    for i in 0..N {
        kv.put(format!("k/{i:02}"), format!("{i}")).await.expect("put");
    }
    let fsyncs = store.metrics().log_writes.get() - before;
    assert!(fsyncs <= N + 5, "{fsyncs} fsyncs for {N} writes:\n{}", store.metrics_text());
    // Stale reads come from the applied state, and every acknowledged write is there.
    assert_eq!(kv.range_stale("k/", 0).await.expect("stale range").kvs.len(), N as usize);
    drop(kv);
    drop(store);
    let store = RaftStore::open(cfg).expect("reopen");
    wait_leader(&store, 1).await;
    let got = store.kv(1).range("k/", 0).await.expect("range after restart");
    assert_eq!(got.len(), N as usize, "every acknowledged write survives a restart");
    assert_eq!(got[49].value, b"49".to_vec());
}
