//! Cluster placement: on which hosts a kernel's replicas live. Pure: the meta group's
//! leader feeds it the live hosts and what the kernel records already place on them.
//!
//! Rule (NotebookOS): `replicas` distinct live hosts, least subscribed first, each within
//! the subscription ratio after taking the kernel: `(subscribed + gpus) <= ratio * gpus_total`.
//! A CPU-only kernel (0 GPUs) fits anywhere. Ties break on fewer replicas hosted, then the
//! lower node id, so every leader places the same kernel the same way.
//!
//! Host memory: each replica is a Python process holding its user's imports and
//! namespace, so at high ratios RAM, not GPUs, can run out. A host that reports a memory
//! capacity for replicas takes a replica only if `used + expected <= capacity`; a host
//! with capacity 0 (an old host, or one that does not account) is unbounded, so callers
//! that know nothing of memory place exactly as before.

use std::cmp::Ordering;

/// One live host as placement sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostLoad {
    /// Raft node id.
    pub node_id: u64,
    /// GPUs on the host.
    pub gpus_total: u32,
    /// GPUs requested by the kernel replicas placed on the host.
    pub subscribed_gpus: u32,
    /// Kernel replicas placed on the host.
    pub replicas: u32,
    /// Host memory replicas may use, MiB; 0: not accounted (no memory limit).
    pub memory_capacity_mib: u64,
    /// Host memory the replicas placed there use (or are expected to), MiB.
    pub memory_used_mib: u64,
}

/// Why a kernel (or a replica) could not be placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// Fewer hosts are up than the kernel needs replicas.
    #[error(
        "a kernel needs {needed} replicas on distinct hosts but only {up} host(s) are up{}",
        list(.hosts_up)
    )]
    TooFewHosts {
        /// Replicas needed.
        needed: usize,
        /// Live hosts.
        up: usize,
        /// Their ids.
        hosts_up: Vec<u64>,
    },
    /// Enough hosts are up, but too few have room for the kernel's GPUs.
    #[error(
        "a kernel asking for {gpus} GPU(s) needs {needed} hosts within the subscription ratio {ratio}; \
         only {eligible} of {up} live host(s) have room{}",
        list(.eligible_hosts)
    )]
    NoRoom {
        /// GPUs the kernel asks for.
        gpus: u32,
        /// Replicas needed.
        needed: usize,
        /// Hosts with room.
        eligible: usize,
        /// Live hosts.
        up: usize,
        /// The subscription ratio.
        ratio: String,
        /// Ids of the hosts with room.
        eligible_hosts: Vec<u64>,
    },
    /// Enough hosts have GPU room, but too few have the host memory a replica needs.
    #[error(
        "a kernel whose replicas need {memory_mib} MiB of host memory each needs {needed} hosts with that much free; \
         only {eligible} of the {gpu_eligible} live host(s) with GPU room have it{}",
        list(.eligible_hosts)
    )]
    NoMemory {
        /// Host memory each replica is expected to use, MiB.
        memory_mib: u64,
        /// Replicas needed.
        needed: usize,
        /// Hosts with GPU room and the memory.
        eligible: usize,
        /// Hosts with GPU room.
        gpu_eligible: usize,
        /// Ids of the hosts with GPU room and the memory.
        eligible_hosts: Vec<u64>,
    },
}

fn list(ids: &[u64]) -> String {
    if ids.is_empty() {
        String::new()
    } else {
        format!(" ({})", ids.iter().map(u64::to_string).collect::<Vec<_>>().join(", "))
    }
}

fn fits(h: &HostLoad, gpus: u32, ratio: f64) -> bool {
    if gpus == 0 {
        return true;
    }
    if h.gpus_total < gpus {
        // A cell could never bind its GPUs on this host, whatever the ratio.
        return false;
    }
    f64::from(h.subscribed_gpus.saturating_add(gpus)) <= ratio * f64::from(h.gpus_total) + 1e-9
}

