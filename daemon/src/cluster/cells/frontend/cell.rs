//! A front-end kernel's cell worker: the kernel's cells one at a time, each through its
//! election rounds (pre-selection, `execute_request` to every live replica, then the
//! designee's outcome) until a replica executes it or the cell fails.

use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::mpsc;

use super::election_message::with_election;
use super::events::{Cell, Event};
use super::kernel::{FrontendKernel, NO_REPLICA_TIMEOUT};
use super::replica_link::keep_links;
use super::state::Current;
use crate::cluster::control::meta::{MoveAnswer, MoveRequest};
use crate::cluster::control::records::{ElectionRecord, MoveReason, MoveRecord, RunningRecord};
use crate::jupyter::Channel;
use crate::sched::preselect::{preselect, Candidate};

/// How long a round waits for its designee's outcome before asking again.
const OUTCOME_TIMEOUT: Duration = Duration::from_secs(15);
/// Pause between retry rounds when every live replica yielded and no `load/` changed.
const YIELD_RETRY: Duration = Duration::from_millis(500);

/// How often a waiting cell asks again for a replica to move (no host could take one; the
/// hosts' `load/` records it was decided on are up to 100 ms old).
const MOVE_ASK_EVERY: Duration = Duration::from_secs(1);

/// Asks the meta leader, in the background, to move one of the kernel's replicas to a host
/// that can commit its GPUs now ([`crate::sched::migrate::choose`]); the cell loop sees the
/// move in the kernel's record.
fn ask_to_move(k: &Arc<FrontendKernel>) {
    let Some(cluster) = k.shared.cluster.get().cloned() else { return };
    let id = k.id.clone();
    tokio::spawn(async move {
        let request = MoveRequest { reason: MoveReason::AllYield, from: None };
        match cluster.move_replica(&id, request).await {
            Ok(MoveAnswer::Moving { record }) => {
                tracing::info!(kernel = %id, moving = ?record.moving, "every replica yielded: a replica moves");
            }
            Ok(MoveAnswer::NoHost) => {
                tracing::debug!(kernel = %id, "every replica yielded and no host can take a replica now");
            }
            Ok(MoveAnswer::NotThere { .. }) => {}
            Err(e) => tracing::warn!(kernel = %id, error = %e, "could not ask for a replica to move"),
        }
    });
}

/// Tells the clients of a waiting cell that a replica moves (a `stream` message, like the
/// one that says the cell waits).
async fn tell_moving(k: &Arc<FrontendKernel>, cell: &Cell, m: &MoveRecord) {
    let hosts = k.shared.hosts().await;
    let name = |n: u64| hosts.get(&n).map_or_else(|| format!("node {n}"), |h| h.name.clone());
    let text = format!(
        "[NotebookOS] moving replica {} of this kernel from host {} to host {} ({}); the cell runs there once its state has caught up\n",
        m.replica,
        name(m.from),
        name(m.to),
        match m.reason {
            MoveReason::AllYield => "it can commit the GPUs now",
            MoveReason::Drain => "its host is being drained",
        },
    );
    k.publish(&cell.request, "stream", &serde_json::json!({ "name": "stderr", "text": text }));
}

/// Runs the kernel's cells one at a time.
pub(super) async fn cell_worker(
    kernel: Weak<FrontendKernel>,
    mut cells: mpsc::UnboundedReceiver<Cell>,
    mut events: mpsc::UnboundedReceiver<Event>,
) {
    while let Some(cell) = cells.recv().await {
        let Some(k) = kernel.upgrade() else { return };
        run_cell(&k, &cell, &mut events).await;
        k.state().current = None;
    }
}

/// Why a cell ended without an `executed` outcome.
enum Failure {
    HostDied(u64),
    NoReplica,
    Deleted,
}

