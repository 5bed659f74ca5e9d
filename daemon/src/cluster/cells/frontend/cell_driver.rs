//! A front-end kernel's cell worker: the kernel's cells one at a time, each through its
//! election rounds (pre-selection, `execute_request` to every live replica, then the
//! designee's outcome) until a replica executes it or the cell fails. Every decision is
//! pure and elsewhere: what to do before a round (wait for GPUs, ask for a move, wait for a
//! replica, fail, whom to send the round to) is [`super::cell_loop`]'s, what a round makes
//! of an outcome, a lost link or silence is [`super::election_round`]'s; this file looks up
//! the facts they need, feeds them, and does the I/O they ask for.
use std::sync::{Arc, Weak};
use std::time::{Instant, SystemTime};

use tokio::sync::mpsc;

use super::cell_loop::{CellLoop, Round, Snapshot, Step};
use super::election_message::with_election;
use super::election_round::{Failure, Heard, Next, Why};
use super::events::{Cell, Event};
use super::kernel::{FrontendKernel, NO_REPLICA_TIMEOUT};
use super::replica_link::keep_links;
use super::state::Current;
use crate::cluster::control::meta::{MoveAnswer, MoveRequest};
use crate::cluster::control::records::{MoveReason, MoveRecord};
use crate::jupyter::Channel;