/// Whether a replica expected to use `memory_mib` MiB fits in the host's memory for
/// replicas (always, when the host does not account memory).
pub fn fits_memory(h: &HostLoad, memory_mib: u64) -> bool {
    h.memory_capacity_mib == 0 || h.memory_used_mib.saturating_add(memory_mib) <= h.memory_capacity_mib
}

/// Subscription after placing `gpus` more: the sort key (hosts without GPUs sort last
/// among GPU kernels, which they cannot take anyway; first for CPU-only kernels by replicas).
fn subscription(h: &HostLoad, gpus: u32) -> f64 {
    if h.gpus_total == 0 {
        return if gpus == 0 { 0.0 } else { f64::INFINITY };
    }
    f64::from(h.subscribed_gpus.saturating_add(gpus)) / f64::from(h.gpus_total)
}

fn order(a: &HostLoad, b: &HostLoad, gpus: u32) -> Ordering {
    subscription(a, gpus)
        .partial_cmp(&subscription(b, gpus))
        .unwrap_or(Ordering::Equal)
        .then(a.replicas.cmp(&b.replicas))
        .then(a.node_id.cmp(&b.node_id))
}

/// Chooses `replicas` distinct hosts for a new kernel asking for `gpus` GPUs per cell.
/// Returns node ids, best first.
/// The replicas are expected to use no host memory ([`place_with_memory`]).
pub fn place(hosts: &[HostLoad], gpus: u32, replicas: usize, ratio: f64) -> Result<Vec<u64>, PlacementError> {
    place_with_memory(hosts, gpus, 0, replicas, ratio)
}

/// [`place`] for replicas each expected to use `memory_mib` MiB of host memory: hosts
/// that would exceed their memory for replicas are skipped ([`fits_memory`]).
pub fn place_with_memory(
    hosts: &[HostLoad],
    gpus: u32,
    memory_mib: u64,
    replicas: usize,
    ratio: f64,
) -> Result<Vec<u64>, PlacementError> {
    choose(hosts, gpus, memory_mib, replicas, ratio, &[])
}

/// Chooses one host for a replacement replica: a live host not in `exclude` (the hosts
/// already holding the kernel's other replicas, and the dead one). `None` when none fits.
pub fn replace(hosts: &[HostLoad], gpus: u32, ratio: f64, exclude: &[u64]) -> Option<u64> {
    replace_with_memory(hosts, gpus, 0, ratio, exclude)
}

/// [`replace`] for a replica expected to use `memory_mib` MiB of host memory.
pub fn replace_with_memory(hosts: &[HostLoad], gpus: u32, memory_mib: u64, ratio: f64, exclude: &[u64]) -> Option<u64> {
    choose(hosts, gpus, memory_mib, 1, ratio, exclude).ok().and_then(|v| v.first().copied())
}

