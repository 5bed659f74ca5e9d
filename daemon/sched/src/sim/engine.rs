//! The discrete-event loop. Sessions start, submit their trainings one at a time (a
//! notebook runs one cell at a time: a training whose submission time has come waits
//! for the previous one), and stop; the policy decides where each runs. The engine
//! measures what every policy is judged on, the same way for all.

use super::cluster::SimCluster;
use super::ctx::Ctx;
use super::events::{Ev, Queue};
use super::metrics::{Point, PolicyResult};
use super::policy::api::Policy;
use super::policy::{batch, replicated, reservation};
use super::rng::Rng;
use super::workload::Workload;
use super::{Model, PolicyKind};
use crate::Millis;

/// Why a simulation could not run or finish.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// A training needs more GPUs than a host has.
    #[error("session {session} has a training needing {gpus} GPUs, but hosts have {per_host} (raise --gpus-per-host)")]
    TooLarge {
        /// Session index.
        session: usize,
        /// GPUs asked.
        gpus: u32,
        /// GPUs per host.
        per_host: u32,
    },
    /// The model is unusable.
    #[error("invalid model: {0}")]
    Model(String),
    /// Events ran out with trainings not done (a policy bug).
    #[error("{policy}: {left} trainings never completed")]
    Stuck {
        /// The policy.
        policy: &'static str,
        /// How many.
        left: usize,
    },
}

