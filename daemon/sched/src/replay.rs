//! Drives a [`HostScheduler`] through a [`Template`] in virtual time and checks
//! what the scheduler promises while measuring what it binds.
//!
//! Each session is a kernel asking for its largest training's GPUs per cell; each
//! training is a cell submitted at its tick that runs for its duration once it
//! starts. The replay keeps its own ledger of who holds each GPU and fails on any
//! double commitment, so the scheduler is checked by an independent account.

use std::collections::{BTreeMap, BTreeSet};

use super::host::{Action, HostScheduler};
use super::template::{Template, TICK_MS};
use super::Millis;

/// What a replay measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    /// Training events in the template.
    pub trainings: usize,
    /// Training events that ran to completion.
    pub completed: usize,
    /// Cells rejected (needing more GPUs than the host has).
    pub rejected: usize,
    /// GPU-ticks bound (committed or idle-held), the quantity NotebookOS saves.
    pub gpu_ticks_bound: u64,
    /// GPU-ticks committed to running cells.
    pub gpu_ticks_committed: u64,
    /// The floor (sum of GPUs x duration of the trainings).
    pub gpu_ticks_floor: u64,
    /// Whole-session reservation's GPU-ticks.
    pub gpu_ticks_reservation: u64,
    /// Per-cell wait from submission to start, ms.
    pub waits_ms: Vec<Millis>,
    /// Revocations because another kernel needed the GPU.
    pub preemptions: usize,
    /// Revocations after `idle_release`.
    pub idle_releases: usize,
    /// Every action, for determinism checks.
    pub log: Vec<(Millis, Action)>,
    /// The scheduler's own integral of bound GPU time, GPU-ms (checked against the ledger).
    pub scheduler_bound_gpu_ms: u128,
}

/// Why a replay failed: the scheduler broke a promise.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// A GPU was committed to a kernel while another held it.
    #[error("at {at} ms GPU {gpu} was committed to {to} while held by {by}")]
    DoubleCommit {
        /// When.
        at: Millis,
        /// Which GPU.
        gpu: u32,
        /// The new holder.
        to: String,
        /// The holder it was not revoked from.
        by: String,
    },
    /// The scheduler refused something it must accept.
    #[error("scheduler refused: {0}")]
    Refused(String),
    /// The replay did not finish in the allotted virtual time.
    #[error("cells still pending at the end: {0}")]
    Stuck(usize),
}

