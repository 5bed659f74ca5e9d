//! The migration choice when every replica of a kernel yields a cell (no replica's host
//! can commit its GPUs now): which replica moves, and to which host.
//!
//! NotebookOS's code moves a random replica to a host chosen by its placer. Ours is
//! deterministic and aims at starting the cell at once: the target must be able to
//! commit the cell's GPUs now, must not hold another replica of the kernel (replicas
//! stay on distinct hosts) and must stay within the subscription ratio. Among those,
//! the best fit (fewest available GPUs that still suffice), so that whole hosts stay
//! free for large requests; then the least subscribed; then the lowest node id. The
//! replica that moves is the one on the most subscribed host (it relieves the most
//! contended host); ties go to the lowest replica number. `None` means: scale out.
//! A target must also have the host memory the replica is expected to use
//! ([`crate::placement::fits_memory`]'s rule: capacity 0 is unbounded).

/// One replica of the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaAt {
    /// Replica number.
    pub replica: u32,
    /// Its host.
    pub node_id: u64,
    /// GPUs subscribed on its host (for choosing which replica moves).
    pub host_subscribed: u32,
}

/// A host that could receive the replica.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CandidateHost {
    /// Node id.
    pub node_id: u64,
    /// GPUs on the host.
    pub gpus_total: u32,
    /// GPUs a cell could commit there now (free or idle-held).
    pub gpus_available: u32,
    /// GPUs subscribed by the replicas placed there.
    pub subscribed_gpus: u32,
    /// Host memory replicas may use, MiB; 0: not accounted (no memory limit).
    pub memory_capacity_mib: u64,
    /// Host memory the replicas placed there use, MiB.
    pub memory_used_mib: u64,
}

/// The decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// The replica that moves.
    pub replica: u32,
    /// From this host.
    pub from: u64,
    /// To this host.
    pub to: u64,
}

/// Whether `t` can take a replica of a kernel asking for `gpus` and run its cell now
/// (the replica expected to use no host memory: [`eligible_with_memory`]).
pub fn eligible(t: &CandidateHost, gpus: u32, ratio: f64, kernel_hosts: &[u64]) -> bool {
    eligible_with_memory(t, gpus, 0, ratio, kernel_hosts)
}

/// [`eligible`] for a replica expected to use `memory_mib` MiB of host memory.
pub fn eligible_with_memory(t: &CandidateHost, gpus: u32, memory_mib: u64, ratio: f64, kernel_hosts: &[u64]) -> bool {
    let memory_fits =
        t.memory_capacity_mib == 0 || t.memory_used_mib.saturating_add(memory_mib) <= t.memory_capacity_mib;
    memory_fits
        && !kernel_hosts.contains(&t.node_id)
        && t.gpus_available >= gpus
        && t.gpus_total >= gpus
        && f64::from(t.subscribed_gpus.saturating_add(gpus)) <= ratio * f64::from(t.gpus_total) + 1e-9
}

/// Chooses the migration for a cell needing `gpus` GPUs of a kernel whose replicas are
/// `replicas`, among `hosts` (the live hosts; those holding a replica are skipped).
pub fn choose(replicas: &[ReplicaAt], hosts: &[CandidateHost], gpus: u32, ratio: f64) -> Option<Migration> {
    choose_with_memory(replicas, hosts, gpus, 0, ratio)
}