/// Replays `w` under `policy` on the cluster `m`.
pub fn run(w: &Workload, policy: PolicyKind, m: &Model) -> Result<PolicyResult, SimError> {
    validate(w, m)?;
    let ours = policy == PolicyKind::Notebookos;
    let host_ratio = if ours { m.notebookos.subscription_ratio } else { 1e9 };
    let idle_release = if ours { m.notebookos.idle_release_ms } else { 0 };
    let scaling_interval_ms = if ours { m.notebookos.autoscale.interval_ms } else { m.scaling_interval_ms };
    let n = w.sessions.len();
    let mut cx = Ctx {
        w,
        m,
        q: Queue::default(),
        c: SimCluster::new(m.gpus_per_host, idle_release, host_ratio),
        rng: Rng::new(m.seed, policy as u64 + 1),
        now: 0,
        next: vec![0; n],
        submitted_at: vec![0; n],
        waiting: vec![false; n],
        delays_ms: Vec::with_capacity(w.sessions.iter().map(|s| s.trainings.len()).sum()),
        delay_sessions: Vec::new(),
        served_gpu_ms: vec![0; n],
        migrations: 0,
        background_moves: 0,
        memory_refusals: 0,
        decisions: std::collections::BTreeSet::new(),
        migration_ms: 0,
        completed: 0,
    };
    let mut p = new_policy(policy, n);
    let t0 = w.sessions.iter().map(|s| s.start).min().unwrap_or(0);
    // The window's end, if any: nothing happens after it (see `stop_at_end`).
    let horizon = w.end.map(|e| e.max(t0));
    let t_end = w.sessions.iter().map(|s| s.stop).max().unwrap_or(0).min(horizon.unwrap_or(Millis::MAX));
    // About 2,000 points whatever the span, on whole minutes.
    let sample_ms = (t_end.saturating_sub(t0) / 2_000).max(60_000) / 60_000 * 60_000;
    for (i, s) in w.sessions.iter().enumerate() {
        cx.q.push(s.start, Ev::SessionStart(index(i)));
    }
    cx.now = t0;
    p.init(&mut cx);
    // A fixed cluster, or the minimum every policy keeps: up from the start.
    let initial = if m.fixed_hosts > 0 { m.fixed_hosts } else { m.min_hosts() };
    for _ in 0..initial {
        let h = cx.c.request(t0);
        cx.c.up(h);
        p.host_up(&mut cx, h);
    }
    cx.c.seeds = initial;
    if m.fixed_hosts == 0 {
        cx.q.push(t0, Ev::ScaleTick);
    }
    cx.q.push(t0, Ev::Sample);
    let mut sessions_left = n;
    let mut series = Vec::new();
    let mut last = t0;
    let mut clipped = false;
    while let Some((t, ev)) = cx.q.pop() {
        if let Some(end) = horizon.filter(|&e| t > e) {
            stop_at_end(&mut cx, end);
            (last, clipped) = (end, true);
            break;
        }
        cx.now = t;
        cx.c.advance(t);
        last = t;
        match ev {
            Ev::SessionStart(s) => {
                p.session_start(&mut cx, s);
                match w.sessions[s as usize].trainings.first() {
                    Some(tr) => cx.q.push(tr.submit.max(t), Ev::Submit(s)),
                    None => cx.q.push(w.sessions[s as usize].stop.max(t), Ev::SessionStop(s)),
                }
            }
            Ev::Submit(s) => {
                cx.submitted_at[s as usize] = t;
                cx.waiting[s as usize] = true;
                p.submit(&mut cx, s);
            }
            Ev::TrainingEnd { session: s, host } => {
                cx.completed += 1;
                p.training_end(&mut cx, s, host);
                let sess = &w.sessions[s as usize];
                cx.next[s as usize] += 1;
                match sess.trainings.get(cx.next[s as usize] as usize) {
                    Some(tr) => cx.q.push(tr.submit.max(t), Ev::Submit(s)),
                    None => cx.q.push(sess.stop.max(t), Ev::SessionStop(s)),
                }
            }
            Ev::SessionStop(s) => {
                p.session_stop(&mut cx, s);
                sessions_left -= 1;
            }
            Ev::HostUp(h) => {
                cx.c.up(h);
                p.host_up(&mut cx, h);
            }
            Ev::Ready { session, host } => p.ready(&mut cx, session, host),
            Ev::Refill(h) => p.refill(&mut cx, h),
            Ev::IdleCheck(h) => p.idle_check(&mut cx, h),
            Ev::ScaleTick => {
                if sessions_left > 0 {
                    p.scale_tick(&mut cx);
                    cx.q.push(t + scaling_interval_ms, Ev::ScaleTick);
                }
            }
            Ev::Sample => {
                series.push(Point {
                    t_ms: t - t0,
                    hosts: cx.c.alive(),
                    gpus_bound: cx.c.bound_now(),
                    gpus_committed: cx.c.committed_now(),
                });
                if sessions_left > 0 {
                    cx.q.push(t + sample_ms, Ev::Sample);
                }
            }
        }
    }
    let trainings: usize = w.sessions.iter().map(|s| s.trainings.len()).sum();
    // Waits cut by the end are among the delays (see `stop_at_end`); started ones are not.
    let waiting = if clipped { cx.waiting.iter().filter(|&&b| b).count() } else { 0 };
    let started = cx.delays_ms.len() - waiting;
    // Only a run that ended on its own must have run everything; a window's end leaves
    // trainings running or waiting by design.
    if !clipped && cx.completed < trainings {
        return Err(SimError::Stuck { policy: policy.name(), left: trainings - cx.completed });
    }
    let floor_gpu_ms: u128 =
        w.sessions.iter().flat_map(|s| &s.trainings).map(|t| u128::from(w.clipped(t)) * u128::from(t.gpus)).sum();
    let bound = cx.c.bound_gpu_ms(last);
    let delays_by_session: Vec<(u32, Millis)> =
        cx.delay_sessions.iter().copied().zip(cx.delays_ms.iter().copied()).collect();
    let mut result = PolicyResult::new(
        Some(policy),
        super::metrics::Totals {
            provisioned_gpu_ms: cx.c.provisioned_gpu_ms(),
            bound_gpu_ms: bound,
            committed_gpu_ms: cx.c.committed_gpu_ms(),
            floor_gpu_ms,
            span_ms: last - t0,
            trainings,
            completed: cx.completed,
            cut: started.saturating_sub(cx.completed),
            not_started: trainings - started.min(trainings),
            migrations: cx.migrations,
            background_moves: cx.background_moves,
            migration_ms: cx.migration_ms,
            // A fixed cluster's or the minimum's hosts were there from the start: not scale-outs.
            scale_outs: cx.c.hosts_added.saturating_sub(u64::from(initial)),
            scale_ins: cx.c.hosts_released,
            host_memory_peak_mib: cx.c.memory_peak_mib(),
            memory_refusals: cx.memory_refusals,
            violations: cx.c.violations.clone(),
        },
        cx.delays_ms,
        series,
    );
    result.decisions = cx.decisions.into_iter().collect();
    result.users = super::fairness::figures(w, &delays_by_session, &cx.served_gpu_ms);
    Ok(result)
}