/// Asks the meta leader, in the background, to move one of the kernel's replicas to a host
/// that can commit its GPUs now ([`nbos_sched::migrate::choose`]); the cell loop sees the
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
async fn tell_moving_to(k: &Arc<FrontendKernel>, cell: &Cell, m: &MoveRecord) {
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

async fn run_cell(k: &Arc<FrontendKernel>, cell: &Cell, events: &mut mpsc::UnboundedReceiver<Event>) {
    k.state().current =
        Some(Current { msg_id: cell.msg_id.clone(), round: 0, executor: None, submitted: cell.submitted });
    let mut changes = k.shared.changes.clone();
    // The rounds so far and what they decided (pure: [`CellLoop`]); another cell of the
    // kernel may hold its lock (sent through another gateway): this one waits its turn, and
    // takes the lock over once the holder's host is gone.
    let mut cl = CellLoop::new();
    let failure = 'cell: loop {
        // Who is live now; links follow the record (a new or incoming replica gets one, a
        // host that no longer holds one loses its link).
        let (cands, record) = k.candidates().await;
        let snapshot = match &record {
            Some(record) => {
                keep_links(k, &record.hosts());
                // The kernel's last executor whichever front-end sent its cell (the group's
                // record), else the last one this front-end saw.
                let last = k.shared.group_last_executor(record.group).await;
                let last = last.or(k.state().last_executor);
                Some(Snapshot {
                    cands: cands.clone(),
                    gpus: record.gpus,
                    moving: record.moving.as_ref().map(|m| m.new_replica),
                    last,
                })
            }
            None => None,
        };
        let plan = match cl.on_snapshot(snapshot, Instant::now()) {
            Step::Fail(failure) => break 'cell failure,
            Step::WaitForGpus { tell_waiting, tell_moving, ask_move, until } => {
                if let Some(text) = tell_waiting {
                    k.publish(&cell.request, "stream", &serde_json::json!({ "name": "stderr", "text": text }));
                }
                if let Some(m) = record.as_ref().and_then(|r| r.moving.as_ref()).filter(|_| tell_moving) {
                    tell_moving_to(k, cell, m).await;
                }
                if ask_move {
                    ask_to_move(k);
                }
                let _ = tokio::time::timeout_at(until.into(), changes.changed()).await;
                continue;
            }
            Step::WaitForReplica { until } => {
                // Wait for a link or host to come back.
                tokio::select! {
                    _ = changes.changed() => {}
                    ev = events.recv() => if ev.is_none() { return },
                    () = tokio::time::sleep_until(until.into()) => {}
                }
                continue;
            }
            Step::Round(plan) => plan,
        };
        // A round comes only with a record ([`CellLoop::on_snapshot`]).
        let Some(record) = record else { break 'cell Failure::Deleted };
        let Round { round, lead, lead_node, sends, failed_over, deadline } = plan;
        if let Some((from, to)) = failed_over {
            tracing::info!(kernel = %k.id, cell = %cell.msg_id, from, to, "failing over to another replica");
            k.shared.metrics.cells_failed_over_total.inc();
        }
        k.shared.metrics.election_rounds_total.inc();
        if let Some(c) = k.state().current.as_mut() {
            c.round = round;
        }
        tracing::debug!(
            kernel = %k.id, cell = %cell.msg_id, round, lead,
            since_submit_us = u64::try_from(cell.submitted.elapsed().as_micros()).unwrap_or(u64::MAX),
            "election round"
        );
        for (node, designee) in sends {
            let msg = with_election(
                &cell.request,
                &cell.msg_id,
                round,
                designee,
                cl.election.expected.as_ref(),
                cl.election.steal.as_ref(),
            );
            k.send_to(node, Channel::Shell, msg);
        }
        // Wait for this round's outcome (or the execution it starts).
        let deadline = tokio::time::Instant::from_std(deadline);
        loop {
            let executor = k.state().current.as_ref().and_then(|c| c.executor);
            let ev = if executor.is_some() {
                // Executing: no timeout, cells run as long as they run.
                events.recv().await
            } else {
                match tokio::time::timeout_at(deadline, events.recv()).await {
                    Ok(ev) => ev,
                    Err(_) => {
                        tracing::warn!(kernel = %k.id, cell = %cell.msg_id, round, lead, "no election outcome in time; next round");
                        cl.on(Heard::TimedOut);
                        continue 'cell;
                    }
                }
            };
            let Some(ev) = ev else { return };
            let heard = match ev {
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
                Event::Outcome { cell: c, node, outcome, record: rec, running } if c == cell.msg_id => {
                    // The facts the outcome's decision needs, looked up only when it does.
                    let holder_there = match (&running, outcome.as_str()) {
                        (Some(held), "busy") if node == lead_node => {
                            let hosts = k.shared.hosts().await;
                            hosts.contains_key(&held.node_id)
                                && record
                                    .replicas
                                    .iter()
                                    .any(|r| r.node_id == held.node_id && r.replica == held.replica)
                        }
                        _ => false,
                    };
                    let winner_live = match (&rec, outcome.as_str()) {
                        (Some(rec), "taken") => {
                            k.is_connected(rec.node_id) && cands.iter().any(|c| c.node_id == rec.node_id && c.live)
                        }
                        _ => false,
                    };
                    Heard::Outcome { node, outcome, record: rec, running, holder_there, winner_live }
                }
                Event::Link { node, up: false } => {
                    Heard::LinkDown { node, executor: k.state().current.as_ref().and_then(|c| c.executor) }
                }
                Event::Started { cell: c } if c == cell.msg_id => continue,
                _ => continue, // late events of earlier cells or rounds, links coming up
            };
            let node = match &heard {
                Heard::Outcome { node, .. } | Heard::LinkDown { node, .. } => *node,
                Heard::TimedOut => 0,
            };
            match cl.on(heard) {
                Next::KeepWaiting => {}
                Next::Executing(winner) => {
                    let mut s = k.state();
                    if let Some(c) = s.current.as_mut() {
                        c.executor.get_or_insert(winner);
                    }
                    s.route(&cell.msg_id, winner);
                }
                Next::NewRound { why, tell_busy, wait_for_change } => {
                    match (why, cl.election.steal.as_ref()) {
                        (Why::DesigneeError, _) => {
                            tracing::warn!(kernel = %k.id, cell = %cell.msg_id, node, "designee answered an election error; next round");
                        }
                        (Why::TakeOverLock, Some(held)) => {
                            tracing::info!(kernel = %k.id, cell = %cell.msg_id, holder = held.node_id, held = %held.cell, "the kernel's lock is held by a host that is gone; taking it over");
                        }
                        _ => {}
                    }
                    if tell_busy {
                        let text = "[NotebookOS] waiting: another cell of this kernel (sent by another client or gateway) is running; this one runs next\n";
                        k.publish(&cell.request, "stream", &serde_json::json!({ "name": "stderr", "text": text }));
                    }
                    if wait_for_change {
                        let until = CellLoop::change_wait_until(Instant::now());
                        let _ = tokio::time::timeout_at(until.into(), changes.changed()).await;
                    }
                    continue 'cell;
                }
                Next::Fail(failure) => break 'cell failure,
                Next::Unknown(other) => {
                    tracing::warn!(kernel = %k.id, cell = %cell.msg_id, node, outcome = other, "unknown election outcome");
                }
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
