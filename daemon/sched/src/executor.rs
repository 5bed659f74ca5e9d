//! Best-fit executor choice, for a cluster that keeps whole hosts free for large cells
//! (the simulator's `notebookos` policy; the daemon's front-end still uses
//! [`super::preselect`], which sends a cell to the replica with the most idle GPUs).
//!
//! Rule: the previous executor when its host can commit the cell's GPUs now (its GPU
//! memory may still be there, idle-held); else, among the live replicas whose hosts can
//! commit now, the one with the *fewest* GPUs available (best fit: a 1-GPU cell does not
//! break up a whole free host that an 8-GPU cell of another kernel will need); ties to
//! the lowest replica number. `None` when no replica's host can commit: all YIELD.
//!
//! Also [`covered`]: whether a kernel has a replica whose host can run its next cell now;
//! the policy moves an idle replica (in the background, during the user's think time) to
//! a host chosen by [`super::migrate::choose`] when it has none.

use super::preselect::Candidate;

/// The executor's replica number, or `None` (all yield).
pub fn choose(candidates: &[Candidate], gpus: u32, previous: Option<u32>) -> Option<u32> {
    let can = |c: &&Candidate| c.live && c.gpus_idle >= gpus;
    if let Some(p) = previous {
        if candidates.iter().filter(can).any(|c| c.replica == p) {
            return Some(p);
        }
    }
    candidates.iter().filter(can).min_by_key(|c| (c.gpus_idle, c.replica)).map(|c| c.replica)
}

/// Whether some live replica's host could commit `gpus` now.
pub fn covered(candidates: &[Candidate], gpus: u32) -> bool {
    candidates.iter().any(|c| c.live && c.gpus_idle >= gpus)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prop::cases;

    fn c(replica: u32, live: bool, gpus_idle: u32) -> Candidate {
        Candidate { replica, node_id: u64::from(replica), live, gpus_idle, local: false }
    }

    #[test]
    fn previous_then_best_fit_then_none() {
        let cs = [c(1, true, 8), c(2, true, 2), c(3, true, 1)];
        assert_eq!(choose(&cs, 1, Some(1)), Some(1), "the previous executor keeps it");
        assert_eq!(choose(&cs, 1, None), Some(3), "the tightest fit, not the whole free host");
        assert_eq!(choose(&cs, 2, Some(3)), Some(2), "the previous cannot commit 2");
        assert_eq!(choose(&cs, 8, None), Some(1));
        assert_eq!(choose(&[c(1, false, 8), c(2, true, 0)], 1, None), None, "dead hosts never run cells");
        assert!(covered(&cs, 8) && !covered(&cs, 9));
    }

    #[test]
    fn property_the_executor_can_commit_and_exists_exactly_when_covered() {
        cases(500, |g| {
            let cs: Vec<Candidate> = (1..=3).map(|r| c(r, g.u32(0, 9) > 0, g.u32(0, 8))).collect();
            let gpus = g.u32(0, 8);
            let prev = if g.bool() { Some(g.u32(1, 3)) } else { None };
            let got = choose(&cs, gpus, prev);
            assert_eq!(got.is_some(), covered(&cs, gpus));
            if let Some(r) = got {
                let e = cs.iter().find(|x| x.replica == r).expect("a listed replica");
                assert!(e.live && e.gpus_idle >= gpus);
                // Nobody who can commit has fewer GPUs available, unless it is the previous.
                if prev != Some(r) {
                    assert!(cs.iter().filter(|x| x.live && x.gpus_idle >= gpus).all(|x| x.gpus_idle >= e.gpus_idle));
                }
            }
            let mut rev = cs.clone();
            rev.reverse();
            assert_eq!(choose(&rev, gpus, prev), got);
        });
    }
}
