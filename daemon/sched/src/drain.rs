//! Which hosts to release on scale-in. Only a host with no GPU committed to a running
//! cell may go (its idle-held GPUs are revoked, its idle replicas move first); among
//! those, the fewest replicas to move, then the fewest GPUs bound, then the highest
//! node id (the newest host: the oldest ones stay, as a cloud's reserved capacity would).

/// One live host as the drain choice sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// Node id.
    pub node_id: u64,
    /// GPUs committed to running cells.
    pub committed_gpus: u32,
    /// GPUs bound (committed or idle-held).
    pub bound_gpus: u32,
    /// Replicas (or containers) that would have to move.
    pub replicas: u32,
}

/// Up to `n` hosts to drain, in order.
pub fn choose(hosts: &[Candidate], n: usize) -> Vec<u64> {
    let mut idle: Vec<&Candidate> = hosts.iter().filter(|h| h.committed_gpus == 0).collect();
    idle.sort_by_key(|h| (h.replicas, h.bound_gpus, std::cmp::Reverse(h.node_id)));
    idle.dedup_by_key(|h| h.node_id);
    idle.into_iter().take(n).map(|h| h.node_id).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prop::cases;

    fn c(node_id: u64, committed_gpus: u32, bound_gpus: u32, replicas: u32) -> Candidate {
        Candidate { node_id, committed_gpus, bound_gpus, replicas }
    }

    #[test]
    fn idle_hosts_with_fewest_replicas_newest_first() {
        let hosts = [c(1, 0, 0, 0), c(2, 1, 1, 0), c(3, 0, 2, 0), c(4, 0, 0, 3), c(5, 0, 0, 0)];
        assert_eq!(choose(&hosts, 2), vec![5, 1]);
        assert_eq!(choose(&hosts, 10), vec![5, 1, 3, 4], "host 2 runs a cell");
        assert!(choose(&hosts, 0).is_empty());
    }

    #[test]
    fn property_never_a_busy_host_never_twice() {
        cases(300, |g| {
            let hosts: Vec<Candidate> = (0..g.u32(0, 20))
                .map(|i| c(u64::from(i), if g.bool() { 0 } else { g.u32(1, 8) }, g.u32(0, 8), g.u32(0, 9)))
                .collect();
            let n = g.u32(0, 25) as usize;
            let got = choose(&hosts, n);
            assert!(got.len() <= n);
            let idle = hosts.iter().filter(|h| h.committed_gpus == 0).count();
            assert_eq!(got.len(), n.min(idle));
            for id in &got {
                assert_eq!(hosts.iter().find(|h| h.node_id == *id).map(|h| h.committed_gpus), Some(0));
            }
            let mut d = got.clone();
            d.sort_unstable();
            d.dedup();
            assert_eq!(d.len(), got.len());
            let mut rev = hosts.clone();
            rev.reverse();
            assert_eq!(choose(&rev, n), got);
        });
    }
}
