//! What a replay measured, in the simulator's terms: one [`PolicyResult`] in trace time
//! (real durations × speedup), so `nbos replay --json` has the shape of `nbos sim --json`,
//! plus the replay's own figures (`"replay"`: real-time costs, the simulator flags that
//! model this cluster).

use super::clock::Clock;
use super::cluster::Host;
use super::sampler::{integrate, Sample, COUNTERS};
use super::session::SessionRecord;
use nbos_sched::policy::{AutoscaleParams, PolicyConfig};
use nbos_sched::sim::metrics::{round3, Point, Totals};
use nbos_sched::sim::{Model, PolicyResult, Workload};
use nbos_sched::Millis;

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
    pub counters: [Option<f64>; COUNTERS.len()],
}

/// The cluster's autoscaler in the simulator's terms (trace time).
#[derive(Debug, Clone)]
pub struct AutoscaleModel {
    /// `autoscale.spare_hosts`.
    pub spare_hosts: u32,
    /// `autoscale.peak_window`, whole minutes.
    pub peak_window_min: u64,
    /// `autoscale.interval`, seconds.
    pub interval_s: u64,
    /// A host's boot (the provider starts a daemon that joins): its real time × K.
    pub provision_s: u64,
    /// `autoscale.min_hosts`.
    pub min_hosts: u32,
}

impl AutoscaleModel {
    /// Hosts up from the start and never released: the founding hosts (the cluster's
    /// seeds, which the autoscaler never releases), at least `min_hosts`.
    pub fn floor(&self, hosts: u32) -> u32 {
        hosts.max(self.min_hosts)
    }
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
    /// The autoscaler (`None`: a fixed cluster of `hosts`).
    pub autoscale: Option<AutoscaleModel>,
}

impl ClusterModel {
    /// As a [`Model`] (the rest at the simulator's defaults).
    pub fn model(&self) -> Model {
        let d = Model::default();
        let fixed = Model {
            gpus_per_host: self.gpus_per_host,
            fixed_hosts: self.hosts,
            notebookos: PolicyConfig {
                subscription_ratio: self.subscription_ratio,
                idle_release_ms: self.idle_release_s * 1000,
                ..d.notebookos
            },
            election_ms: self.election_ms,
            ..d
        };
        match &self.autoscale {
            None => fixed,
            Some(a) => Model {
                fixed_hosts: 0,
                scaling_interval_ms: a.interval_s * 1000,
                provision_ms: a.provision_s * 1000,
                notebookos: PolicyConfig {
                    autoscale: AutoscaleParams {
                        spare_hosts: a.spare_hosts,
                        min_hosts: a.floor(self.hosts),
                        peak_window_ms: a.peak_window_min * 60_000,
                        interval_ms: a.interval_s * 1000,
                        ..fixed.notebookos.autoscale
                    },
                    ..fixed.notebookos
                },
                ..fixed
            },
        }
    }

    /// The `nbos sim` arguments of the same model (without the workload's).
    pub fn sim_args(&self) -> Vec<String> {
        let mut args = vec![("--policy", "notebookos".to_owned())];
        match &self.autoscale {
            None => args.push(("--fixed-hosts", self.hosts.to_string())),
            Some(a) => args.extend([
                ("--spare-hosts", a.spare_hosts.to_string()),
                ("--min-hosts", a.floor(self.hosts).to_string()),
                ("--peak-window-min", a.peak_window_min.to_string()),
                ("--scaling-interval-s", a.interval_s.to_string()),
                ("--provision-s", a.provision_s.to_string()),
            ]),
        }
        args.extend([
            ("--gpus-per-host", self.gpus_per_host.to_string()),
            ("--subscription-ratio", self.subscription_ratio.to_string()),
            ("--idle-release-s", self.idle_release_s.to_string()),
            ("--election-ms", self.election_ms.to_string()),
        ]);
        args.into_iter().flat_map(|(k, v)| [k.to_owned(), v]).collect()
    }
}

fn to_ms(x: f64) -> u128 {
    #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "non-negative ms of a replay")]
    let ms = x.max(0.0).round() as u128;
    ms
}

/// The measured run as a simulator result, in trace time.
pub fn result(w: &Workload, clock: &Clock, m: &Measured) -> PolicyResult {
    let k = clock.speedup();
    let span_us = m.end_unix_us.saturating_sub(m.start_unix_us);
    let span_ms = to_ms(clock.trace_ms(span_us));
    let gpu_us = integrate(&m.samples, m.start_unix_us, m.end_unix_us);
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
    #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "GPU counts")]
    let series = m
        .samples
        .iter()
        .filter(|s| s.unix_us >= m.start_unix_us)
        .map(|s| Point {
            t_ms: u64::try_from(to_ms(clock.trace_ms(s.unix_us - m.start_unix_us))).unwrap_or(u64::MAX),
            hosts: s.hosts,
            gpus_bound: (s.committed + s.idle_held).round() as u32,
            gpus_committed: s.committed.round() as u32,
        })
        .collect();
    PolicyResult::new(
        None,
        Totals {
            provisioned_gpu_ms: to_ms(gpu_us.provisioned / 1000.0 * k),
            bound_gpu_ms: to_ms(gpu_us.bound / 1000.0 * k),
            committed_gpu_ms: to_ms(gpu_us.committed / 1000.0 * k),
            floor_gpu_ms,
            span_ms: u64::try_from(span_ms).unwrap_or(u64::MAX),
            trainings: w.sessions.iter().map(|s| s.trainings.len()).sum(),
            completed: cells.count(),
            // A replay runs every session to its stop: no window cuts it.
            cut: 0,
            not_started: 0,
            migrations: counter(0),
            background_moves: counter(1),
            // The daemons do not report how long their moves took.
            migration_ms: 0,
            scale_outs: counter(2),
            // The replay's hosts report no memory to the bench.
            host_memory_peak_mib: 0,
            memory_refusals: 0,
            scale_ins: counter(3),
            violations: Vec::new(),
        },
        delays_ms,
        series,
    )
}

/// Delay p95 in trace seconds with each cell's submission moved to its kernel's start when
/// that came later: the scheduler's share of the delay, without the time compression's
/// (a kernel start of s real seconds is s × K trace seconds).
#[expect(clippy::cast_precision_loss, reason = "milliseconds of a replay")]
pub fn delay_p95_after_kernel_start_s(clock: &Clock, m: &Measured) -> f64 {
    let mut ms: Vec<Millis> = m
        .sessions
        .iter()
        .flat_map(|s| s.cells.iter().map(move |c| c.started_unix_us.saturating_sub(c.due_unix_us.max(s.ready_unix_us))))
        .map(|us| u64::try_from(to_ms(clock.trace_ms(us))).unwrap_or(u64::MAX))
        .collect();
    ms.sort_unstable();
    round3(nbos_sched::sim::metrics::percentile(&ms, 95.0) as f64 / 1000.0)
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
        "delay_p95_after_kernel_start_s": delay_p95_after_kernel_start_s(clock, m),
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