async fn run_cell(k: &Arc<FrontendKernel>, cell: &Cell, events: &mut mpsc::UnboundedReceiver<Event>) {
    k.state().current =
        Some(Current { msg_id: cell.msg_id.clone(), round: 0, executor: None, submitted: cell.submitted });
    let mut changes = k.shared.changes.clone();
    let mut round: u32 = 0;
    let mut expected: Option<ElectionRecord> = None;
    let mut yielded: Vec<u32> = Vec::new();
    let mut told_waiting = false;
    let mut told_moving: Option<u32> = None;
    let mut asked_to_move: Option<Instant> = None;
    // Another cell of the kernel holds its lock (sent through another gateway): this one
    // waits its turn; `steal` once the holder's host is gone.
    let mut steal: Option<RunningRecord> = None;
    let mut told_busy = false;
    let no_replica_since = Instant::now();
    let failure = 'cell: loop {
        // Who is live now; links follow the record (a new or incoming replica gets one, a
        // host that no longer holds one loses its link).
        let (cands, record) = k.candidates().await;
        let Some(record) = record else { break 'cell Failure::Deleted };
        keep_links(k, &record.hosts());
        // The kernel's last executor whichever front-end sent its cell (the group's record),
        // else the last one this front-end saw.
        let last = k.shared.group_last_executor(record.group).await;
        let last = last.or(k.state().last_executor);
        let previous = last.map(|(r, _)| r);
        // The kernel's own last cell is over (cells are serialised): GPUs its executor still
        // holds for it (idle-held, or not yet republished in `load/`, sampled every 100 ms) are
        // its own to take, so they do not count against the previous executor. Without this
        // a stale load moves every other cell to another replica (and its group leadership
        // with it). The replica host's binder decides for real.
        let mut cands = cands;
        if let Some(p) = previous {
            for c in cands.iter_mut().filter(|c| c.replica == p) {
                c.gpus_idle = c.gpus_idle.saturating_add(record.gpus);
            }
        }
        let live: HashSet<u32> = cands.iter().filter(|c| c.live).map(|c| c.replica).collect();
        if !yielded.is_empty() && live.iter().all(|r| yielded.contains(r)) {
            // Every live replica said it cannot: the cell waits for GPUs.
            if !told_waiting {
                told_waiting = true;
                let reason = expected.as_ref().map(|e| e.reason.clone()).filter(|r| !r.is_empty());
                let text = format!(
                    "[NotebookOS] waiting for {} GPU(s): no replica's host can commit them now{}; the cell starts when GPUs free up\n",
                    record.gpus,
                    reason.map(|r| format!(" ({r})")).unwrap_or_default()
                );
                k.publish(&cell.request, "stream", &serde_json::json!({ "name": "stderr", "text": text }));
            }
            // A replica moves to a host that can run the cell now (the meta leader decides).
            match &record.moving {
                Some(m) if told_moving != Some(m.new_replica) => {
                    told_moving = Some(m.new_replica);
                    tell_moving(k, cell, m).await;
                }
                None if asked_to_move.is_none_or(|t| t.elapsed() >= MOVE_ASK_EVERY) => {
                    asked_to_move = Some(Instant::now());
                    ask_to_move(k);
                }
                _ => {}
            }
            yielded.clear();
            let _ = tokio::time::timeout(YIELD_RETRY, changes.changed()).await;
            continue;
        }
        let Some(plan) = preselect(&cands, record.gpus, previous, &yielded) else {
            if no_replica_since.elapsed() > NO_REPLICA_TIMEOUT {
                break 'cell Failure::NoReplica;
            }
            // Wait for a link or host to come back.
            tokio::select! {
                _ = changes.changed() => {}
                ev = events.recv() => if ev.is_none() { return },
                () = tokio::time::sleep(YIELD_RETRY) => {}
            }
            continue;
        };
        let lead_node = cands.iter().find(|c| c.replica == plan.lead).map_or(0, |c| c.node_id);
        if let Some((p, prev_node)) = last {
            if round == 0 && p != plan.lead && !cands.iter().any(|c| c.replica == p && c.live) {
                tracing::info!(kernel = %k.id, cell = %cell.msg_id, from = prev_node, to = lead_node, "failing over to another replica");
                k.shared.metrics.cells_failed_over_total.inc();
            }
        }
        k.shared.metrics.election_rounds_total.inc();
        if let Some(c) = k.state().current.as_mut() {
            c.round = round;
        }
        tracing::debug!(
            kernel = %k.id, cell = %cell.msg_id, round, lead = plan.lead,
            since_submit_us = u64::try_from(cell.submitted.elapsed().as_micros()).unwrap_or(u64::MAX),
            "election round"
        );
        // The designee first: its swap is on the cell's path, the yield notes are not.
        let mut live_cands: Vec<&Candidate> = cands.iter().filter(|c| c.live).collect();
        live_cands.sort_by_key(|c| c.replica != plan.lead);
        for c in live_cands {
            let msg = with_election(
                &cell.request,
                &cell.msg_id,
                round,
                c.replica == plan.lead,
                expected.as_ref(),
                steal.as_ref(),
            );
            k.send_to(c.node_id, Channel::Shell, msg);
        }
        // Wait for this round's outcome (or the execution it starts).
        let deadline = tokio::time::Instant::now() + OUTCOME_TIMEOUT;
        loop {
            let executor = k.state().current.as_ref().and_then(|c| c.executor);
            let ev = if executor.is_some() {
                // Executing: no timeout, cells run as long as they run.
                events.recv().await
            } else {
                match tokio::time::timeout_at(deadline, events.recv()).await {
                    Ok(ev) => ev,
                    Err(_) => {
                        tracing::warn!(kernel = %k.id, cell = %cell.msg_id, round, lead = plan.lead, "no election outcome in time; next round");
                        yielded.push(plan.lead);
                        round += 1;
                        continue 'cell;
                    }
                }
            };
            let Some(ev) = ev else { return };
            match ev {
                Event::Executed { cell: c, node, reply } if c == cell.msg_id => {
                    let replica = record.replicas.iter().find(|r| r.node_id == node).map_or(0, |r| r.replica);
                    {
                        let mut s = k.state();
                        s.last_executor = Some((replica, node));
                        s.executed += 1;
                        s.route(&cell.msg_id, node);
                    }
                    k.hub.deliver(Channel::Shell, reply, SystemTime::now());
                    return;
                }
                Event::Started { cell: c, .. } if c == cell.msg_id => {}
                Event::Outcome { cell: c, node, outcome, record: rec, running } if c == cell.msg_id => {
                    match outcome.as_str() {
                        "busy" => {
                            if node != lead_node {
                                continue;
                            }
                            let Some(held) = running else { continue };
                            // The holder's host is gone from the cluster (its lease expired) or
                            // its replica from the kernel: its cell ended with it, so the next
                            // round takes the lock over. Otherwise wait: a link that is down
                            // here says nothing (and a partitioned holder cannot commit).
                            let hosts = k.shared.hosts().await;
                            let holder_there = hosts.contains_key(&held.node_id)
                                && record
                                    .replicas
                                    .iter()
                                    .any(|r| r.node_id == held.node_id && r.replica == held.replica);
                            if holder_there {
                                steal = None;
                                if !told_busy {
                                    told_busy = true;
                                    let text = "[NotebookOS] waiting: another cell of this kernel (sent by another client or gateway) is running; this one runs next\n";
                                    k.publish(
                                        &cell.request,
                                        "stream",
                                        &serde_json::json!({ "name": "stderr", "text": text }),
                                    );
                                }
                                let _ = tokio::time::timeout(YIELD_RETRY, changes.changed()).await;
                            } else {
                                tracing::info!(kernel = %k.id, cell = %cell.msg_id, holder = held.node_id, held = %held.cell, "the kernel's lock is held by a host that is gone; taking it over");
                                steal = Some(held);
                            }
                            round += 1;
                            continue 'cell;
                        }
                        "yielded" => {
                            if node != lead_node {
                                continue; // an outcome from an earlier round's designee
                            }
                            yielded.push(plan.lead);
                            expected = rec;
                            round = expected.as_ref().map_or(round, |e| e.round.max(round)) + 1;
                            continue 'cell;
                        }
                        "stale" => {
                            if node != lead_node {
                                continue;
                            }
                            round = rec.as_ref().map_or(round, |e| e.round.max(round)) + 1;
                            expected = rec;
                            continue 'cell;
                        }
                        "taken" => {
                            let Some(rec) = rec else { continue };
                            let winner_live =
                                k.is_connected(rec.node_id) && cands.iter().any(|c| c.node_id == rec.node_id && c.live);
                            if !winner_live {
                                break 'cell Failure::HostDied(rec.node_id);
                            }
                            let mut s = k.state();
                            if let Some(c) = s.current.as_mut() {
                                c.executor.get_or_insert(rec.node_id);
                            }
                            s.route(&cell.msg_id, rec.node_id);
                        }
                        "error" => {
                            // The designee could not take part (no replica there yet, store
                            // failure): ask another replica.
                            if node != lead_node {
                                continue;
                            }
                            tracing::warn!(kernel = %k.id, cell = %cell.msg_id, node, "designee answered an election error; next round");
                            yielded.push(plan.lead);
                            round += 1;
                            continue 'cell;
                        }
                        other => {
                            tracing::warn!(kernel = %k.id, cell = %cell.msg_id, node, outcome = other, "unknown election outcome");
                        }
                    }
                }
                Event::Link { node, up: false } => {
                    let executor = k.state().current.as_ref().and_then(|c| c.executor);
                    if executor == Some(node) {
                        break 'cell Failure::HostDied(node);
                    }
                    if executor.is_none() && node == lead_node {
                        // The designee went away before saying anything: ask again; the
                        // record (if it won before dying) answers `taken`.
                        yielded.push(plan.lead);
                        round += 1;
                        continue 'cell;
                    }
                }
                _ => {} // late events of earlier cells or rounds, links coming up
            }
        }
    };
    let (ename, evalue) = match failure {
        Failure::HostDied(node) => {
            k.shared.metrics.cells_executor_died_total.inc();
            let name = k.shared.hosts().await.get(&node).map_or_else(|| format!("node {node}"), |h| h.name.clone());
            ("ExecutorHostDied", format!("the host executing this cell ({name}, node {node}) died or became unreachable; the kernel's next cell runs on a surviving replica with the state of the last completed cell"))
        }
        Failure::NoReplica => (
            "NoReplicaReachable",
            format!("no replica host of this kernel was reachable from this gateway within {NO_REPLICA_TIMEOUT:?}"),
        ),
        Failure::Deleted => ("KernelDeleted", "the kernel was deleted".to_owned()),
    };
    tracing::warn!(kernel = %k.id, cell = %cell.msg_id, ename, evalue = %evalue, "cell failed");
    // The client may have seen `busy` from the dead executor: error, idle, reply.
    k.answer_error(&cell.request, ename, &evalue);
}
