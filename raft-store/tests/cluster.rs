//! Fault tests on a 3-node cluster of real processes on loopback (mutual TLS, fsync on).

mod common;

use std::time::{Duration, Instant};

use common::linearizability::{check, Event, Op};
use common::{assert_all_present, election_timeout, Cluster, Opts, Writers, CLUSTER_LOCK};
use raft_store::service::{Request, TxnCompare, TxnStep};
use raft_store::MembershipChange;

const G: u64 = 1;
const LONG: Duration = Duration::from_secs(30);
// How fast a new leader comes is `nbos bench raft`'s `failover_ms` (busy group) and
// `failover_idle_group_ms` (hibernating group), never a limit here: the waits are generous.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_9_elects_a_new_leader_and_loses_no_acknowledged_write() {
    let _serial = CLUSTER_LOCK.lock().await;
    let mut c = Cluster::start(3, Opts::default());
    let (leader, term) = c.wait_leader(G, 0, LONG).await;
    let writers = Writers::start(&c, G, 4);
    writers.wait_more(50, LONG).await;
    let killed_at = Instant::now();
    c.kill(leader);
    let (new_leader, _) = c.wait_leader(G, term, LONG).await;
    let failover = killed_at.elapsed();
    eprintln!("new leader {new_leader} after {failover:?} (election timeout {:?})", election_timeout());
    assert_ne!(new_leader, leader);
    writers.wait_more(50, LONG).await;
    let acked = writers.stop().await;
    assert_all_present(&acked, &c.range(G, "w/").await, "leader after failover");
    // The killed node comes back and catches up with everything.
    c.spawn(leader);
    let commit = c.status(new_leader, G).await.expect("status").commit;
    c.wait_applied(leader, G, commit, LONG).await;
    assert_all_present(&acked, &c.range_stale(leader, G, "w/").await, "restarted old leader");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hibernating_group_elects_a_new_leader_after_leader_kill_9() {
    let _serial = CLUSTER_LOCK.lock().await;
    let mut c = Cluster::start(3, Opts::default());
    let (leader, term) = c.wait_leader(G, 0, LONG).await;
    let mut client = c.client();
    let r = client
        .call_leader(&Request::Put { group: G, key: "k".into(), value: "v".into() }, Instant::now() + LONG)
        .await
        .expect("put");
    assert!(r.ok);
    // Idle: followers hibernate, then the leader.
    let deadline = Instant::now() + LONG;
    for id in c.live_ids() {
        while !c.status(id, G).await.is_some_and(|s| s.hibernating) {
            assert!(Instant::now() < deadline, "group did not hibernate on node {id}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let killed_at = Instant::now();
    c.kill(leader);
    let (new_leader, _) = c.wait_leader(G, term, LONG).await;
    let failover = killed_at.elapsed();
    eprintln!("new leader {new_leader} after {failover:?} (election timeout {:?})", election_timeout());
    assert_ne!(new_leader, leader);
    let r = c
        .client()
        .call_leader(&Request::Get { group: G, key: "k".into(), stale: false }, Instant::now() + LONG)
        .await
        .expect("get");
    assert_eq!(r.result["value"].as_str(), Some("v"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_in_a_loop_while_writing_keeps_every_acknowledged_write() {
    let _serial = CLUSTER_LOCK.lock().await;
    let mut c = Cluster::start(3, Opts { snapshot_interval: 200, ..Opts::default() });
    c.wait_leader(G, 0, LONG).await;
    let writers = Writers::start(&c, G, 4);
    for round in 0..6u64 {
        writers.wait_more(30, LONG).await;
        // Alternate between the leader and a follower.
        let (leader, _) = c.wait_leader(G, 0, LONG).await;
        let victim =
            if round % 2 == 0 { leader } else { c.live_ids().into_iter().find(|&n| n != leader).expect("follower") };
        c.kill(victim);
        writers.wait_more(30, LONG).await;
        c.spawn(victim);
    }
    writers.wait_more(30, LONG).await;
    let acked = writers.stop().await;
    assert!(acked.len() >= 400, "only {} writes acknowledged", acked.len());
    assert_all_present(&acked, &c.range(G, "w/").await, "leader");
    let (leader, _) = c.wait_leader(G, 0, LONG).await;
    let commit = c.status(leader, G).await.expect("status").commit;
    for id in c.live_ids() {
        c.wait_applied(id, G, commit, LONG).await;
        assert_all_present(&acked, &c.range_stale(id, G, "w/").await, &format!("node {id}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_node_kill_9_in_a_loop_keeps_every_acknowledged_write_on_its_own_disk() {
    // One replica: no peer can repair what the node failed to fsync, so every acknowledged write
    // found after a kill -9 was on this node's disk when it was acknowledged.
    let _serial = CLUSTER_LOCK.lock().await;
    let mut c = Cluster::start(1, Opts { snapshot_interval: 150, ..Opts::default() });
    let mut acked_all = Vec::new();
    for round in 0..5 {
        c.wait_leader(G, 0, LONG).await;
        let writers = Writers::start(&c, G, 4);
        writers.wait_more(60, LONG).await;
        c.kill(1); // while the writers are mid-flight
        c.spawn(1);
        acked_all.extend(writers.stop().await);
        assert_all_present(&acked_all, &c.range(G, "w/").await, &format!("after kill -9 number {}", round + 1));
    }
    assert!(acked_all.len() >= 300, "only {} writes acknowledged", acked_all.len());
    // Recovery went through a compacted log too (snapshot + tail), not only a log from index 1.
    let s = c.status(1, G).await.expect("status");
    assert!(s.snapshot_index > 5, "no compaction happened (snapshot index {})", s.snapshot_index);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_follower_catches_up_by_snapshot() {
    let _serial = CLUSTER_LOCK.lock().await;
    let c = Cluster::start(3, Opts { snapshot_interval: 50, ..Opts::default() });
    let (leader, _) = c.wait_leader(G, 0, LONG).await;
    let follower = c.live_ids().into_iter().find(|&n| n != leader).expect("follower");
    let mut client = c.client();
    let set_blocked = |blocked: bool| {
        let mut reqs = Vec::new();
        for other in c.live_ids().into_iter().filter(|&n| n != follower) {
            reqs.push((follower, Request::SetBlocked { peer: other, blocked }));
            reqs.push((other, Request::SetBlocked { peer: follower, blocked }));
        }
        reqs
    };
    for (node, req) in set_blocked(true) {
        assert!(client.call_node(node, &req).await.expect("partition").ok);
    }
    let behind = c.status(follower, G).await.expect("status").last_index;
    for i in 0..300 {
        let req = Request::Put { group: G, key: format!("p/{i:03}"), value: format!("{i}") };
        let r = client.call_leader(&req, Instant::now() + LONG).await.expect("put");
        assert!(r.ok, "put during partition: {r:?}");
    }
    let leader_status = c.status(leader, G).await.expect("status");
    assert!(
        leader_status.snapshot_index > behind,
        "the leader must have compacted past the follower's log ({} <= {behind})",
        leader_status.snapshot_index
    );
    assert!(c.range_stale(follower, G, "p/").await.is_empty(), "a partitioned follower must not see new writes");
    for (node, req) in set_blocked(false) {
        assert!(client.call_node(node, &req).await.expect("heal").ok);
    }
    c.wait_applied(follower, G, leader_status.commit, LONG).await;
    assert!(c.metric(follower, "notebookos_raft_snapshots_installed_total").await >= 1.0, "no snapshot installed");
    let got = c.range_stale(follower, G, "p/").await;
    assert_eq!(got.len(), 300);
    assert_eq!(got.get("p/299").map(String::as_str), Some("299"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_cluster_restart_recovers_all_data() {
    let _serial = CLUSTER_LOCK.lock().await;
    let mut c = Cluster::start(3, Opts { snapshot_interval: 100, bootstrap_groups: vec![1, 2] });
    c.wait_leader(1, 0, LONG).await;
    c.wait_leader(2, 0, LONG).await;
    let writers = Writers::start(&c, 1, 2);
    writers.wait_more(250, LONG).await;
    let mut client = c.client();
    let r = client
        .call_leader(&Request::Put { group: 2, key: "other".into(), value: "group".into() }, Instant::now() + LONG)
        .await
        .expect("put");
    assert!(r.ok);
    for id in c.live_ids() {
        c.kill(id);
    }
    let acked = writers.stop().await;
    for id in [1, 2, 3] {
        c.spawn(id);
    }
    c.wait_leader(1, 0, LONG).await;
    assert_all_present(&acked, &c.range(1, "w/").await, "after full restart");
    assert_eq!(c.range(2, "other").await.get("other").map(String::as_str), Some("group"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_add_learner_promote_remove_old_while_writing() {
    let _serial = CLUSTER_LOCK.lock().await;
    let mut c = Cluster::start(3, Opts { snapshot_interval: 100, ..Opts::default() });
    let (leader, _) = c.wait_leader(G, 0, LONG).await;
    let writers = Writers::start(&c, G, 2);
    writers.wait_more(150, LONG).await; // past a compaction: the new node needs a snapshot
    c.add_node(4).await;
    let mut client = c.client();
    let r = client.call_node(4, &Request::JoinGroup { group: G }).await.expect("join");
    assert!(r.ok, "join: {r:?}");
    let change = |changes: Vec<MembershipChange>| Request::ChangeMembership { group: G, changes };
    let r = client
        .call_leader(&change(vec![MembershipChange::AddLearner(4)]), Instant::now() + LONG)
        .await
        .expect("add learner");
    assert!(r.ok, "add learner: {r:?}");
    let commit = c.status(leader, G).await.map_or(0, |s| s.commit);
    let s = c.wait_applied(4, G, commit, LONG).await;
    assert!(s.membership.learners.contains(&4));
    writers.wait_more(50, LONG).await;
    let old = c.live_ids().into_iter().find(|&n| n != leader && n != 4).expect("an old follower");
    let r = client
        .call_leader(&change(vec![MembershipChange::AddVoter(4), MembershipChange::Remove(old)]), Instant::now() + LONG)
        .await
        .expect("promote+remove");
    assert!(r.ok, "joint change: {r:?}");
    // Joint consensus is left automatically; wait for the final configuration.
    let deadline = Instant::now() + LONG;
    loop {
        let s = c.status(leader, G).await.expect("status");
        if s.membership.voters_outgoing.is_empty()
            && s.membership.voters.contains(&4)
            && !s.membership.voters.contains(&old)
        {
            break;
        }
        assert!(Instant::now() < deadline, "joint consensus not left: {:?}", s.membership);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    writers.wait_more(50, LONG).await;
    c.kill(old); // no longer needed: the group keeps a quorum without it
    writers.wait_more(50, LONG).await;
    let acked = writers.stop().await;
    assert_all_present(&acked, &c.range(G, "w/").await, "leader");
    let (leader, _) = c.wait_leader(G, 0, LONG).await;
    let commit = c.status(leader, G).await.expect("status").commit;
    c.wait_applied(4, G, commit, LONG).await;
    assert_all_present(&acked, &c.range_stale(4, G, "w/").await, "new member");
    assert!(c.metric(4, "notebookos_raft_snapshots_installed_total").await >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_transfer_moves_leadership() {
    let _serial = CLUSTER_LOCK.lock().await;
    let c = Cluster::start(3, Opts::default());
    let (leader, term) = c.wait_leader(G, 0, LONG).await;
    let target = c.live_ids().into_iter().find(|&n| n != leader).expect("follower");
    let mut client = c.client();
    let r = client.call_node(leader, &Request::TransferLeader { group: G, to: target }).await.expect("transfer");
    assert!(r.ok, "transfer: {r:?}");
    let (now, _) = c.wait_leader(G, term, LONG).await;
    assert_eq!(now, target);
    // One connection per pair of nodes, used in both directions: each node holds exactly two.
    for id in c.live_ids() {
        let deadline = Instant::now() + LONG;
        while c.metric(id, "notebookos_raft_peer_connections").await != 2.0 {
            assert!(Instant::now() < deadline, "node {id} does not hold exactly one connection per peer");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let r =
        client.call_node(leader, &Request::Put { group: G, key: "k".into(), value: "v".into() }).await.expect("put");
    assert_eq!(r.error.as_ref().map(|e| (e.kind.as_str(), e.leader)), Some(("not_leader", Some(target))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_history_is_linearizable_under_leader_kills_and_isolation() {
    let _serial = CLUSTER_LOCK.lock().await;
    let mut c = Cluster::start(3, Opts::default());
    c.wait_leader(G, 0, LONG).await;
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..4u64 {
        let mut client = c.client();
        client.call_timeout = Duration::from_secs(2);
        tasks.push(tokio::spawn(async move {
            let mut history = Vec::new();
            let mut i = 0u64;
            while i < 300 {
                i += 1;
                let v = format!("{w}-{i}");
                let (op, req) = match i % 3 {
                    0 => (Op::Write(v.clone()), Request::Put { group: G, key: "reg".into(), value: v }),
                    1 => (Op::Read(None), Request::Get { group: G, key: "reg".into(), stale: false }),
                    _ => {
                        let expected = history.iter().rev().find_map(|e: &Event| match &e.op {
                            Op::Read(Some(x)) => Some(x.clone()),
                            _ => None,
                        });
                        (
                            Op::Cas { expected: expected.clone(), new: v.clone(), ok: None },
                            Request::Cas { group: G, key: "reg".into(), expected, value: v },
                        )
                    }
                };
                let call = t0.elapsed().as_nanos();
                let r = client.call_leader(&req, Instant::now() + Duration::from_secs(10)).await;
                let ret = t0.elapsed().as_nanos();
                let (op, answered) = match (op, r) {
                    (Op::Read(_), Ok(r)) if r.ok => (Op::Read(r.result["value"].as_str().map(Into::into)), true),
                    (Op::Cas { expected, new, .. }, Ok(r)) if r.ok => {
                        (Op::Cas { expected, new, ok: r.result["succeeded"].as_bool() }, true)
                    }
                    (op @ Op::Write(_), Ok(r)) if r.ok => (op, true),
                    // Definite failures (not leader, group not found) did nothing.
                    (_, Ok(r)) if matches!(r.error_kind(), Some("not_leader" | "group_not_found")) => continue,
                    (op, _) => (op, false),
                };
                history.push(Event { op, call, ret: answered.then_some(ret) });
            }
            history
        }));
    }
    for round in 0..3 {
        let (leader, term) = c.wait_leader(G, 0, LONG).await;
        let before = c.status(leader, G).await.map_or(0, |s| s.commit);
        c.wait_applied(leader, G, before + 20, LONG).await;
        assert!(tasks.iter().all(|t| !t.is_finished()), "the clients finished before the fault");
        if round == 1 {
            // Isolate the leader instead: it keeps believing it leads for a while, and must
            // neither commit nor serve a read the majority side has overtaken.
            let mut admin = c.client();
            let others: Vec<u64> = c.live_ids().into_iter().filter(|&n| n != leader).collect();
            for blocked in [true, false] {
                for &o in &others {
                    let a = admin.call_node(leader, &Request::SetBlocked { peer: o, blocked }).await.expect("block");
                    let b = admin.call_node(o, &Request::SetBlocked { peer: leader, blocked }).await.expect("block");
                    assert!(a.ok && b.ok);
                }
                if blocked {
                    let deadline = Instant::now() + LONG;
                    let new_leader = loop {
                        let mut found = None;
                        for &o in &others {
                            if c.status(o, G).await.is_some_and(|s| s.role == "leader" && s.term > term) {
                                found = Some(o);
                            }
                        }
                        if let Some(o) = found {
                            break o;
                        }
                        assert!(Instant::now() < deadline, "the majority side elected no leader");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    };
                    let commit = c.status(new_leader, G).await.map_or(0, |s| s.commit);
                    c.wait_applied(new_leader, G, commit + 20, LONG).await;
                }
            }
        } else {
            c.kill(leader);
            c.wait_leader(G, term, LONG).await;
            c.spawn(leader);
        }
    }
    // The clients finish their quota of operations; the faults happened in the middle of it.
    let mut history = Vec::new();
    for t in tasks {
        history.extend(t.await.expect("client"));
    }
    let answered = history.iter().filter(|e| e.ret.is_some()).count();
    assert!(answered >= 100, "too few answered operations ({answered})");
    let unknown = history.len() - answered;
    eprintln!("linearizability: {answered} answered, {unknown} with unknown outcome");
    assert!(check(&history), "history of {} operations is not linearizable", history.len());
}

/// Answers that say a routed request was not proposed.
fn not_proposed(kind: Option<&str>) -> bool {
    matches!(kind, Some("not_leader" | "leader_unreachable" | "group_not_found" | "overloaded"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_node_serves_linearizably_through_forwarding_under_leader_kill_9_and_isolation() {
    let _serial = CLUSTER_LOCK.lock().await;
    let mut c = Cluster::start(3, Opts::default());
    c.wait_leader(G, 0, LONG).await;
    let t0 = Instant::now();
    let nodes: Vec<u64> = c.live_ids();
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    // Unique-key writers at random nodes: every acknowledged write must survive the kills.
    let mut writers = Vec::new();
    for w in 0..2u64 {
        let mut client = c.client();
        client.call_timeout = Duration::from_secs(4);
        let (nodes, stop_rx) = (nodes.clone(), stop_rx.clone());
        writers.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut seq = 0u64;
            while !*stop_rx.borrow() {
                seq += 1;
                let node = nodes[rand::random_range(0..nodes.len())];
                let (key, value) = (format!("fw/{w}/{seq}"), format!("v{seq}"));
                let put = Request::Put { group: G, key: key.clone(), value: value.clone() };
                match client.call_node(node, &Request::Routed { request: Box::new(put) }).await {
                    Ok(r) if r.ok => acked.push((key, value)),
                    Err(e) if !e.outcome_unknown() => tokio::time::sleep(Duration::from_millis(5)).await,
                    _ => {}
                }
            }
            acked
        }));
    }
    // Register clients at random nodes: the history of one key must be linearizable.
    let mut tasks = Vec::new();
    for w in 0..3u64 {
        let mut client = c.client();
        client.call_timeout = Duration::from_secs(4);
        let nodes = nodes.clone();
        tasks.push(tokio::spawn(async move {
            let mut history = Vec::new();
            let mut per_node = std::collections::BTreeMap::<u64, u64>::new();
            for i in 0..400u64 {
                let v = format!("{w}-{i}");
                let last_read = history.iter().rev().find_map(|e: &Event| match &e.op {
                    Op::Read(Some(x)) => Some(x.clone()),
                    _ => None,
                });
                let (op, req) = match i % 4 {
                    0 => (Op::Write(v.clone()), Request::Put { group: G, key: "reg".into(), value: v }),
                    1 => (Op::Read(None), Request::Get { group: G, key: "reg".into(), stale: false }),
                    2 => (
                        Op::Cas { expected: last_read.clone(), new: v.clone(), ok: None },
                        Request::Cas { group: G, key: "reg".into(), expected: last_read, value: v },
                    ),
                    _ => {
                        // A transaction used as a compare-and-set (its failure branch is empty).
                        let compare = match &last_read {
                            Some(x) => TxnCompare::Equals { key: "reg".into(), value: x.clone() },
                            None => TxnCompare::Absent { key: "reg".into() },
                        };
                        let put = TxnStep::Put { key: "reg".into(), value: v.clone(), lease: None };
                        (
                            Op::Cas { expected: last_read, new: v, ok: None },
                            Request::Txn { group: G, compares: vec![compare], success: vec![put], failure: vec![] },
                        )
                    }
                };
                let node = nodes[rand::random_range(0..nodes.len())];
                let call = t0.elapsed().as_nanos();
                let r = client.call_node(node, &Request::Routed { request: Box::new(req) }).await;
                let ret = t0.elapsed().as_nanos();
                let (op, answered) = match (op, r) {
                    (Op::Read(_), Ok(r)) if r.ok => (Op::Read(r.result["value"].as_str().map(Into::into)), true),
                    (Op::Cas { expected, new, .. }, Ok(r)) if r.ok => {
                        (Op::Cas { expected, new, ok: r.result["succeeded"].as_bool() }, true)
                    }
                    (op @ Op::Write(_), Ok(r)) if r.ok => (op, true),
                    (_, Ok(r)) if not_proposed(r.error_kind()) => continue,
                    (_, Err(e)) if !e.outcome_unknown() => {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                    (op, _) => (op, false),
                };
                if answered {
                    *per_node.entry(node).or_default() += 1;
                }
                history.push(Event { op, call, ret: answered.then_some(ret) });
            }
            (history, per_node)
        }));
    }
    for round in 0..3 {
        let (leader, term) = c.wait_leader(G, 0, LONG).await;
        let before = c.status(leader, G).await.map_or(0, |s| s.commit);
        c.wait_applied(leader, G, before + 30, LONG).await;
        assert!(tasks.iter().all(|t| !t.is_finished()), "the clients finished before the fault");
        if round == 1 {
            // Isolate the leader: it still believes it leads and still receives requests (its
            // own clients' and those forwarded by nodes that have not noticed yet); it must not
            // answer a read the majority side has overtaken, nor acknowledge a write.
            let mut admin = c.client();
            let others: Vec<u64> = c.live_ids().into_iter().filter(|&n| n != leader).collect();
            for blocked in [true, false] {
                for &o in &others {
                    let a = admin.call_node(leader, &Request::SetBlocked { peer: o, blocked }).await.expect("block");
                    let b = admin.call_node(o, &Request::SetBlocked { peer: leader, blocked }).await.expect("block");
                    assert!(a.ok && b.ok);
                }
                if blocked {
                    let deadline = Instant::now() + LONG;
                    let new_leader = loop {
                        let mut found = None;
                        for &o in &others {
                            if c.status(o, G).await.is_some_and(|s| s.role == "leader" && s.term > term) {
                                found = Some(o);
                            }
                        }
                        if let Some(o) = found {
                            break o;
                        }
                        assert!(Instant::now() < deadline, "the majority side elected no leader");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    };
                    let commit = c.status(new_leader, G).await.map_or(0, |s| s.commit);
                    c.wait_applied(new_leader, G, commit + 20, LONG).await;
                }
            }
        } else {
            c.kill(leader);
            c.wait_leader(G, term, LONG).await;
            c.spawn(leader);
        }
    }
    let mut history = Vec::new();
    let mut per_node = std::collections::BTreeMap::<u64, u64>::new();
    for t in tasks {
        let (h, n) = t.await.expect("client");
        history.extend(h);
        for (node, count) in n {
            *per_node.entry(node).or_default() += count;
        }
    }
    let _ = stop.send(true);
    let mut acked = Vec::new();
    for w in writers {
        acked.extend(w.await.expect("writer"));
    }
    let answered = history.iter().filter(|e| e.ret.is_some()).count();
    eprintln!("routed: {answered} answered, {} unknown; answered per node {per_node:?}", history.len() - answered);
    assert!(answered >= 200, "too few answered operations ({answered})");
    assert!(per_node.len() == 3, "every node answered some operations: {per_node:?}");
    assert!(check(&history), "history of {} operations is not linearizable", history.len());
    assert!(acked.len() >= 50, "only {} routed writes acknowledged", acked.len());
    assert_all_present(&acked, &c.range(G, "fw/").await, "leader after kills");
    let mut forwarded = 0.0;
    for id in c.live_ids() {
        forwarded += c.metric(id, "notebookos_raft_forwarded_requests_total{op=\"write\",outcome=\"ok\"}").await;
    }
    assert!(forwarded > 0.0, "no write was forwarded");
}
