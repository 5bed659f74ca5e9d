//! Runs a cell this replica won: the I/O around [`WonCell`] (the namespace's catch-up,
//! the kernel, the namespace export and commit, the kernel's lock, the reply to the
//! front-end). It feeds the machine what each step came to and performs what it says.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::outcome_reply::outcome_reply;
use super::replica::Replica;
use super::won_cell::{Dispatched, Exported, Step, WonCell, WonCellAction, WonCellEvent};
use super::ReplicaHost;
use crate::cluster::cells::election::{self, Proposer};
use crate::cluster::cells::state_sync;
use crate::cluster::cells::sync_metrics::{PathLabels, SideLabels};
use crate::cluster::control::records::{decode, keys, ElectionRecord, RunningRecord};
use crate::jupyter::{Channel, Message};
use crate::kernel::binding::Dispatch;
use crate::kernel::hub::ClientId;
use crate::kernel::LocalKernel;

/// How long a won cell waits for the local namespace to catch up before it fails.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);

/// A cell this replica won: its id, the committed record and when the proposal started.
pub(super) struct Won {
    pub(super) cell: String,
    pub(super) record: ElectionRecord,
    pub(super) started: Instant,
}

impl ReplicaHost {
    /// Runs a won cell: catch up, execute, export + commit, then release the reply.
    pub(super) async fn run_won(
        self: Arc<Self>,
        kernel: Arc<LocalKernel>,
        local: Arc<Replica>,
        client: ClientId,
        msg: Message,
        msg_id: String,
        won: Won,
    ) {
        let Won { cell, record, started } = won;
        // The kernel's lock this win took: the namespace commit removes it; every other end
        // of the cell releases it here.
        let kv = self.store.kv(local.group);
        let lock = RunningRecord { cell: cell.clone(), replica: local.replica, node_id: self.node_id };
        let (mut machine, mut actions) = WonCell::start(&cell, local.replica, self.node_id);
        let mut held = None;
        let mut reply: Option<Message> = None;
        let mut caught_up_us = 0;
        while !actions.is_empty() {
            let mut next = Vec::new();
            for action in actions {
                let event = match action {
                    WonCellAction::CatchUp => {
                        // The swap committed at some revision R and this node applies entries in
                        // order: once its own state shows the record, every cell committed before
                        // R is in its state too, so the namespace is caught up when the applier
                        // reaches the local `ns-cell` (no linearizable read through the leader on
                        // the cell's path).
                        let key = keys::elect(&cell);
                        let elected = |v: &[u8]| decode::<ElectionRecord>(key.as_bytes(), v).is_ok_and(|r| r == record);
                        let caught_up = local.applier.catch_up_after(key.as_bytes(), elected, CATCH_UP_TIMEOUT).await;
                        if let Err(e) = &caught_up {
                            tracing::warn!(kernel = %kernel.id, cell, error = format!("{e:#}"), "won a cell but cannot catch up");
                        }
                        caught_up_us = started.elapsed().as_micros() as u64;
                        Some(WonCellEvent::CaughtUp(caught_up.map(drop).map_err(|e| format!("{e:#}"))))
                    }
                    WonCellAction::HoldReplyAndDispatch => {
                        held = Some(kernel.hub.hold_reply(&msg_id));
                        kernel.hub.note_submitted(&msg_id, Instant::now());
                        let forwarded = self.dispatch(&kernel, client, &msg).await;
                        tracing::debug!(
                            kernel = %kernel.id, cell, caught_up_us, sent_us = started.elapsed().as_micros() as u64,
                            "won cell sent to the kernel (times since the proposal started)"
                        );
                        if let Err(e) = &forwarded {
                            tracing::warn!(kernel = %kernel.id, cell, error = e, "could not start a won cell");
                        }
                        Some(WonCellEvent::Dispatched(forwarded))
                    }
                    WonCellAction::AwaitReply => {
                        let replied = match held.take() {
                            Some(held) => tokio::select! {
                                r = held => r.ok(),
                                () = wait_dead(&kernel) => None,
                            },
                            None => None,
                        };
                        if replied.is_none() {
                            tracing::warn!(kernel = %kernel.id, cell, "the replica died while running a won cell");
                        }
                        let count = replied.as_ref().map(|r| {
                            serde_json::from_slice::<serde_json::Value>(&r.content)
                                .ok()
                                .and_then(|c| c.get("execution_count").cloned())
                                .unwrap_or_else(|| serde_json::json!(0))
                        });
                        reply = replied;
                        Some(WonCellEvent::Replied(count))
                    }
                    WonCellAction::ExportAndCommit => {
                        let me = Proposer { replica: local.replica, node_id: self.node_id };
                        let export_started = Instant::now();
                        let exported = state_sync::export_and_commit(
                            &kernel,
                            &kv,
                            &self.objects,
                            &self.sync,
                            &cell,
                            me,
                            &local.applier,
                        )
                        .await;
                        let m = &self.sync_metrics;
                        m.export_seconds.observe(export_started.elapsed().as_secs_f64());
                        let exported = match exported {
                            Ok(x) => {
                                m.cells_exported.inc();
                                m.bytes.get_or_create(&PathLabels { path: "log" }).inc_by(x.inline_bytes);
                                m.bytes.get_or_create(&PathLabels { path: "object_store" }).inc_by(x.object_bytes);
                                m.unpicklable_names.inc_by(x.unpicklable.len() as u64);
                                let unpicklable =
                                    x.unpicklable.iter().map(|u| format!("{}: {}", u.name, u.error)).collect();
                                Ok(Exported { revision: x.revision, unpicklable })
                            }
                            Err(e) => {
                                m.failures.get_or_create(&SideLabels { side: "export" }).inc();
                                tracing::error!(kernel = %kernel.id, cell, error = format!("{e:#}"), "namespace sync failed");
                                Err(format!("{e:#}"))
                            }
                        };
                        Some(WonCellEvent::Exported(exported))
                    }
                    WonCellAction::UnholdReply => {
                        kernel.hub.unhold_reply(&msg_id);
                        None
                    }
                    WonCellAction::Warn(text) => {
                        kernel.publish(&msg, "stream", &serde_json::json!({ "name": "stderr", "text": text }));
                        None
                    }
                    WonCellAction::MarkDiverged(why) => {
                        local.applier.mark_diverged(why);
                        None
                    }
                    WonCellAction::ReleaseLock => {
                        election::release_running(&kv, &lock).await;
                        None
                    }
                    WonCellAction::RejectCell { ename, evalue } => {
                        kernel.reject_cell(client, &msg, ename, &evalue);
                        None
                    }
                    WonCellAction::AnswerNotRun { content } => {
                        let answer = outcome_reply(&msg, self.executed(&local, 0), content);
                        kernel.hub.release(client, Channel::Shell, answer, SystemTime::now());
                        None
                    }
                    WonCellAction::ReleaseReply { revision, dispatched, content } => {
                        if let Some(mut reply) = reply.take() {
                            if let Some(content) = content {
                                reply.content = bytes::Bytes::from(content.to_string());
                            }
                            let mut meta: serde_json::Value =
                                serde_json::from_slice(&reply.metadata).unwrap_or_else(|_| serde_json::json!({}));
                            if !meta.is_object() {
                                meta = serde_json::json!({});
                            }
                            meta["nbos_election"] = self.executed(&local, revision);
                            if let Some(d) = dispatched {
                                meta["nbos_election"]["dispatched_unix_us"] = serde_json::json!(unix_us(d.written));
                                if let Some(b) = d.gpus_bound {
                                    meta["nbos_election"]["gpus_bound_unix_us"] = serde_json::json!(unix_us(b));
                                }
                            }
                            reply.metadata = bytes::Bytes::from(meta.to_string());
                            kernel.hub.release(client, Channel::Shell, reply, SystemTime::now());
                        }
                        None
                    }
                };
                if let Some(event) = event {
                    next.extend(machine.on(event));
                }
            }
            actions = next;
        }
        debug_assert_eq!(machine.step(), Step::Done, "a won cell stopped before its end");
    }