/// The window's end: GPU-hours (provisioned, committed, bound) are integrated up to it and
/// no further, so a training still running counts its GPUs until the end and is not
/// completed, and hosts stop being billed. A training still waiting counts the wait so far
/// as its delay (a lower bound; leaving it out would flatter a policy that makes people
/// wait past the end).
fn stop_at_end(cx: &mut Ctx<'_>, end: Millis) {
    cx.now = end;
    cx.c.advance(end);
    let waits: Vec<(u32, Millis)> = cx
        .waiting
        .iter()
        .zip(&cx.submitted_at)
        .enumerate()
        .filter(|(_, (w, _))| **w)
        .map(|(s, (_, &at))| (index(s), end.saturating_sub(at)))
        .collect();
    for (s, wait) in waits {
        cx.delays_ms.push(wait);
        cx.delay_sessions.push(s);
    }
}

/// The policy object for `kind` over `sessions` sessions.
fn new_policy(kind: PolicyKind, sessions: usize) -> Box<dyn Policy> {
    match kind {
        PolicyKind::Reservation => Box::new(reservation::Reservation::new(sessions)),
        PolicyKind::FcfsBatch => Box::new(batch::Batch::new(sessions, false)),
        PolicyKind::MiddleGround => Box::new(batch::Batch::new(sessions, true)),
        PolicyKind::NotebookosPaper => Box::new(replicated::Replicated::new(sessions, replicated::Variant::Paper)),
        PolicyKind::Notebookos => Box::new(replicated::Replicated::new(sessions, replicated::Variant::Ours)),
    }
}

fn validate(w: &Workload, m: &Model) -> Result<(), SimError> {
    if m.gpus_per_host == 0 {
        return Err(SimError::Model("gpus_per_host must be at least 1".into()));
    }
    let p = &m.notebookos;
    if !(p.subscription_ratio.is_finite() && p.subscription_ratio >= 1.0) {
        return Err(SimError::Model(format!("subscription ratio must be >= 1, got {}", p.subscription_ratio)));
    }
    if m.scaling_interval_ms == 0 || p.autoscale.interval_ms == 0 {
        return Err(SimError::Model("the scaling interval must be longer than 0".into()));
    }
    // The replicated policies keep three replicas per kernel (NotebookOS's and the daemon's default).
    if p.replicas != 3 {
        return Err(SimError::Model(format!("notebookos simulates 3 replicas per kernel, got {}", p.replicas)));
    }
    if !(m.paper_max_ratio.is_finite() && m.paper_max_ratio >= 1.0) {
        return Err(SimError::Model(format!("the paper's max ratio must be >= 1, got {}", m.paper_max_ratio)));
    }
    if m.provision_jitter_ms > m.provision_ms {
        return Err(SimError::Model(format!(
            "the provisioning jitter ({} ms) must not exceed the provisioning time ({} ms)",
            m.provision_jitter_ms, m.provision_ms
        )));
    }
    for (i, s) in w.sessions.iter().enumerate() {
        let mib = m.replica_base_mib.saturating_add(s.namespace_mib);
        if m.host_memory_mib > 0 && mib > m.host_memory_mib {
            return Err(SimError::Model(format!(
                "session {i}'s replicas need {mib} MiB of host memory each, but hosts have {} MiB for replicas",
                m.host_memory_mib
            )));
        }
        let gpus = s.trainings.iter().map(|t| t.gpus).max().unwrap_or(0).max(s.gpus);
        if gpus > m.gpus_per_host {
            return Err(SimError::TooLarge { session: i, gpus, per_host: m.gpus_per_host });
        }
    }
    Ok(())
}

