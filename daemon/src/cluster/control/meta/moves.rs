//! Moving a replica to another host (migration), on the meta leader: beginning a move
//! (which host, chosen by the scheduler core), finishing it (the new replica takes the old
//! one's place in the record) and aborting it. The record's `moving` field
//! ([`MoveRecord`]) says what is under way; [`crate::cluster::control::moves`] drives moves to
//! their end, the supervisors start and stop the replicas, and the kernel group's leader
//! follows the record's hosts (learner first, then voter).
//!
//! Who asks: a front-end whose cell every replica yielded ([`MoveReason::AllYield`]: the
//! core's [`migrate::choose`] picks the replica on the most subscribed host and the
//! best-fit host that can commit the cell's GPUs now), and a host being drained
//! ([`MoveReason::Drain`]: its replica goes where placement would put a lost one).

use std::collections::BTreeSet;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::error::{ClusterError, Result};
use super::forward::{Authority, HttpMethod};
use super::handle::Cluster;
use crate::cluster::control::records::{self, keys, KernelRecord, MoveReason, MoveRecord, ReplicaRecord};
use nbos_sched::migrate::{self, CandidateHost, ReplicaAt};
use nbos_sched::placement;

/// What `POST /api/v1/cluster/kernels/{id}/migrate` takes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveRequest {
    /// Why.
    pub reason: MoveReason,
    /// The host whose replica must move (a drain); `None` lets the core choose (all-YIELD).
    #[serde(default)]
    pub from: Option<u64>,
}