    /// `metadata.nbos_election` of a cell this replica executed, at group revision `revision`.
    fn executed(&self, local: &Replica, revision: u64) -> serde_json::Value {
        serde_json::json!({
            "outcome": "executed",
            "replica": local.replica,
            "node_id": self.node_id,
            "revision": revision,
        })
    }

    /// Sends a won cell to its kernel: when it was written to the kernel's shell socket
    /// (after binding committed its GPUs), the end of its election as a user meets it,
    /// which `nbos bench election` measures. A GPU cell is written by binding's own task,
    /// which reports the time. `None`: binding refused it (and sent the error reply) or
    /// the kernel went away.
    async fn dispatch(
        &self,
        kernel: &Arc<LocalKernel>,
        client: ClientId,
        msg: &Message,
    ) -> Result<Option<Dispatched>, String> {
        let forwarded = match self.kernels.binder().dispatch(kernel, client, Channel::Shell, msg.clone()) {
            Dispatch::Now(m) => kernel
                .send_from_client(client, Channel::Shell, m)
                .await
                .map(|()| Some(Dispatched { gpus_bound: None, written: SystemTime::now() })),
            Dispatch::Bound(written) => tokio::select! {
                w = written => match w {
                    Ok(Ok(w)) => Ok(Some(Dispatched { gpus_bound: Some(w.bound), written: w.written })),
                    Ok(Err(e)) => Err(anyhow::anyhow!(e)),
                    // Refused (binding sent the error reply) or dropped with the kernel.
                    Err(_) => Ok(None),
                },
                () = wait_dead(kernel) => Ok(None),
            },
        };
        forwarded.map_err(|e| format!("{e:#}"))
    }
}

/// Resolves when the kernel has no live process (died or shut down).
async fn wait_dead(kernel: &LocalKernel) {
    let mut every = tokio::time::interval(Duration::from_millis(500));
    loop {
        every.tick().await;
        if kernel.hub.activity().execution_state == "dead" {
            return;
        }
    }
}

/// Microseconds since the Unix epoch (0 for a clock before it).
fn unix_us(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}
