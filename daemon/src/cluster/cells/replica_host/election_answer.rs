//! How a replica host answers a front-end's election request: a `yield` note, or a LEAD
//! or YIELD proposal whose outcome goes back to the front-end (a won cell is then run by
//! [`super::won_cell_driver`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use serde::{Deserialize, Serialize};

use super::outcome_reply::{not_run_content, outcome_reply};
use super::replica::Busy;
use super::won_cell_driver::Won;
use super::ReplicaHost;
use crate::cluster::cells::election::{self, Decision, Outcome, Proposer};
use crate::cluster::control::records::{ElectionRecord, RunningRecord};
use crate::jupyter::{Channel, Message};
use crate::kernel::hub::ClientId;
use crate::kernel::LocalKernel;

/// What [`ReplicaHost::handle_execute`] did with a message.
#[derive(Debug)]
pub enum Handled {
    /// It was an election request; the replica host answers it (or runs the cell).
    Handled,
    /// Not an election request: send it down the single-host path as usual.
    PassThrough(Message),
}

/// `metadata.nbos_election` of a front-end's `execute_request`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ElectionRequest {
    /// The cell (the client's msg_id).
    pub cell: String,
    /// Round, from 0.
    pub round: u32,
    /// `lead` or `yield`.
    pub role: Role,
    /// The last record the front-end knows (`null` in round 0).
    #[serde(default)]
    pub expected: Option<ElectionRecord>,
    /// The kernel's lock as the front-end last saw it, held by a host that is gone: a LEAD
    /// swap may take it over.
    #[serde(default)]
    pub steal: Option<RunningRecord>,
}

/// The front-end's designation for this host in a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Propose LEAD or YIELD.
    Lead,
    /// Do not propose.
    Yield,
}

/// Reads `metadata.nbos_election` of an `execute_request`: `None` without it.
pub fn election_request(msg: &Message) -> Option<Result<ElectionRequest, String>> {
    let meta: serde_json::Value = serde_json::from_slice(&msg.metadata).ok()?;
    let e = meta.get("nbos_election")?;
    Some(serde_json::from_value(e.clone()).map_err(|err| format!("bad metadata.nbos_election: {err}")))
}

impl ReplicaHost {
    /// Handles a client message for a local kernel: election requests are answered
    /// here (and won cells run from here); anything else passes through unchanged.
    pub async fn handle_execute(
        self: &Arc<Self>,
        kernel: &Arc<LocalKernel>,
        client: ClientId,
        msg: Message,
    ) -> Handled {
        let Ok(header) = msg.header() else { return Handled::PassThrough(msg) };
        if header.msg_type != "execute_request" {
            return Handled::PassThrough(msg);
        }
        let req = match election_request(&msg) {
            None => return Handled::PassThrough(msg),
            Some(Ok(r)) => r,
            Some(Err(reason)) => {
                self.answer_error(kernel, client, &msg, &reason);
                return Handled::Handled;
            }
        };
        let Some(local) = self.replica(&kernel.id) else {
            let reason = format!("host {} has no replica of kernel {}", self.node_id, kernel.id);
            self.answer_error(kernel, client, &msg, &reason);
            return Handled::Handled;
        };
        let kv = self.store.kv(local.group);
        // The kernel's lock names this replica but nothing runs here (a lock left by this
        // host's previous daemon, or an unreleased one): free it, or the kernel stays busy.
        if local.busy.load(Ordering::SeqCst) == 0 {
            if let Some(held) = election::running_stale(&kv).await {
                if held.node_id == self.node_id && held.replica == local.replica {
                    tracing::info!(kernel = %kernel.id, cell = %held.cell, "releasing the kernel's lock of a cell this replica no longer runs");
                    election::release_running(&kv, &held).await;
                }
            }
        }
        if req.role == Role::Yield {
            let (cell, round, replica) = (req.cell.clone(), req.round, local.replica);
            tokio::spawn(async move { election::note_yield(&kv, &cell, round, replica).await });
            return Handled::Handled;
        }
        let busy = Busy::enter(&local);
        let decision = if local.moving_out.load(Ordering::SeqCst) {
            Decision::Yield {
                reason: format!("replica {} on host {} is moving to another host", local.replica, self.node_id),
            }
        } else if kernel.hub.activity().execution_state == "dead" {
            Decision::Yield { reason: format!("replica {} on host {} is dead", local.replica, self.node_id) }
        } else if let Some(why) = local.applier.broken() {
            Decision::Yield { reason: format!("replica {} cannot follow the namespace: {why}", local.replica) }
        } else if self.kernels.binder().can_commit_now(&kernel.id, kernel.gpus) {
            Decision::Lead
        } else {
            Decision::Yield { reason: format!("host {} cannot commit {} GPU(s) now", self.node_id, kernel.gpus) }
        };
        if let Decision::Yield { reason } = &decision {
            tracing::debug!(kernel = %kernel.id, cell = %req.cell, round = req.round, reason, "replica yields");
        }
        let me = Proposer { replica: local.replica, node_id: self.node_id };
        let started = Instant::now();
        let proposed =
            election::propose(&kv, &req.cell, req.round, req.expected.as_ref(), me, decision, req.steal.as_ref());
        let outcome = match proposed.await {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(kernel = %kernel.id, cell = %req.cell, round = req.round, error = %e, "election failed");
                self.answer_error(kernel, client, &msg, &e.to_string());
                return Handled::Handled;
            }
        };
        tracing::debug!(
            kernel = %kernel.id, cell = %req.cell, round = req.round, outcome = outcome.name(),
            took_us = started.elapsed().as_micros() as u64, "election proposal decided"
        );
        match outcome {
            Outcome::Won(record) => {
                if local.first_win(&req.cell) {
                    let (host, kernel) = (self.clone(), kernel.clone());
                    let won = Won { cell: req.cell, record, started };
                    tokio::spawn(async move {
                        host.run_won(kernel, local, client, msg, header.msg_id, won).await;
                        drop(busy);
                    });
                }
            }
            Outcome::Busy(held) => {
                let election = serde_json::json!({ "outcome": "busy", "record": req.expected, "running": held });
                kernel.hub.release(
                    client,
                    Channel::Shell,
                    outcome_reply(&msg, election, not_run_content()),
                    SystemTime::now(),
                );
            }
            other => {
                let election = serde_json::json!({ "outcome": other.name(), "record": other.record() });
                kernel.hub.release(
                    client,
                    Channel::Shell,
                    outcome_reply(&msg, election, not_run_content()),
                    SystemTime::now(),
                );
            }
        }
        Handled::Handled
    }

    fn answer_error(&self, kernel: &LocalKernel, client: ClientId, msg: &Message, reason: &str) {
        let election = serde_json::json!({ "outcome": "error", "reason": reason, "node_id": self.node_id });
        kernel.hub.release(client, Channel::Shell, outcome_reply(msg, election, not_run_content()), SystemTime::now());
    }
}
