//! Host memory in placement. Every replica is a Python process holding its user's imports
//! and the whole namespace, so at high subscription ratios a host's RAM, not its GPUs, can
//! run out. Each host reports in its load record its memory capacity for kernels, what its
//! kernels use now (measured: [`crate::kernel::memory_usage`]) and, per kernel, what a
//! replica of it needs: its measured memory, at least its namespace's size as state sync
//! knows it (a replica moving to a new host receives the whole namespace). The meta
//! leader turns the reports into placement's [`HostLoad`] memory: a host's measured use
//! plus the expected memory of the replicas placed there that it has not measured yet
//! (just placed, or a move's target), so that two placements in a row do not both count
//! on the same free memory. A host with no memory report (an older daemon) is unbounded.

use std::collections::BTreeMap;

use crate::cluster::control::records::{KernelRecord, LoadRecord};

/// What a new kernel's replica is expected to need before anything is measured, MiB: an
/// idle ipykernel with numpy imported measures 47 MiB resident (`python3 -c 'import
/// ipykernel, numpy'`), rounded up. Its namespace is empty; once it runs, its hosts
/// report what it really uses.
pub const NEW_REPLICA_MIB: u64 = 64;

const MIB: u64 = 1 << 20;

/// Reports move in steps of this many MiB, so that the load record (a raft write when it
/// changes) is not rewritten every time a busy kernel touches a few more pages.
const STEP_MIB: u64 = 16;

/// `bytes` in MiB, rounded up to the next step.
pub fn mib_up(bytes: u64) -> u64 {
    bytes.div_ceil(MIB).div_ceil(STEP_MIB).saturating_mul(STEP_MIB)
}

/// A host's report from what its kernels use now (`measured`) and the namespace sizes
/// of its replicas (`namespace`), both bytes by kernel id: (MiB used in all, MiB a replica
/// of each kernel needs). In MiB, so that the record, rewritten when it changes, is not
/// rewritten for every page a kernel touches.
pub fn report(measured: &BTreeMap<String, u64>, namespace: &BTreeMap<String, u64>) -> (u64, BTreeMap<String, u64>) {
    // Never below a new kernel's estimate: a kernel still starting (no process yet)
    // measures 0 and would otherwise vanish from its host's use.
    let kernel_mib = |b: u64| mib_up(b).max(NEW_REPLICA_MIB);
    let used = measured.values().map(|&b| kernel_mib(b)).fold(0u64, u64::saturating_add);
    let mut per_kernel: BTreeMap<String, u64> = measured.iter().map(|(k, &b)| (k.clone(), kernel_mib(b))).collect();
    for (k, &b) in namespace {
        let e = per_kernel.entry(k.clone()).or_insert(NEW_REPLICA_MIB);
        *e = (*e).max(mib_up(b));
    }
    (used, per_kernel)
}

/// What a replica of `kernel` is expected to need on a new host, MiB: the most any host
/// reports for it, else [`NEW_REPLICA_MIB`].
pub fn expected_replica_mib(loads: &[LoadRecord], kernel: &str) -> u64 {
    loads.iter().filter_map(|l| l.kernel_memory_mib.get(kernel).copied()).max().unwrap_or(NEW_REPLICA_MIB)
}

/// (capacity, used) MiB of host `node_id` for placement: its report's capacity (0: not
/// accounted) and measured use, plus the expected memory of each kernel `kernels` place
/// there (a move's target included) that the host does not report yet.
pub fn host_memory_mib(node_id: u64, loads: &[LoadRecord], kernels: &[KernelRecord]) -> (u64, u64) {
    let Some(load) = loads.iter().find(|l| l.node_id == node_id) else { return (0, 0) };
    let pending: u64 = kernels
        .iter()
        .filter(|k| k.hosts().contains(&node_id) && !load.kernel_memory_mib.contains_key(&k.id))
        .map(|k| expected_replica_mib(loads, &k.id))
        .fold(0, u64::saturating_add);
    (load.memory_capacity_mib, load.memory_used_mib.saturating_add(pending))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::control::records::ReplicaRecord;

    fn load(node_id: u64, capacity: u64, used: u64, kernels: &[(&str, u64)]) -> LoadRecord {
        LoadRecord {
            node_id,
            memory_capacity_mib: capacity,
            memory_used_mib: used,
            kernel_memory_mib: kernels.iter().map(|(k, m)| ((*k).to_owned(), *m)).collect(),
            ..LoadRecord::default()
        }
    }

    fn kernel(id: &str, nodes: &[u64]) -> KernelRecord {
        KernelRecord {
            id: id.to_owned(),
            name: "python3".into(),
            gpus: 0,
            group: 1,
            replicas: nodes.iter().zip(1u32..).map(|(&node_id, replica)| ReplicaRecord { replica, node_id }).collect(),
            created_ms: 0,
            env: BTreeMap::new(),
            moving: None,
            owner: None,
            owner_groups: Vec::new(),
        }
    }

    #[test]
    fn a_kernel_needs_its_measured_memory_at_least_its_namespace() {
        let measured =
            BTreeMap::from([("a".to_owned(), 70 * MIB + 1), ("b".to_owned(), 10 * MIB), ("starting".to_owned(), 0)]);
        let namespace = BTreeMap::from([("b".to_owned(), 300 * MIB), ("c".to_owned(), 2 * MIB)]);
        let (used, per) = report(&measured, &namespace);
        // In 16 MiB steps, never below a new kernel's 64: a kernel with no process yet counts.
        assert_eq!(used, 80 + 64 + 64, "what runs here");
        assert_eq!(
            per,
            BTreeMap::from([
                ("a".to_owned(), 80),
                ("b".to_owned(), 304),
                ("c".to_owned(), 64),
                ("starting".to_owned(), 64)
            ])
        );
    }

    #[test]
    fn the_expected_memory_is_the_largest_report_else_a_new_kernels() {
        let loads = [load(1, 0, 0, &[("a", 80)]), load(2, 0, 0, &[("a", 300)]), load(3, 0, 0, &[])];
        assert_eq!(expected_replica_mib(&loads, "a"), 300);
        assert_eq!(expected_replica_mib(&loads, "new"), NEW_REPLICA_MIB);
    }

    #[test]
    fn replicas_placed_but_not_measured_count_on_their_host() {
        let loads = [load(1, 1000, 200, &[("a", 150)]), load(2, 1000, 100, &[("a", 150)]), load(3, 0, 0, &[])];
        // Kernel a runs on 1 and 2 and is moving to 3; kernel b was just placed on 1 and 3.
        let mut a = kernel("a", &[1, 2]);
        a.moving = Some(crate::cluster::control::records::MoveRecord {
            replica: 1,
            from: 1,
            to: 3,
            new_replica: 3,
            reason: crate::cluster::control::records::MoveReason::Drain,
            started_ms: 0,
        });
        let kernels = [a, kernel("b", &[1, 3])];
        assert_eq!(host_memory_mib(1, &loads, &kernels), (1000, 200 + NEW_REPLICA_MIB));
        assert_eq!(host_memory_mib(2, &loads, &kernels), (1000, 100));
        assert_eq!(host_memory_mib(3, &loads, &kernels), (0, 150 + NEW_REPLICA_MIB), "not accounted, still summed");
        assert_eq!(host_memory_mib(9, &loads, &kernels), (0, 0), "no report: unbounded");
    }
}