fn index(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::workload::{Session, Training};

    #[test]
    fn a_fixed_cluster_never_scales_and_bills_its_hosts_for_the_whole_span() {
        // Two 2-GPU sessions at once on 3 hosts of 2 GPUs: both run at once (executors on
        // different hosts), and no host is requested or released.
        let session = |start| Session {
            start,
            stop: start + 600_000,
            gpus: 2,
            trainings: vec![Training { submit: start + 60_000, duration: 120_000, gpus: 2 }],
            namespace_mib: 1,
        };
        let w = Workload::new("t".into(), vec![session(0), session(0)]);
        let m = Model { gpus_per_host: 2, fixed_hosts: 3, ..Model::default() };
        let r = run(&w, PolicyKind::Notebookos, &m).expect("runs");
        assert_eq!((r.scale_outs, r.scale_ins, r.hosts_peak, r.completed), (0, 0, 3, 2));
        assert_eq!(r.violations, 0);
        // 3 hosts × 2 GPUs × 600 s.
        assert!((r.gpu_hours_provisioned - 1.0).abs() < 1e-9, "{}", r.gpu_hours_provisioned);
        assert!((r.delay_max_s - 0.002).abs() < 1e-9, "GPUs for both at once: {}", r.delay_max_s);
    }

    #[test]
    fn host_memory_not_gpus_limits_placement() {
        // Two 1-GPU sessions at once on 3 hosts of 8 GPUs: GPUs allow both at once, but
        // each replica needs 512 + 1,000 MiB and a host has 2,000 MiB for replicas, so a
        // host holds one replica and the second session waits for the first to stop.
        let session = |start, stop| Session {
            start,
            stop,
            gpus: 1,
            trainings: vec![Training { submit: start + 60_000, duration: 120_000, gpus: 1 }],
            namespace_mib: 1_000,
        };
        let w = Workload::new("t".into(), vec![session(0, 600_000), session(1_000, 601_000)]);
        let roomy = Model { fixed_hosts: 3, host_memory_mib: 0, replica_base_mib: 512, ..Model::default() };
        let free = run(&w, PolicyKind::Notebookos, &roomy).expect("runs");
        assert_eq!((free.memory_refusals, free.completed, free.violations), (0, 2, 0));
        assert!(free.delay_max_s < 1.0, "both placed at once: {}", free.delay_max_s);
        assert_eq!(free.host_memory_peak_mib, 2 * 1_512, "memory is still reported when not limited");

        let tight = Model { host_memory_mib: 2_000, ..roomy };
        for policy in [PolicyKind::Notebookos, PolicyKind::NotebookosPaper] {
            let r = run(&w, policy, &tight).expect("runs");
            assert_eq!((r.completed, r.violations), (2, 0), "{policy:?}");
            assert!(r.memory_refusals >= 1, "{policy:?}: the second session was refused for memory");
            assert_eq!(r.host_memory_peak_mib, 1_512, "{policy:?}: never two replicas on a host");
            // The second session's replicas wait for the first session to stop (600 s),
            // then start (container start) before its training runs.
            assert!(r.delay_max_s > 500.0, "{policy:?}: {}", r.delay_max_s);
        }

        // With an autoscaler, a memory refusal asks for hosts instead of waiting.
        let scaled = Model { fixed_hosts: 0, ..tight };
        let r = run(&w, PolicyKind::Notebookos, &scaled).expect("runs");
        assert_eq!((r.completed, r.violations, r.host_memory_peak_mib), (2, 0, 1_512));
        assert!(r.hosts_peak >= 6, "two sessions x three replicas, one per host: {}", r.hosts_peak);
    }

    #[test]
    fn a_replica_larger_than_a_host_is_refused_up_front() {
        let s = Session { start: 0, stop: 60_000, gpus: 1, trainings: Vec::new(), namespace_mib: 5_000 };
        let w = Workload::new("t".into(), vec![s]);
        let m = Model { host_memory_mib: 4_096, ..Model::default() };
        let e = run(&w, PolicyKind::Notebookos, &m).unwrap_err();
        assert!(e.to_string().contains("5512 MiB of host memory"), "{e}");
    }

    #[test]
    fn notebookos_keeps_its_autoscale_bounds_and_rule() {
        use crate::policy::AutoscaleRule;
        use crate::sim::synthetic::{self, SyntheticParams};
        let w = synthetic::generate(&SyntheticParams { sessions: 200, hours: 4.0, ..SyntheticParams::default() }, 3);
        let mut m = Model::default();
        m.notebookos.autoscale.max_hosts = 8;
        for rule in [AutoscaleRule::Paper, AutoscaleRule::Notebookos] {
            m.notebookos.autoscale.rule = rule;
            let r = run(&w, PolicyKind::Notebookos, &m).expect("runs");
            assert!(r.hosts_peak <= 8 && r.hosts_peak >= 3, "{rule:?}: within min..max hosts: {}", r.hosts_peak);
            assert_eq!((r.completed, r.violations), (r.trainings, 0), "{rule:?}");
        }
        // The cap is what held the cluster back: without it, it grows past 8 hosts.
        m.notebookos.autoscale.max_hosts = 1_000;
        assert!(run(&w, PolicyKind::Notebookos, &m).expect("runs").hosts_peak > 8);
    }

    #[test]
    fn no_policy_goes_below_the_minimum_hosts() {
        // Two short sessions an hour apart: between them every policy scales in.
        let session = |start| Session {
            start,
            stop: start + 1_200_000,
            gpus: 1,
            trainings: vec![Training { submit: start + 60_000, duration: 300_000, gpus: 1 }],
            namespace_mib: 1,
        };
        let w = Workload::new("t".into(), vec![session(0), session(3_600_000)]);
        let least = |m: &Model, p| {
            let r = run(&w, p, m).expect("runs");
            assert_eq!((r.completed, r.violations), (2, 0));
            r.series.iter().map(|x| x.hosts).min().unwrap_or(0)
        };
        let mut free = Model::default();
        free.notebookos.autoscale.min_hosts = 0;
        let mut kept = Model::default();
        kept.notebookos.autoscale.min_hosts = 10;
        for p in PolicyKind::ALL {
            assert!(least(&free, p) < 10, "{}: without a minimum it scales in", p.name());
            assert!(least(&kept, p) >= 10, "{}: below min_hosts", p.name());
        }
    }

    const H: f64 = 3_600_000.0;

    #[test]
    fn a_window_ends_every_policy_at_its_end() {
        let tr = |submit, duration| Training { submit, duration, gpus: 1 };
        // One training done by the end, one cut at it (600 s of its hour run), and one
        // submitted after it.
        let long = Session {
            start: 0,
            stop: 20_000_000,
            gpus: 1,
            trainings: vec![tr(60_000, 120_000), tr(600_000, 3_600_000)],
            namespace_mib: 1,
        };
        let late = Session {
            start: 1_100_000,
            stop: 2_000_000,
            gpus: 1,
            trainings: vec![tr(1_300_000, 60_000)],
            namespace_mib: 1,
        };
        let w = Workload::new("w".into(), vec![long, late]).ending_at(1_200_000);
        for k in PolicyKind::ALL {
            let r = run(&w, k, &Model::default()).unwrap_or_else(|e| panic!("{k:?}: a cut run is not stuck: {e}"));
            assert!(r.sim_hours <= 1_200_000.0 / H, "{k:?}: {} h simulated", r.sim_hours);
            assert_eq!((r.completed, r.cut, r.not_started, r.trainings), (1, 1, 1, 3), "{k:?}");
            // The cut training's GPU counts until the end, not for its whole hour; it
            // started within 30 s of its submission (a host boot and a container start).
            // Reservation commits a session's GPU for the session's life, in the window; a
            // container that loads a notebook's state holds its GPU while it does (fcfs-batch,
            // middle-ground: two measured starts and transfers of 1 MiB at most).
            let committed_ms = r.gpu_hours_committed * H;
            let loads = 2.0 * Model::default().costs.move_ms(false, 1) as f64;
            let (lo, hi) =
                if k == PolicyKind::Reservation { (0.0, 1_300_000.0) } else { (690_000.0, 720_000.0 + loads) };
            assert!(committed_ms <= hi + 1.0 && committed_ms >= lo - 1.0, "{k:?}: {committed_ms} ms");
            // Hosts bill until the end at most: never more than the peak's GPUs × the window.
            let billed = f64::from(r.hosts_peak * Model::default().gpus_per_host) * 1_200_000.0 / H;
            assert!(r.gpu_hours_provisioned <= billed + 1e-3, "{k:?}: {} > {billed}", r.gpu_hours_provisioned);
            assert!((r.floor_gpu_hours * H - 720_000.0).abs() < 1.0, "{k:?}: the floor is clipped too");
        }
    }

    #[test]
    fn a_training_waiting_at_the_end_counts_its_wait_so_far() {
        // One 1-GPU host, held by the first session for its whole life under reservation:
        // the second session's training waits from 300 s to the end at 900 s.
        let s = |start, submit| Session {
            start,
            stop: 5_000_000,
            gpus: 1,
            trainings: vec![Training { submit, duration: 60_000, gpus: 1 }],
            namespace_mib: 1,
        };
        let w = Workload::new("w".into(), vec![s(0, 10_000), s(200_000, 300_000)]).ending_at(900_000);
        let m = Model { gpus_per_host: 1, fixed_hosts: 1, ..Model::default() };
        let r = run(&w, PolicyKind::Reservation, &m).expect("runs");
        assert_eq!((r.completed, r.cut, r.not_started), (1, 0, 1));
        assert_eq!(r.delays_ms.last().copied(), Some(600_000), "{:?}", r.delays_ms);
        assert!((r.sim_hours - 0.25).abs() < 1e-9, "{}", r.sim_hours);
        // Without the end, the same workload runs on and nothing is cut.
        let mut whole = w.clone();
        whole.end = None;
        let r = run(&whole, PolicyKind::Reservation, &m).expect("runs");
        assert_eq!((r.completed, r.cut, r.not_started), (2, 0, 0));
    }
}
