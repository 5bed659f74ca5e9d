//! `gpu_hours_per_day` across hosts: each host publishes its users' GPU time today in its
//! load record (whole GPU-seconds), and reads the other hosts' records every few seconds
//! into a [`PublishedUsage`] its binder adds to its own count. A host's count reaches the
//! others with the heartbeat's delay plus this one's.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::cluster::control::records::LoadRecord;
use crate::cluster::Cluster;
use crate::kernel::daily_usage::Usage;
use crate::kernel::gpu_hours::OtherHosts;

/// How often the other hosts' load records are read.
const READ_EVERY: Duration = Duration::from_secs(2);

/// `usage` (GPU-milliseconds) as a load record's fields: the day, GPU-seconds by user and by group.
pub(super) fn published(usage: &Usage) -> (u64, BTreeMap<String, u64>, BTreeMap<String, u64>) {
    let secs = |m: &BTreeMap<String, u64>| m.iter().map(|(k, ms)| (k.clone(), ms / 1000)).collect();
    (usage.day, secs(&usage.users), secs(&usage.groups))
}

/// A load record's GPU time as a [`Usage`] (GPU-milliseconds).
fn usage_of(load: &LoadRecord) -> Usage {
    let ms = |m: &BTreeMap<String, u64>| m.iter().map(|(k, s)| (k.clone(), s.saturating_mul(1000))).collect();
    Usage { day: load.usage_day, users: ms(&load.gpu_seconds_today), groups: ms(&load.group_gpu_seconds_today) }
}

/// The other hosts' GPU time as last read from their load records.
#[derive(Debug, Default)]
pub(super) struct PublishedUsage {
    others: RwLock<Vec<Usage>>,
}

impl OtherHosts for PublishedUsage {
    fn usage(&self, day: u64) -> Usage {
        let mut sum = Usage { day, ..Usage::default() };
        for u in self.others.read().unwrap_or_else(std::sync::PoisonError::into_inner).iter() {
            sum.add(u);
        }
        sum
    }
}

impl PublishedUsage {
    fn set(&self, loads: &[LoadRecord], own: u64) {
        let others = loads.iter().filter(|l| l.node_id != own).map(usage_of).collect();
        *self.others.write().unwrap_or_else(std::sync::PoisonError::into_inner) = others;
    }
}

/// Reads the other hosts' load records every few seconds into `into`.
pub(super) fn start(cluster: Arc<Cluster>, own: u64, into: Arc<PublishedUsage>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(READ_EVERY);
        loop {
            every.tick().await;
            match cluster.loads().await {
                Ok(loads) => into.set(&loads, own),
                // Not ready yet, or no quorum: the last read stands.
                Err(e) => tracing::debug!(error = %e, "other hosts' GPU time not read"),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_hosts_records_of_today_are_added_in_milliseconds() {
        let load = |node_id, day, alice| LoadRecord {
            node_id,
            usage_day: day,
            gpu_seconds_today: BTreeMap::from([("alice".to_owned(), alice)]),
            group_gpu_seconds_today: BTreeMap::from([("ml".to_owned(), alice)]),
            ..LoadRecord::default()
        };
        let p = PublishedUsage::default();
        p.set(
            &[load(1, 7, 100), load(2, 7, 5), load(3, 6, 999), LoadRecord { node_id: 4, ..LoadRecord::default() }],
            1,
        );
        let u = p.usage(7);
        assert_eq!(u.users["alice"], 5_000, "host 1 is this one; host 3 counted yesterday");
        assert_eq!(u.groups["ml"], 5_000);
        let mut mine = Usage { day: 7, ..Usage::default() };
        mine.users.insert("alice".into(), 1_999);
        assert_eq!(published(&mine).1["alice"], 1, "whole seconds");
        // An older host's record has none of it: it counts nothing (day 0 is long past).
        let old = r#"{"node_id":2,"gpus_total":1,"gpus_committed":0,"gpus_idle":1,"replicas":0,"subscribed_gpus":0}"#;
        let old: LoadRecord = serde_json::from_str(old).expect("an older host's load record parses");
        assert_eq!(usage_of(&old), Usage::default());
    }
}
