//! A node added to a group catches up: to an idle group (no writes after the add), and to a
//! group whose log was compacted before it joined (it can only catch up by snapshot).

use std::time::{Duration, Instant};

use raft_store::{MembershipChange, RaftStore, StoreConfig, TransportSecurity};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_added_to_an_idle_group_catches_up() {
    join_catches_up(5, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_added_after_the_log_was_compacted_catches_up_by_snapshot() {
    join_catches_up(300, Some(50)).await;
}

async fn join_catches_up(writes: usize, snapshot_interval: Option<u64>) {
    let dir = tempfile::tempdir().expect("tmp");
    let addrs: Vec<_> = (0..4).map(|_| raft_store::service::free_loopback_addr().expect("port")).collect();
    let stores: Vec<RaftStore> = (1..=4u64)
        .map(|id| {
            let mut c = StoreConfig::new(
                id,
                dir.path().join(format!("n{id}")),
                addrs[id as usize - 1],
                TransportSecurity::Plaintext,
            );
            c.peers = (1..=4u64).filter(|o| *o != id).map(|o| (o, addrs[o as usize - 1])).collect();
            c.tick_interval = Duration::from_millis(20);
            if let Some(n) = snapshot_interval {
                c.snapshot_interval = n;
            }
            RaftStore::open(c).expect("open")
        })
        .collect();
    for s in &stores[..3] {
        s.create_group(7, &[1, 2, 3]).await.expect("create");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let leader = loop {
        let mut found = None;
        for s in &stores[..3] {
            if s.status(7).await.map(|st| st.role == "leader").unwrap_or(false) {
                found = Some(s.clone());
            }
        }
        if let Some(l) = found {
            break l;
        }
        assert!(Instant::now() < deadline, "no leader");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    for i in 0..writes {
        leader.kv(7).put(format!("k{i}"), "v").await.expect("put");
    }
    if snapshot_interval.is_some() {
        assert!(leader.metrics().compactions.get() >= 1, "the log was not compacted:\n{}", leader.metrics_text());
    }
    stores[3].join_group(7).await.expect("join");
    let out = leader.kv(7).put("x", "y").await;
    out.expect("put");
    let gone = if leader.node_id() == 3 { 2 } else { 3 };
    leader
        .change_membership(7, &[MembershipChange::AddVoter(4), MembershipChange::Remove(gone)])
        .await
        .expect("change");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = stores[3].kv(7).range_stale("k", 0).await.map(|o| o.kvs.len()).unwrap_or(0);
        if got == writes {
            break;
        }
        let st = stores[3].status(7).await;
        assert!(Instant::now() < deadline, "node 4 did not catch up: {st:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
