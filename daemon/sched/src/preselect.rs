//! Pre-selection of a cell's executor among a kernel's replicas (NotebookOS §4):
//! the front-end designates one replica to propose LEAD for a round; the others are
//! told to yield. The election in the kernel's raft group decides; this choice only
//! makes the likely winner propose first, so it may read loads that are stale.
//!
//! Rule: the previous executor when its host can commit the cell's GPUs now (its
//! GPU memory is likely still there), else the replica whose host has the most idle
//! GPUs (tie: the replica on the front-end's own host, whose cells skip a network hop;
//! then the lowest replica number). A replica on a dead or unreachable host is
//! never designated. Replicas that already yielded this cell come last, so a retry
//! round asks somebody new first.

use std::collections::BTreeMap;

/// One replica as the front-end sees it when a round starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// Replica number (1-based, stable).
    pub replica: u32,
    /// Its host's raft node id.
    pub node_id: u64,
    /// The host's record exists and the front-end's connection to it is up.
    pub live: bool,
    /// GPUs its host could commit now (from `load/`, possibly stale).
    pub gpus_idle: u32,
    /// Its host is the front-end's own.
    pub local: bool,
}

/// The roles of one election round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Round {
    /// The replica that proposes LEAD.
    pub lead: u32,
    /// The other live replicas (they are told to yield), in replica order.
    pub yielders: Vec<u32>,
}

