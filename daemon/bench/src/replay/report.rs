//! What a replay measured, in the simulator's terms: one [`PolicyResult`] in trace time
//! (real durations × speedup), so `nbos replay --json` has the shape of `nbos sim --json`,
//! plus the replay's own figures (`"replay"`: real-time costs, the simulator flags that
//! model this cluster).

use super::clock::Clock;
use super::cluster::Host;
use super::sampler::{integrate, Sample};
use super::session::SessionRecord;
use nbos_sched::sim::metrics::{round3, Point, Totals};
use nbos_sched::sim::{Model, PolicyResult, Workload};
use nbos_sched::Millis;

/// Counters read from the hosts' `/metrics` as deltas over the replay (absent means 0):
/// completed replica moves, and hosts the autoscaler added and released.
pub const COUNTERS: [&str; 3] = [
    "notebookos_migrations_total{result=\"completed\"}",
    "notebookos_autoscale_hosts_total{direction=\"out\",result=\"ok\"}",
    "notebookos_autoscale_hosts_total{direction=\"in\",result=\"ok\"}",
];

/// Everything a replay collected.
#[derive(Debug)]
pub struct Measured {
    /// Per session, in workload order.
    pub sessions: Vec<SessionRecord>,
    /// GPU gauges over time.
    pub samples: Vec<Sample>,
    /// Host reads the sampler missed.
    pub sample_misses: usize,
    /// The first session's start, µs since the epoch.
    pub start_unix_us: u64,
    /// The last kernel deleted.
    pub end_unix_us: u64,
    /// [`COUNTERS`] deltas, `None` where no host has the metric.
    pub counters: [Option<f64>; 3],
}

/// The cluster's description in the simulator's model: the flags of `nbos sim` that
/// model it at this speedup.
#[derive(Debug, Clone)]
pub struct ClusterModel {
    /// GPU hosts.
    pub hosts: u32,
    /// GPUs per host (the largest, if they differ).
    pub gpus_per_host: u32,
    /// The daemons' `gpu.subscription_ratio`.
    pub subscription_ratio: f64,
    /// The daemons' `gpu.idle_release` in trace time.
    pub idle_release_s: u64,
    /// Executor election in trace time: the simulator's real 2 ms × speedup.
    pub election_ms: Millis,
}

impl ClusterModel {
    /// As a [`Model`] (the rest at the simulator's defaults).
    pub fn model(&self) -> Model {
        Model {
            gpus_per_host: self.gpus_per_host,
            fixed_hosts: self.hosts,
            subscription_ratio: self.subscription_ratio,
            idle_release_ms: self.idle_release_s * 1000,
            election_ms: self.election_ms,
            ..Model::default()
        }
    }

    /// The `nbos sim` arguments of the same model.
    pub fn sim_args(&self) -> Vec<String> {
        [
            ("--policy", "notebookos".to_owned()),
            ("--fixed-hosts", self.hosts.to_string()),
            ("--gpus-per-host", self.gpus_per_host.to_string()),
            ("--subscription-ratio", self.subscription_ratio.to_string()),
            ("--idle-release-s", self.idle_release_s.to_string()),
            ("--election-ms", self.election_ms.to_string()),
        ]
        .into_iter()
        .flat_map(|(k, v)| [k.to_owned(), v])
        .collect()
    }
}

fn to_ms(x: f64) -> u128 {
    #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "non-negative ms of a replay")]
    let ms = x.max(0.0).round() as u128;
    ms
}