/// Replays `template` on a host with `gpus` GPUs.
pub fn replay(template: &Template, gpus: u32, idle_release_ms: Millis, ratio: f64) -> Result<Report, Violation> {
    let mut sched = HostScheduler::new(gpus, idle_release_ms, ratio);
    let mut report = Report {
        trainings: template.sessions.iter().map(|s| s.trainings.len()).sum(),
        gpu_ticks_floor: template.gpu_ticks_floor(),
        gpu_ticks_reservation: template.gpu_ticks_reservation(),
        ..Report::default()
    };
    // Ledger: GPU -> (kernel, committed?) as the replay understands it.
    let mut ledger: BTreeMap<u32, (String, bool)> = BTreeMap::new();
    // Cells: kernel -> queue of (submit tick, duration); running: kernel -> (cell, end ms).
    let mut pending: BTreeMap<String, Vec<(u64, u64, u32)>> = BTreeMap::new();
    let mut running: BTreeMap<String, (String, Millis)> = BTreeMap::new();
    let mut waiting: BTreeSet<String> = BTreeSet::new();
    let mut live: BTreeSet<String> = BTreeSet::new();
    let mut cell_seq = 0u64;
    let mut durations: BTreeMap<String, u64> = BTreeMap::new();
    let last_tick = template
        .sessions
        .iter()
        .flat_map(|s| s.trainings.iter().map(|t| t.start_tick + t.duration_in_ticks).chain([s.stop_tick]))
        .max()
        .unwrap_or(0);
    // Enough virtual time for every cell to run one after another, plus idle release.
    let horizon = last_tick
        + template.sessions.iter().flat_map(|s| &s.trainings).map(|t| t.duration_in_ticks).sum::<u64>()
        + idle_release_ms / TICK_MS
        + 2;

    let apply = |actions: Vec<Action>,
                 now: Millis,
                 report: &mut Report,
                 ledger: &mut BTreeMap<u32, (String, bool)>,
                 running: &mut BTreeMap<String, (String, Millis)>,
                 waiting: &mut BTreeSet<String>,
                 durations: &BTreeMap<String, u64>|
     -> Result<(), Violation> {
        for a in actions {
            match &a {
                Action::Revoke { kernel, gpus, preempted } => {
                    for g in gpus {
                        match ledger.get(g) {
                            Some((holder, false)) if holder == kernel => {
                                ledger.remove(g);
                            }
                            other => {
                                return Err(Violation::DoubleCommit {
                                    at: now,
                                    gpu: *g,
                                    to: format!("(revoke from {kernel})"),
                                    by: format!("{other:?}"),
                                })
                            }
                        }
                    }
                    if *preempted {
                        report.preemptions += 1;
                    } else {
                        report.idle_releases += 1;
                    }
                }
                Action::Start { cell, kernel, gpus, waited } => {
                    for g in gpus {
                        match ledger.get(g) {
                            None => {}
                            Some((holder, false)) if holder == kernel => {}
                            Some((holder, _)) => {
                                return Err(Violation::DoubleCommit {
                                    at: now,
                                    gpu: *g,
                                    to: kernel.clone(),
                                    by: holder.clone(),
                                })
                            }
                        }
                        ledger.insert(*g, (kernel.clone(), true));
                    }
                    // The kernel's other idle-held GPUs (not chosen) went back to free.
                    ledger.retain(|g, (holder, committed)| *committed || holder != kernel || gpus.contains(g));
                    let ticks = durations.get(cell).copied().unwrap_or(0);
                    running.insert(kernel.clone(), (cell.clone(), now + ticks * TICK_MS));
                    waiting.remove(kernel);
                    report.waits_ms.push(*waited);
                }
                Action::Queued { .. } => {}
                Action::Reject { .. } => report.rejected += 1,
            }
            report.log.push((now, a));
        }
        Ok(())
    };

    for session in &template.sessions {
        pending.insert(
            session.id.clone(),
            session.trainings.iter().map(|t| (t.start_tick, t.duration_in_ticks, t.gpus)).collect(),
        );
    }

    for tick in 0..=horizon {
        let now = tick * TICK_MS;
        // 1. Cells that end now.
        let ending: Vec<(String, String)> =
            running.iter().filter(|(_, (_, end))| *end <= now).map(|(k, (c, _))| (k.clone(), c.clone())).collect();
        for (kernel, cell) in ending {
            running.remove(&kernel);
            for (_, (holder, committed)) in ledger.iter_mut() {
                if *holder == kernel {
                    *committed = false;
                }
            }
            report.completed += 1;
            let acts = sched.finish(&kernel, &cell, now).map_err(|e| Violation::Refused(e.to_string()))?;
            apply(acts, now, &mut report, &mut ledger, &mut running, &mut waiting, &durations)?;
        }
        // 2. Sessions that start now.
        for s in template.sessions.iter().filter(|s| s.start_tick == tick) {
            let g = s.trainings.iter().map(|t| t.gpus).max().unwrap_or(0);
            sched.add_kernel(&s.id, g, now).map_err(|e| Violation::Refused(e.to_string()))?;
            live.insert(s.id.clone());
        }
        // 3. Cells submitted now (a cell whose tick has come waits for the kernel's
        //    previous cell, as a notebook runs one cell at a time).
        for (kernel, cells) in &mut pending {
            if !live.contains(kernel) || running.contains_key(kernel) || waiting.contains(kernel) {
                continue;
            }
            let Some(&(at, dur, gpus)) = cells.first() else { continue };
            if at > tick {
                continue;
            }
            cells.remove(0);
            cell_seq += 1;
            let cell = format!("{kernel}#{cell_seq}");
            durations.insert(cell.clone(), dur);
            waiting.insert(kernel.clone());
            let acts = sched.submit(kernel, &cell, gpus, now).map_err(|e| Violation::Refused(e.to_string()))?;
            if acts.iter().any(|a| matches!(a, Action::Reject { .. })) {
                waiting.remove(kernel);
            }
            apply(acts, now, &mut report, &mut ledger, &mut running, &mut waiting, &durations)?;
        }
        // 4. Sessions that end now (once their cells are done: the trace's user
        //    would not close a notebook with a training still queued).
        for s in &template.sessions {
            let done = pending.get(&s.id).is_none_or(Vec::is_empty)
                && !running.contains_key(&s.id)
                && !waiting.contains(&s.id);
            if tick >= s.stop_tick && done && live.remove(&s.id) {
                let acts = sched.remove_kernel(&s.id, now);
                ledger.retain(|_, (holder, _)| *holder != s.id);
                apply(acts, now, &mut report, &mut ledger, &mut running, &mut waiting, &durations)?;
            }
        }
        // 5. Idle release.
        let acts = sched.tick(now);
        apply(acts, now, &mut report, &mut ledger, &mut running, &mut waiting, &durations)?;
        // 6. Account this tick's binding.
        report.gpu_ticks_bound += ledger.len() as u64;
        report.gpu_ticks_committed += ledger.values().filter(|(_, c)| *c).count() as u64;
    }
    // Account the last tick: the ledger counted each tick's binding for a whole tick.
    sched.advance((horizon + 1) * TICK_MS);
    report.scheduler_bound_gpu_ms = sched.bound_gpu_ms();
    let left = pending.values().map(Vec::len).sum::<usize>() + running.len() + waiting.len();
    if left > 0 {
        return Err(Violation::Stuck(left));
    }
    Ok(report)
}