/// [`choose`] for a kernel whose replica is expected to use `memory_mib` MiB of host
/// memory: targets that would exceed their memory for replicas are skipped.
pub fn choose_with_memory(
    replicas: &[ReplicaAt],
    hosts: &[CandidateHost],
    gpus: u32,
    memory_mib: u64,
    ratio: f64,
) -> Option<Migration> {
    let kernel_hosts: Vec<u64> = replicas.iter().map(|r| r.node_id).collect();
    let to = hosts
        .iter()
        .filter(|t| eligible_with_memory(t, gpus, memory_mib, ratio, &kernel_hosts))
        .min_by_key(|t| (t.gpus_available, t.subscribed_gpus, t.node_id))?;
    let from = replicas.iter().min_by_key(|r| (std::cmp::Reverse(r.host_subscribed), r.replica))?;
    Some(Migration { replica: from.replica, from: from.node_id, to: to.node_id })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prop::cases;

    fn t(node_id: u64, gpus_available: u32, subscribed_gpus: u32) -> CandidateHost {
        CandidateHost { node_id, gpus_total: 8, gpus_available, subscribed_gpus, ..CandidateHost::default() }
    }

    fn r(replica: u32, node_id: u64, host_subscribed: u32) -> ReplicaAt {
        ReplicaAt { replica, node_id, host_subscribed }
    }

    #[test]
    fn best_fit_target_that_can_commit_and_holds_no_replica() {
        let reps = [r(1, 1, 10), r(2, 2, 20), r(3, 3, 5)];
        let hosts = [t(1, 8, 10), t(2, 8, 20), t(3, 8, 5), t(4, 8, 0), t(5, 2, 4), t(6, 1, 0)];
        // Host 6 has too few GPUs, 1-3 hold replicas: host 5 is the tightest fit.
        assert_eq!(choose(&reps, &hosts, 2, 3.0), Some(Migration { replica: 2, from: 2, to: 5 }));
        // A whole-host request can only go to the free host 4.
        assert_eq!(choose(&reps, &hosts, 8, 3.0).map(|m| m.to), Some(4));
    }

    #[test]
    fn none_when_no_host_can_commit_now_or_subscription_is_full() {
        let reps = [r(1, 1, 0), r(2, 2, 0), r(3, 3, 0)];
        assert_eq!(choose(&reps, &[t(1, 8, 0), t(4, 0, 0)], 1, 3.0), None);
        assert_eq!(choose(&reps, &[t(4, 8, 24)], 1, 3.0), None, "24 + 1 > 3 x 8");
        assert_eq!(choose(&reps, &[t(4, 8, 23)], 1, 3.0).map(|m| m.to), Some(4));
    }

    #[test]
    fn targets_that_would_run_out_of_memory_are_skipped() {
        let reps = [r(1, 1, 10), r(2, 2, 20), r(3, 3, 5)];
        let mem = |h: CandidateHost, cap: u64, used: u64| CandidateHost {
            memory_capacity_mib: cap,
            memory_used_mib: used,
            ..h
        };
        // Host 5 is the best GPU fit but has 300 MiB left; host 4 does not account memory.
        let hosts = [mem(t(4, 8, 0), 0, 0), mem(t(5, 2, 4), 4096, 3796), mem(t(6, 4, 0), 4096, 0)];
        assert_eq!(choose_with_memory(&reps, &hosts, 2, 300, 3.0).map(|m| m.to), Some(5));
        assert_eq!(choose_with_memory(&reps, &hosts, 2, 301, 3.0).map(|m| m.to), Some(6));
        assert_eq!(choose_with_memory(&reps, &hosts, 2, 5000, 3.0).map(|m| m.to), Some(4));
        assert_eq!(choose_with_memory(&reps, &hosts[1..], 2, 5000, 3.0), None, "scale out");
        assert_eq!(choose(&reps, &hosts, 2, 3.0).map(|m| m.to), Some(5), "no memory asked: as before");
    }

    #[test]
    fn property_the_choice_is_valid_complete_and_order_independent() {
        cases(500, |g| {
            let n = g.u32(1, 12);
            let mut hosts: Vec<CandidateHost> = (1..=u64::from(n))
                .map(|id| CandidateHost {
                    node_id: id,
                    gpus_total: 8,
                    gpus_available: g.u32(0, 8),
                    subscribed_gpus: g.u32(0, 30),
                    memory_capacity_mib: [0u64, 1024, 4096][g.u32(0, 2) as usize],
                    memory_used_mib: u64::from(g.u32(0, 4096)),
                })
                .collect();
            let memory = [0u64, 64, 512, 2048][g.u32(0, 3) as usize];
            let reps: Vec<ReplicaAt> = (1..=3u32).map(|i| r(i, u64::from(g.u32(1, n + 2)), g.u32(0, 30))).collect();
            let gpus = [1, 2, 4, 8][g.u32(0, 3) as usize];
            let ratio = f64::from(g.u32(1, 7));
            let got = choose_with_memory(&reps, &hosts, gpus, memory, ratio);
            let kernel_hosts: Vec<u64> = reps.iter().map(|r| r.node_id).collect();
            let any = hosts.iter().any(|h| eligible_with_memory(h, gpus, memory, ratio, &kernel_hosts));
            assert_eq!(got.is_some(), any, "a migration exactly when some host is eligible");
            if let Some(m) = got {
                let to = hosts.iter().find(|h| h.node_id == m.to).expect("target is a listed host");
                assert!(eligible_with_memory(to, gpus, memory, ratio, &kernel_hosts));
                assert!(
                    to.memory_capacity_mib == 0 || to.memory_used_mib + memory <= to.memory_capacity_mib,
                    "the target has the memory"
                );
                assert!(reps.iter().any(|r| r.replica == m.replica && r.node_id == m.from));
                assert!(!kernel_hosts.contains(&m.to), "replicas stay on distinct hosts");
            }
            // Hosts that do not account memory: the choice is the one without memory.
            let unaccounted: Vec<CandidateHost> =
                hosts.iter().map(|h| CandidateHost { memory_capacity_mib: 0, ..*h }).collect();
            assert_eq!(
                choose_with_memory(&reps, &unaccounted, gpus, memory, ratio),
                choose(&reps, &unaccounted, gpus, ratio)
            );
            hosts.reverse();
            assert_eq!(choose_with_memory(&reps, &hosts, gpus, memory, ratio), got, "input order does not matter");
        });
    }
}