/// What a move request found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum MoveAnswer {
    /// A move is under way (begun now or earlier): the record with its `moving`.
    Moving {
        /// The kernel's record.
        record: KernelRecord,
    },
    /// No host can take the replica now.
    NoHost,
    /// Nothing to move: the host holds no replica of the kernel (already moved).
    NotThere {
        /// The kernel's record.
        record: KernelRecord,
    },
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Cluster {
    /// Hosts being drained (`draining/` marks): placement and moves put nothing new there.
    pub async fn draining_hosts(&self) -> Result<BTreeSet<u64>> {
        let out = self.meta.range_stale(keys::DRAINING.as_bytes(), 0).await?;
        Ok(out.kvs.iter().filter_map(|kv| records::decode::<u64>(&kv.key, &kv.value).ok()).collect())
    }

    /// Marks this host as draining (or not): placement stops choosing it.
    pub async fn set_draining(&self, draining: bool) -> Result<()> {
        let me = self.settings.node_id;
        if draining {
            self.meta.put(keys::draining(me), records::encode(&me)).await?;
        } else {
            self.meta.delete(keys::draining(me)).await?;
        }
        Ok(())
    }

    /// Withdraws host `node_id`'s draining mark (the autoscaler giving a release up): placement
    /// may choose it again. Moves already begun go on.
    pub async fn withdraw_draining(&self, node_id: u64) -> Result<()> {
        self.meta.delete(keys::draining(node_id)).await?;
        Ok(())
    }

    /// Begins moving a replica of `kernel` (on the meta leader, forwarded when needed).
    pub async fn move_replica(&self, kernel: &str, request: MoveRequest) -> Result<MoveAnswer> {
        let path = format!("/api/v1/cluster/kernels/{kernel}/migrate");
        self.on_leader(HttpMethod::Post, &path, Some(&request), Authority::Host, || {
            self.move_replica_here(kernel, &request)
        })
        .await
    }

    /// [`Cluster::move_replica`] on this host, which must be the meta leader. One move per
    /// kernel at a time: while one is under way, asking again answers it.
    pub async fn move_replica_here(&self, kernel: &str, request: &MoveRequest) -> Result<MoveAnswer> {
        self.require_leader().await?;
        let _placing = self.placing.lock().await;
        let reason = request.reason;
        // Hosts as placement sees them, with the GPUs each could commit now (`load/`, stale:
        // the target's own election decides for real once the replica is there).
        let loads = self.loads().await?;
        let hosts: Vec<(placement::HostLoad, u32)> = self
            .host_loads()
            .await?
            .into_iter()
            .map(|h| {
                let idle = loads.iter().find(|l| l.node_id == h.node_id).map_or(0, |l| l.gpus_idle);
                (h, idle)
            })
            .collect();
        let memory_mib = super::memory::expected_replica_mib(&loads, kernel);
        let mut no_host = false;
        let (record, written) = self
            .modify_kernel(kernel, |record| {
                no_host = false;
                if record.moving.is_some() {
                    return Ok(None);
                }
                if let Some(from) = request.from {
                    if !record.replicas.iter().any(|r| r.node_id == from) {
                        return Ok(None);
                    }
                }
                let chosen = self.choose_move(record, request, &hosts, memory_mib);
                let Some((replica, from, to)) = chosen else {
                    no_host = true;
                    return Ok(None);
                };
                let new_replica = record.replicas.iter().map(|r| r.replica).max().unwrap_or(0) + 1;
                let mut new = record.clone();
                new.moving = Some(MoveRecord { replica, from, to, new_replica, reason, started_ms: now_ms() });
                Ok(Some(new))
            })
            .await?;
        if written {
            if let Some(m) = &record.moving {
                self.moves.count(reason.as_str(), "started");
                tracing::info!(
                    kernel,
                    replica = m.replica,
                    from = m.from,
                    to = m.to,
                    reason = reason.as_str(),
                    "replica move begun"
                );
            }
        }
        match (&record.moving, no_host) {
            (Some(m), _) => {
                if let Some(from) = request.from.filter(|f| *f != m.from) {
                    return Err(ClusterError::Conflict(format!(
                        "kernel {kernel}: its replica on host {} is moving to host {}; host {from}'s can move once that is done",
                        m.from, m.to
                    )));
                }
                Ok(MoveAnswer::Moving { record })
            }
            (None, true) => {
                self.moves.count(reason.as_str(), "no_host");
                if reason == MoveReason::AllYield {
                    self.demand.note_waiting(record.gpus);
                }
                Ok(MoveAnswer::NoHost)
            }
            (None, false) => Ok(MoveAnswer::NotThere { record }),
        }
    }

    /// (replica, from, to) of a move for `request`, or `None` when no host can take it
    /// (a replica expected to need `memory_mib` MiB of host memory there).
    fn choose_move(
        &self,
        record: &KernelRecord,
        request: &MoveRequest,
        hosts: &[(placement::HostLoad, u32)],
        memory_mib: u64,
    ) -> Option<(u32, u64, u64)> {
        let ratio = self.settings.subscription_ratio;
        let exclude = record.hosts();
        if let Some(from) = request.from {
            let r = record.replicas.iter().find(|r| r.node_id == from)?;
            let loads: Vec<placement::HostLoad> = hosts.iter().map(|(l, _)| l.clone()).collect();
            return placement::replace_with_memory(&loads, record.gpus, memory_mib, ratio, &exclude)
                .map(|to| (r.replica, from, to));
        }
        let subscribed =
            |node: u64| hosts.iter().find(|(l, _)| l.node_id == node).map_or(0, |(l, _)| l.subscribed_gpus);
        let replicas: Vec<ReplicaAt> = record
            .replicas
            .iter()
            .map(|r| ReplicaAt { replica: r.replica, node_id: r.node_id, host_subscribed: subscribed(r.node_id) })
            .collect();
        let targets: Vec<CandidateHost> = hosts
            .iter()
            .map(|(l, idle)| CandidateHost {
                node_id: l.node_id,
                gpus_total: l.gpus_total,
                gpus_available: *idle,
                subscribed_gpus: l.subscribed_gpus,
                memory_capacity_mib: l.memory_capacity_mib,
                memory_used_mib: l.memory_used_mib,
            })
            .collect();
        migrate::choose_with_memory(&replicas, &targets, record.gpus, memory_mib, ratio)
            .map(|m| (m.replica, m.from, m.to))
    }

    /// Finishes `kernel`'s move (meta leader): the new replica takes the old one's place.
    /// When the old replica is no longer in the record (its host was re-placed meanwhile),
    /// the move is dropped instead.
    pub async fn finish_move_here(&self, kernel: &str) -> Result<Option<MoveRecord>> {
        self.require_leader().await?;
        let _placing = self.placing.lock().await;
        let mut finished = None;
        self.modify_kernel(kernel, |record| {
            finished = None;
            let Some(m) = record.moving.clone() else { return Ok(None) };
            let mut new = record.clone();
            new.moving = None;
            if let Some(r) = new.replicas.iter_mut().find(|r| r.node_id == m.from && r.replica == m.replica) {
                *r = ReplicaRecord { replica: m.new_replica, node_id: m.to };
                finished = Some(m);
            }
            Ok(Some(new))
        })
        .await?;
        if let Some(m) = &finished {
            let took = now_ms().saturating_sub(m.started_ms);
            self.moves.count(m.reason.as_str(), "completed");
            #[expect(clippy::cast_precision_loss, reason = "milliseconds of a move")]
            self.moves
                .seconds
                .get_or_create(&crate::cluster::control::elastic_metrics::ReasonLabels { reason: m.reason.as_str() })
                .observe(took as f64 / 1000.0);
            tracing::info!(
                kernel,
                replica = m.new_replica,
                from = m.from,
                to = m.to,
                took_ms = took,
                "replica move finished"
            );
        }
        Ok(finished)
    }

    /// Drops `kernel`'s move (meta leader): the target's replica is stopped, the old one stays.
    pub async fn abort_move_here(&self, kernel: &str, why: &str) -> Result<()> {
        self.require_leader().await?;
        let _placing = self.placing.lock().await;
        let mut aborted = None;
        self.modify_kernel(kernel, |record| {
            aborted = record.moving.clone();
            let Some(_) = &aborted else { return Ok(None) };
            let mut new = record.clone();
            new.moving = None;
            Ok(Some(new))
        })
        .await?;
        if let Some(m) = aborted {
            self.moves.count(m.reason.as_str(), "aborted");
            tracing::warn!(kernel, from = m.from, to = m.to, why, "replica move aborted");
        }
        Ok(())
    }

    /// Puts this host's quiesced mark for `kernel` (on the host lease, like a ready mark).
    pub async fn put_quiesced(&self, kernel: &str) -> Result<()> {
        let Some(lease) = self.host_lease() else {
            return Err(ClusterError::NotReady("this host has no lease yet".into()));
        };
        self.meta.put_with_lease(keys::quiesced(kernel, self.settings.node_id), Vec::new(), lease).await?;
        Ok(())
    }

    /// Withdraws this host's quiesced mark for `kernel`.
    pub async fn clear_quiesced(&self, kernel: &str) -> Result<()> {
        self.meta.delete(keys::quiesced(kernel, self.settings.node_id)).await?;
        Ok(())
    }

    /// Hosts whose replica of `kernel` is quiesced.
    pub async fn quiesced_hosts(&self, kernel: &str) -> Result<Vec<u64>> {
        let prefix = format!("{}{kernel}/", keys::QUIESCED);
        let out = self.meta.range_stale(prefix.as_bytes(), 0).await?;
        Ok(out
            .kvs
            .iter()
            .filter_map(|kv| std::str::from_utf8(&kv.key).ok()?.strip_prefix(&prefix)?.parse::<u64>().ok())
            .collect())
    }
}
