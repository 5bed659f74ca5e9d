//! Kernel groups (issue 7): executor election over a real 3-node raft group, and
//! namespace sync between three real ipykernel replicas through it.

#[path = "common/group_store.rs"]
mod group_store;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use group_store::{Rng, Stores};
use notebookosd::cluster::election::{self, Decision, Outcome, Proposer};
use notebookosd::cluster::records::ElectionRecord;

const GROUP: u64 = 1001;

/// What every proposal of one cell returned, and who it was.
type Log = Arc<Mutex<HashMap<String, Vec<(Proposer, u32, Outcome)>>>>;

async fn propose_after(
    stores: &Stores,
    delay_ms: u64,
    cell: &str,
    round: u32,
    expected: Option<ElectionRecord>,
    replica: u32,
    decision: Decision,
    log: &Log,
) -> Outcome {
    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
    // Replica n lives on node n and proposes through its own node (followers forward).
    let me = Proposer { replica, node_id: u64::from(replica) };
    let kv = stores.node(u64::from(replica)).kv(GROUP);
    let outcome = election::propose(&kv, cell, round, expected.as_ref(), me, decision).await.expect("propose");
    log.lock().unwrap().entry(cell.to_owned()).or_default().push((me, round, outcome.clone()));
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
            let delay = rng.below(15);
            let (s, c, e, l) = (stores.clone(), cell.clone(), expected.clone(), log.clone());
            let d2 = decision.clone();
            proposals.push(tokio::spawn(async move { propose_after(&s, delay, &c, round, e, replica, d2, &l).await }));
            if rng.chance(30) {
                // The same request delivered again much later (a stale duplicate).
                let delay = 20 + rng.below(200);
                let (s, c, e, l) = (stores.clone(), cell.clone(), expected.clone(), log.clone());
                let replica = 1 + rng.below(3) as u32;
                replays.push(tokio::spawn(async move {
                    propose_after(&s, delay, &c, round, e, replica, decision, &l).await
                }));
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
        )
        .await
        .expect("late proposal");
        assert_eq!(late, Outcome::Taken(winner.clone()));
    }
}