/// The measured run as a simulator result, in trace time.
pub fn result(w: &Workload, clock: &Clock, hosts: &[Host], m: &Measured) -> PolicyResult {
    let k = clock.speedup();
    let span_us = m.end_unix_us.saturating_sub(m.start_unix_us);
    let span_ms = to_ms(clock.trace_ms(span_us));
    let gpus: u32 = hosts.iter().map(|h| h.gpus).sum();
    let (committed_us, bound_us) = integrate(&m.samples, m.start_unix_us, m.end_unix_us);
    let cells = m.sessions.iter().flat_map(|s| &s.cells);
    let delays_ms: Vec<Millis> = cells
        .clone()
        .map(|c| {
            u64::try_from(to_ms(clock.trace_ms(c.started_unix_us.saturating_sub(c.due_unix_us)))).unwrap_or(u64::MAX)
        })
        .collect();
    let floor_gpu_ms: u128 =
        w.sessions.iter().flat_map(|s| &s.trainings).map(|t| u128::from(t.duration) * u128::from(t.gpus)).sum();
    let counter = |i: usize| m.counters[i].map_or(0, |v| u64::try_from(to_ms(v)).unwrap_or(0));
    let hosts_n = u32::try_from(hosts.len()).unwrap_or(u32::MAX);
    #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "GPU counts")]
    let series = m
        .samples
        .iter()
        .filter(|s| s.unix_us >= m.start_unix_us)
        .map(|s| Point {
            t_ms: u64::try_from(to_ms(clock.trace_ms(s.unix_us - m.start_unix_us))).unwrap_or(u64::MAX),
            hosts: hosts_n,
            gpus_bound: (s.committed + s.idle_held).round() as u32,
            gpus_committed: s.committed.round() as u32,
        })
        .collect();
    PolicyResult::new(
        None,
        Totals {
            provisioned_gpu_ms: span_ms * u128::from(gpus),
            bound_gpu_ms: to_ms(bound_us / 1000.0 * k),
            committed_gpu_ms: to_ms(committed_us / 1000.0 * k),
            floor_gpu_ms,
            span_ms: u64::try_from(span_ms).unwrap_or(u64::MAX),
            trainings: w.sessions.iter().map(|s| s.trainings.len()).sum(),
            completed: cells.count(),
            // A replay runs every session to its stop: no window cuts it.
            cut: 0,
            not_started: 0,
            migrations: counter(0),
            background_moves: 0,
            scale_outs: counter(1),
            scale_ins: counter(2),
            violations: Vec::new(),
        },
        delays_ms,
        series,
    )
}

#[expect(clippy::cast_precision_loss, reason = "microseconds of a replay")]
fn median_s(mut v: Vec<u64>) -> f64 {
    v.sort_unstable();
    round3(v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0) as f64 / 1e6)
}

/// The replay's own figures, real time unless named otherwise (`"replay"` in the JSON).
#[expect(clippy::cast_precision_loss, reason = "seconds for display")]
pub fn details(w: &Workload, clock: &Clock, hosts: &[Host], cm: &ClusterModel, m: &Measured) -> serde_json::Value {
    let cells: Vec<_> = m.sessions.iter().flat_map(|s| &s.cells).collect();
    // The daemon binds a kernel's GPUs for each of its cells: a training that asked fewer
    // held more here than in the simulator.
    let kernel_gpus_cells = w
        .sessions
        .iter()
        .zip(&m.sessions)
        .map(|(s, rec)| s.trainings.iter().zip(&rec.cells).filter(|(t, c)| t.gpus != c.gpus).count())
        .sum::<usize>();
    // What a cell took beyond its own (compressed) duration: the sync of its namespace
    // and the reply's way back, plus sleep overshoot.
    let mut overrun_us = Vec::new();
    for (s, rec) in w.sessions.iter().zip(&m.sessions) {
        for (t, c) in s.trainings.iter().zip(&rec.cells) {
            let ran = c.replied_unix_us.saturating_sub(c.started_unix_us);
            overrun_us.push(ran.saturating_sub(u64::try_from(clock.real(t.duration).as_micros()).unwrap_or(0)));
        }
    }
    let mut executors: Vec<u64> = cells.iter().filter_map(|c| c.executor).collect();
    executors.sort_unstable();
    executors.dedup();
    let absent: Vec<&str> = COUNTERS.iter().zip(&m.counters).filter(|(_, v)| v.is_none()).map(|(n, _)| *n).collect();
    serde_json::json!({
        "speedup": clock.speedup(),
        "hosts": hosts.iter().map(|h| serde_json::json!({"node_id": h.node_id, "url": h.url, "gpus": h.gpus})).collect::<Vec<_>>(),
        "wall_replay_s": round3(m.end_unix_us.saturating_sub(m.start_unix_us) as f64 / 1e6),
        "kernel_start_median_s": median_s(m.sessions.iter().map(|s| u64::try_from(s.kernel_start.as_micros()).unwrap_or(0)).collect()),
        "kernel_start_max_s": round3(m.sessions.iter().map(|s| s.kernel_start.as_secs_f64()).fold(0.0, f64::max)),
        "delay_real_median_s": median_s(cells.iter().map(|c| c.started_unix_us.saturating_sub(c.due_unix_us)).collect()),
        "cell_overrun_median_s": median_s(overrun_us),
        "executors": executors,
        "cells_bound_kernel_gpus": kernel_gpus_cells,
        "samples": m.samples.len(),
        "sample_misses": m.sample_misses,
        "counters_absent": absent,
        "sim_args": cm.sim_args(),
    })
}