/// Chooses the designee for a round. `previous` is the kernel's last executor;
/// `yielded` the replicas that yielded earlier rounds of this cell. `None` when no
/// replica is live.
pub fn preselect(candidates: &[Candidate], gpus: u32, previous: Option<u32>, yielded: &[u32]) -> Option<Round> {
    // One entry per replica number (a duplicate would be a bug upstream; keep the first).
    let mut live: BTreeMap<u32, Candidate> = BTreeMap::new();
    for c in candidates.iter().filter(|c| c.live) {
        live.entry(c.replica).or_insert(*c);
    }
    let lead = previous
        .and_then(|p| live.get(&p))
        .filter(|c| c.gpus_idle >= gpus && !yielded.contains(&c.replica))
        .map(|c| c.replica)
        .or_else(|| {
            live.values()
                // Not yet yielded first, then most idle GPUs, then local, then lowest number.
                .min_by_key(|c| (yielded.contains(&c.replica), std::cmp::Reverse(c.gpus_idle), !c.local, c.replica))
                .map(|c| c.replica)
        })?;
    let yielders = live.keys().copied().filter(|r| *r != lead).collect();
    Some(Round { lead, yielders })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prop::cases;

    fn c(replica: u32, live: bool, gpus_idle: u32) -> Candidate {
        Candidate { replica, node_id: u64::from(replica) * 10, live, gpus_idle, local: false }
    }

    #[test]
    fn previous_executor_keeps_the_cell_when_its_host_has_the_gpus() {
        let cs = [c(1, true, 4), c(2, true, 1), c(3, true, 0)];
        let r = preselect(&cs, 1, Some(2), &[]).expect("round");
        assert_eq!(r, Round { lead: 2, yielders: vec![1, 3] });
    }

    #[test]
    fn most_idle_host_wins_when_the_previous_cannot_commit() {
        let cs = [c(1, true, 1), c(2, true, 0), c(3, true, 2)];
        assert_eq!(preselect(&cs, 1, Some(2), &[]).expect("round").lead, 3);
        // No previous executor: same rule.
        assert_eq!(preselect(&cs, 1, None, &[]).expect("round").lead, 3);
    }

    #[test]
    fn ties_go_to_the_lowest_replica_number() {
        let cs = [c(3, true, 1), c(2, true, 1), c(1, true, 0)];
        assert_eq!(preselect(&cs, 1, None, &[]).expect("round").lead, 2);
        // CPU-only kernels: all hosts tie at whatever they have; previous still preferred.
        let cs = [c(1, true, 0), c(2, true, 0), c(3, true, 0)];
        assert_eq!(preselect(&cs, 0, None, &[]).expect("round").lead, 1);
        assert_eq!(preselect(&cs, 0, Some(3), &[]).expect("round").lead, 3);
    }

    #[test]
    fn dead_hosts_are_never_designated_nor_asked_to_yield() {
        let cs = [c(1, false, 8), c(2, true, 0), c(3, false, 8)];
        assert_eq!(preselect(&cs, 1, Some(1), &[]), Some(Round { lead: 2, yielders: vec![] }));
        assert_eq!(preselect(&[c(1, false, 1), c(2, false, 1)], 1, None, &[]), None);
        assert_eq!(preselect(&[], 0, None, &[]), None);
    }

    #[test]
    fn a_retry_round_asks_a_replica_that_has_not_yielded_yet() {
        let cs = [c(1, true, 0), c(2, true, 0), c(3, true, 0)];
        assert_eq!(preselect(&cs, 1, Some(1), &[1]).expect("round").lead, 2);
        assert_eq!(preselect(&cs, 1, None, &[1, 2]).expect("round").lead, 3);
        // Everybody yielded once: back to the usual order.
        assert_eq!(preselect(&cs, 1, None, &[1, 2, 3]).expect("round").lead, 1);
        // A previous executor that yielded this cell is not preferred again.
        let cs = [c(1, true, 1), c(2, true, 0), c(3, true, 0)];
        assert_eq!(preselect(&cs, 1, Some(1), &[1]).expect("round").lead, 2);
    }

    #[test]
    fn duplicate_replica_numbers_keep_the_first() {
        let cs = [
            c(1, true, 0),
            Candidate { replica: 1, node_id: 99, live: true, gpus_idle: 5, local: false },
            c(2, true, 1),
        ];
        let r = preselect(&cs, 1, None, &[]).expect("round");
        assert_eq!(r, Round { lead: 2, yielders: vec![1] });
    }

    #[test]
    fn ties_go_to_the_front_ends_own_host_but_idle_gpus_and_the_previous_executor_come_first() {
        let mut cs = [c(1, true, 1), c(2, true, 1), c(3, true, 1)];
        cs[1].local = true;
        assert_eq!(preselect(&cs, 1, None, &[]).expect("round").lead, 2);
        assert_eq!(preselect(&cs, 1, Some(3), &[]).expect("round").lead, 3, "the previous executor stays");
        cs[0].gpus_idle = 2;
        assert_eq!(preselect(&cs, 1, None, &[]).expect("round").lead, 1, "more idle GPUs beat locality");
        assert_eq!(preselect(&cs, 1, None, &[1]).expect("round").lead, 2, "then locality among the rest");
    }

    #[test]
    fn property_the_designee_is_live_and_every_other_live_replica_yields() {
        cases(500, |g| {
            let n = g.u32(0, 5);
            let mut cs: Vec<Candidate> = (1..=n)
                .map(|replica| Candidate {
                    replica,
                    node_id: u64::from(g.u32(1, 6)),
                    live: g.u32(0, 3) > 0,
                    gpus_idle: g.u32(0, 8),
                    local: g.bool(),
                })
                .collect();
            let gpus = g.u32(0, 8);
            let previous = g.bool().then(|| g.u32(1, 5));
            let yielded: Vec<u32> = (1..=n).filter(|_| g.u32(0, 3) == 0).collect();
            let live: Vec<&Candidate> = cs.iter().filter(|c| c.live).collect();
            let got = preselect(&cs, gpus, previous, &yielded);
            let Some(round) = got.clone() else {
                assert!(live.is_empty(), "no round although replicas are live");
                return;
            };
            let lead = live.iter().find(|c| c.replica == round.lead).expect("the designee is live");
            let mut expected: Vec<u32> = live.iter().map(|c| c.replica).filter(|r| *r != round.lead).collect();
            expected.sort_unstable();
            assert_eq!(round.yielders, expected, "every other live replica yields, in order");
            // The previous executor stays when it can commit now and has not yielded.
            if let Some(p) = previous.and_then(|p| live.iter().find(|c| c.replica == p)) {
                if p.gpus_idle >= gpus && !yielded.contains(&p.replica) {
                    assert_eq!(round.lead, p.replica);
                }
            }
            // A replica that has not yielded comes before one that has.
            if yielded.contains(&lead.replica) {
                assert!(live.iter().all(|c| yielded.contains(&c.replica)), "a fresh replica was passed over");
            }
            cs.reverse();
            assert_eq!(preselect(&cs, gpus, previous, &yielded), got, "input order does not matter");
        });
    }
}