fn choose(
    hosts: &[HostLoad],
    gpus: u32,
    memory_mib: u64,
    replicas: usize,
    ratio: f64,
    exclude: &[u64],
) -> Result<Vec<u64>, PlacementError> {
    let mut live: Vec<&HostLoad> = hosts.iter().filter(|h| !exclude.contains(&h.node_id)).collect();
    live.sort_by_key(|h| h.node_id);
    live.dedup_by_key(|h| h.node_id);
    if live.len() < replicas {
        return Err(PlacementError::TooFewHosts {
            needed: replicas,
            up: live.len(),
            hosts_up: live.iter().map(|h| h.node_id).collect(),
        });
    }
    let mut eligible: Vec<&HostLoad> = live.iter().copied().filter(|h| fits(h, gpus, ratio)).collect();
    if eligible.len() < replicas {
        return Err(PlacementError::NoRoom {
            gpus,
            needed: replicas,
            eligible: eligible.len(),
            up: live.len(),
            ratio: format!("{ratio}"),
            eligible_hosts: eligible.iter().map(|h| h.node_id).collect(),
        });
    }
    // GPU room first, then memory: the error names the resource that ran out.
    let gpu_eligible = eligible.len();
    eligible.retain(|h| fits_memory(h, memory_mib));
    if eligible.len() < replicas {
        return Err(PlacementError::NoMemory {
            memory_mib,
            needed: replicas,
            eligible: eligible.len(),
            gpu_eligible,
            eligible_hosts: eligible.iter().map(|h| h.node_id).collect(),
        });
    }
    eligible.sort_by(|a, b| order(a, b, gpus));
    Ok(eligible.iter().take(replicas).map(|h| h.node_id).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prop::cases;

    fn host(node_id: u64, gpus_total: u32, subscribed_gpus: u32, replicas: u32) -> HostLoad {
        HostLoad { node_id, gpus_total, subscribed_gpus, replicas, ..HostLoad::default() }
    }

    fn with_memory(h: HostLoad, memory_capacity_mib: u64, memory_used_mib: u64) -> HostLoad {
        HostLoad { memory_capacity_mib, memory_used_mib, ..h }
    }

    #[test]
    fn hosts_that_would_run_out_of_memory_are_skipped_and_the_refusal_names_memory() {
        // Host 2 is the least subscribed but has 100 MiB left; host 4 does not account memory.
        let hosts = [
            with_memory(host(1, 4, 4, 4), 8192, 1000),
            with_memory(host(2, 4, 0, 0), 8192, 8092),
            with_memory(host(3, 4, 2, 2), 8192, 0),
            host(4, 4, 3, 3),
        ];
        assert_eq!(place_with_memory(&hosts, 1, 100, 3, 3.0).unwrap(), vec![2, 3, 4], "100 MiB still fits host 2");
        assert_eq!(place_with_memory(&hosts, 1, 101, 3, 3.0).unwrap(), vec![3, 4, 1]);
        assert_eq!(place(&hosts, 1, 3, 3.0).unwrap(), vec![2, 3, 4], "no memory asked: as before");
        let err = place_with_memory(&hosts, 1, 7200, 3, 3.0).unwrap_err();
        assert_eq!(
            err,
            PlacementError::NoMemory {
                memory_mib: 7200,
                needed: 3,
                eligible: 2,
                gpu_eligible: 4,
                eligible_hosts: vec![3, 4]
            }
        );
        assert_eq!(
            err.to_string(),
            "a kernel whose replicas need 7200 MiB of host memory each needs 3 hosts with that much free; \
             only 2 of the 4 live host(s) with GPU room have it (3, 4)"
        );
        // A replacement skips the host that would run out, and finds none when all would.
        assert_eq!(replace_with_memory(&hosts, 1, 500, 3.0, &[3, 4]), Some(1));
        assert_eq!(replace_with_memory(&hosts, 1, 8000, 3.0, &[3, 4]), None);
        assert_eq!(replace(&hosts, 1, 3.0, &[3, 4]), Some(2));
    }

    #[test]
    fn a_host_over_its_memory_takes_nothing_more_and_gpu_room_is_reported_first() {
        let full = [with_memory(host(1, 4, 0, 0), 1024, 2048), host(2, 4, 0, 0), host(3, 4, 0, 0)];
        assert!(matches!(place(&full, 0, 3, 3.0), Err(PlacementError::NoMemory { eligible: 2, .. })));
        // No GPU room on host 3 and no memory on host 1: GPUs are named.
        let both = [with_memory(host(1, 4, 0, 0), 1024, 2048), host(2, 4, 0, 0), host(3, 1, 3, 3)];
        assert!(matches!(place(&both, 1, 3, 3.0), Err(PlacementError::NoRoom { eligible: 2, .. })));
    }

    #[test]
    fn three_distinct_hosts_least_subscribed_first() {
        let hosts = [host(1, 4, 8, 4), host(2, 4, 0, 0), host(3, 4, 4, 2), host(4, 4, 2, 1)];
        assert_eq!(place(&hosts, 1, 3, 3.0).unwrap(), vec![2, 4, 3]);
    }

    #[test]
    fn ties_break_on_replicas_then_node_id_whatever_the_input_order() {
        let a = [host(3, 2, 2, 1), host(1, 2, 2, 1), host(2, 2, 2, 0), host(4, 2, 2, 1)];
        let mut b = a.clone();
        b.reverse();
        assert_eq!(place(&a, 1, 3, 3.0).unwrap(), vec![2, 1, 3]);
        assert_eq!(place(&b, 1, 3, 3.0).unwrap(), vec![2, 1, 3]);
    }

    #[test]
    fn hosts_over_the_subscription_ratio_are_skipped() {
        // Host 1 has 2 GPUs, 6 subscribed: one more would be 7 > 3.0 x 2.
        let hosts = [host(1, 2, 6, 6), host(2, 2, 5, 5), host(3, 2, 0, 0), host(4, 2, 1, 1)];
        assert_eq!(place(&hosts, 1, 3, 3.0).unwrap(), vec![3, 4, 2]);
        let err = place(&hosts, 2, 3, 3.0).unwrap_err();
        assert!(matches!(err, PlacementError::NoRoom { eligible: 2, up: 4, .. }), "{err}");
        assert!(err.to_string().contains("subscription ratio 3"), "{err}");
    }

    #[test]
    fn a_kernel_asking_for_more_gpus_than_a_host_has_never_lands_there() {
        let hosts = [host(1, 8, 0, 0), host(2, 8, 0, 0), host(3, 2, 0, 0), host(4, 8, 0, 0)];
        assert_eq!(place(&hosts, 4, 3, 3.0).unwrap(), vec![1, 2, 4]);
    }

    #[test]
    fn cpu_only_kernels_fit_on_hosts_without_gpus() {
        let hosts = [host(1, 0, 0, 2), host(2, 0, 0, 0), host(3, 0, 0, 1)];
        assert_eq!(place(&hosts, 0, 3, 1.0).unwrap(), vec![2, 3, 1]);
        assert!(matches!(place(&hosts, 1, 3, 3.0), Err(PlacementError::NoRoom { eligible: 0, .. })));
    }

    #[test]
    fn fewer_live_hosts_than_replicas_is_refused_naming_them() {
        let hosts = [host(1, 2, 0, 0), host(2, 2, 0, 0)];
        let err = place(&hosts, 1, 3, 3.0).unwrap_err();
        assert_eq!(err, PlacementError::TooFewHosts { needed: 3, up: 2, hosts_up: vec![1, 2] });
        assert_eq!(err.to_string(), "a kernel needs 3 replicas on distinct hosts but only 2 host(s) are up (1, 2)");
        // The same host listed twice is still one host.
        let dup = [host(1, 2, 0, 0), host(1, 2, 0, 0), host(2, 2, 0, 0)];
        assert!(matches!(place(&dup, 1, 3, 3.0), Err(PlacementError::TooFewHosts { up: 2, .. })));
    }

    #[test]
    fn a_replacement_avoids_the_kernels_hosts_and_the_dead_one() {
        let hosts = [host(1, 2, 0, 0), host(2, 2, 0, 0), host(3, 2, 0, 0), host(4, 2, 3, 3), host(5, 2, 1, 1)];
        assert_eq!(replace(&hosts, 1, 3.0, &[1, 2, 3]), Some(5));
        assert_eq!(replace(&hosts, 1, 3.0, &[1, 2, 3, 5]), Some(4));
        assert_eq!(replace(&hosts, 4, 3.0, &[1, 2, 3]), None);
        assert_eq!(replace(&hosts, 1, 3.0, &[1, 2, 3, 4, 5]), None);
    }

    #[test]
    fn property_placement_is_valid_least_subscribed_and_order_independent() {
        cases(500, |g| {
            let n = g.u32(0, 10);
            let mut hosts: Vec<HostLoad> = (1..=u64::from(n))
                .map(|id| {
                    let h = host(id, [0, 1, 2, 4, 8][g.u32(0, 4) as usize], g.u32(0, 40), g.u32(0, 12));
                    // A third of the hosts do not account memory (capacity 0).
                    let cap = [0u64, 1024, 4096][g.u32(0, 2) as usize];
                    with_memory(h, cap, u64::from(g.u32(0, 4096)))
                })
                .collect();
            let gpus = [0, 1, 2, 4, 8][g.u32(0, 4) as usize];
            let memory = [0u64, 64, 512, 2048][g.u32(0, 3) as usize];
            let replicas = g.u32(1, 4) as usize;
            let ratio = f64::from(g.u32(2, 42)) / 2.0;
            let gpu_fitting = hosts.iter().filter(|h| fits(h, gpus, ratio)).count();
            let fitting: Vec<&HostLoad> =
                hosts.iter().filter(|h| fits(h, gpus, ratio) && fits_memory(h, memory)).collect();
            let got = place_with_memory(&hosts, gpus, memory, replicas, ratio);
            match &got {
                Ok(ids) => {
                    assert_eq!(ids.len(), replicas);
                    let mut distinct = ids.clone();
                    distinct.sort_unstable();
                    distinct.dedup();
                    assert_eq!(distinct.len(), replicas, "replicas on distinct hosts: {ids:?}");
                    for id in ids {
                        let h = hosts.iter().find(|h| h.node_id == *id).expect("a listed host");
                        assert!(fits(h, gpus, ratio), "host {id} over the ratio {ratio}");
                        assert!(fits_memory(h, memory), "host {id} would run out of memory");
                    }
                    // Least subscribed first: no host left out is strictly better than one chosen.
                    let worst = ids
                        .iter()
                        .map(|id| subscription(hosts.iter().find(|h| h.node_id == *id).expect("host"), gpus))
                        .fold(f64::NEG_INFINITY, f64::max);
                    for h in fitting.iter().filter(|h| !ids.contains(&h.node_id)) {
                        assert!(subscription(h, gpus) >= worst, "host {} was less subscribed", h.node_id);
                    }
                }
                Err(PlacementError::TooFewHosts { .. }) => assert!(hosts.len() < replicas),
                Err(PlacementError::NoRoom { eligible, .. }) => {
                    assert!(hosts.len() >= replicas);
                    assert_eq!(*eligible, gpu_fitting);
                    assert!(gpu_fitting < replicas);
                }
                Err(PlacementError::NoMemory { eligible, gpu_eligible, .. }) => {
                    assert!(*gpu_eligible >= replicas, "memory is named only when GPUs had room");
                    assert_eq!(*eligible, fitting.len());
                    assert!(fitting.len() < replicas);
                }
            }
            // Without memory asked and without accounting hosts, placement is as before memory.
            let unaccounted: Vec<HostLoad> =
                hosts.iter().map(|h| HostLoad { memory_capacity_mib: 0, ..h.clone() }).collect();
            assert_eq!(
                place_with_memory(&unaccounted, gpus, memory, replicas, ratio),
                place(&unaccounted, gpus, replicas, ratio)
            );
            hosts.reverse();
            assert_eq!(place_with_memory(&hosts, gpus, memory, replicas, ratio), got, "input order does not matter");
            // A replacement never lands on an excluded host, and exists exactly when one fits.
            let exclude: Vec<u64> = hosts.iter().map(|h| h.node_id).filter(|_| g.bool()).collect();
            let re = replace_with_memory(&hosts, gpus, memory, ratio, &exclude);
            let any =
                hosts.iter().any(|h| !exclude.contains(&h.node_id) && fits(h, gpus, ratio) && fits_memory(h, memory));
            assert_eq!(re.is_some(), any);
            assert!(re.is_none_or(|id| !exclude.contains(&id)));
        });
    }
}
