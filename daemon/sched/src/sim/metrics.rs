//! What one policy's run measured, in the units of the report (GPU-hours, seconds).

pub use super::stats::{percentile, round3};
use super::PolicyKind;
use crate::Millis;

/// A point of the time series.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Point {
    /// Virtual time from the workload's start.
    pub t_ms: Millis,
    /// Hosts alive (up or booting).
    pub hosts: u32,
    /// GPUs bound (committed or idle-held).
    pub gpus_bound: u32,
    /// GPUs committed to running trainings.
    pub gpus_committed: u32,
}

/// The engine's raw totals.
#[derive(Debug, Clone, Default)]
pub struct Totals {
    /// GPU-ms of hosts alive.
    pub provisioned_gpu_ms: u128,
    /// GPU-ms bound.
    pub bound_gpu_ms: u128,
    /// GPU-ms committed.
    pub committed_gpu_ms: u128,
    /// GPU-ms of the trainings themselves.
    pub floor_gpu_ms: u128,
    /// Virtual time simulated.
    pub span_ms: Millis,
    /// Trainings in the workload.
    pub trainings: usize,
    /// Trainings that ran to the end.
    pub completed: usize,
    /// Trainings still running at the window's end (clipped there).
    pub cut: usize,
    /// Trainings not started by the window's end (waiting, or not yet submitted).
    pub not_started: usize,
    /// Migrations to run a cell.
    pub migrations: u64,
    /// Idle replicas moved in the background (drain, cover).
    pub background_moves: u64,
    /// Time charged to moves (replica start + state transfer), ms.
    pub migration_ms: u64,
    /// Hosts requested.
    pub scale_outs: u64,
    /// Hosts released.
    pub scale_ins: u64,
    /// The most host memory the replicas or containers on one host used, MiB.
    pub host_memory_peak_mib: u64,
    /// Placements refused for host memory.
    pub memory_refusals: u64,
    /// Broken promises.
    pub violations: Vec<String>,
}

/// One policy's result (the keys of `--json`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PolicyResult {
    /// GPU-hours of hosts alive (up or booting) × their GPUs.
    pub gpu_hours_provisioned: f64,
    /// GPU-hours bound to kernels (committed or idle-held; whole sessions for reservation).
    pub gpu_hours_bound: f64,
    /// GPU-hours committed (bound minus idle-held).
    pub gpu_hours_committed: f64,
    /// The trainings' own GPU-hours.
    pub floor_gpu_hours: f64,
    /// Interactivity delay (submission to the start of execution), percentiles, seconds.
    pub delay_p50_s: f64,
    /// 95th percentile.
    pub delay_p95_s: f64,
    /// 99th percentile.
    pub delay_p99_s: f64,
    /// Maximum.
    pub delay_max_s: f64,
    /// Mean.
    pub delay_mean_s: f64,
    /// Trainings that waited more than 1 s.
    pub delayed_over_1s: usize,
    /// Trainings that waited more than 10 s.
    pub delayed_over_10s: usize,
    /// Replicas migrated to run a cell.
    pub migrations: u64,
    /// Idle replicas moved in the background: off hosts being released, or (ours) to a host
    /// that can run the kernel's next cell at once.
    pub background_moves: u64,
    /// Seconds charged to all moves (cell-path and background): replica start plus state
    /// transfer, as the cost file says (waits for a move slot not included).
    pub migration_seconds: f64,
    /// Hosts requested.
    pub scale_outs: u64,
    /// Hosts released.
    pub scale_ins: u64,
    /// The most host memory the replicas or containers on one host used at once, MiB
    /// (see `Model::host_memory_mib` for what a host has).
    pub host_memory_peak_mib: u64,
    /// Placement attempts refused because too few hosts had the memory for the replicas.
    pub memory_refusals: u64,
    /// Most hosts alive at a sample.
    pub hosts_peak: u32,
    /// Mean hosts alive over the samples.
    pub hosts_mean: f64,
    /// Trainings in the workload.
    pub trainings: usize,
    /// Trainings that ran to their end.
    pub completed: usize,
    /// Trainings still running at the window's end (`--hours`): their GPUs count up to the
    /// end; they are not completed.
    pub cut: usize,
    /// Trainings the window's end found waiting (their wait so far is among the delays)
    /// or not yet submitted.
    pub not_started: usize,
    /// Hours of virtual time, from the first session's start to the last event, or to the
    /// window's end (never past it).
    pub sim_hours: f64,
    /// Broken invariants (a GPU committed twice, a cell that did not fit): must be 0.
    pub violations: usize,
    /// The first few, to debug.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub violation_samples: Vec<String>,
    /// Time series (for the plots; not in the JSON).
    #[serde(skip)]
    pub series: Vec<Point>,
    /// Every delay, sorted, ms (for the CDF; not in the JSON).
    #[serde(skip)]
    pub delays_ms: Vec<Millis>,
    /// The policy.
    #[serde(skip)]
    pub policy: Option<PolicyKind>,
    /// Per-user figures, when the workload has users (`--users`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub users: Option<super::fairness::UserFigures>,
    /// The scheduler-core decisions the policy called, `module::function` (not in the JSON).
    #[serde(skip)]
    pub decisions: Vec<&'static str>,
}

#[expect(clippy::cast_precision_loss, reason = "GPU-ms to hours for display")]
fn hours(gpu_ms: u128) -> f64 {
    round3(gpu_ms as f64 / 3_600_000.0)
}

#[expect(clippy::cast_precision_loss, reason = "ms to s for display")]
fn secs(ms: Millis) -> f64 {
    round3(ms as f64 / 1000.0)
}

impl PolicyResult {
    /// Assembles a result (`policy` is `None` for a run measured on a real cluster).
    pub fn new(policy: Option<PolicyKind>, t: Totals, mut delays_ms: Vec<Millis>, series: Vec<Point>) -> Self {
        delays_ms.sort_unstable();
        let n = delays_ms.len();
        #[expect(clippy::cast_precision_loss, reason = "display")]
        let mean = if n == 0 { 0.0 } else { delays_ms.iter().map(|&d| d as f64).sum::<f64>() / n as f64 / 1000.0 };
        #[expect(clippy::cast_precision_loss, reason = "display")]
        let span_h = t.span_ms as f64 / 3_600_000.0;
        #[expect(clippy::cast_precision_loss, reason = "display")]
        let hosts_mean = if series.is_empty() {
            0.0
        } else {
            series.iter().map(|p| f64::from(p.hosts)).sum::<f64>() / series.len() as f64
        };
        Self {
            gpu_hours_provisioned: hours(t.provisioned_gpu_ms),
            gpu_hours_bound: hours(t.bound_gpu_ms),
            gpu_hours_committed: hours(t.committed_gpu_ms),
            floor_gpu_hours: hours(t.floor_gpu_ms),
            delay_p50_s: secs(percentile(&delays_ms, 50.0)),
            delay_p95_s: secs(percentile(&delays_ms, 95.0)),
            delay_p99_s: secs(percentile(&delays_ms, 99.0)),
            delay_max_s: secs(delays_ms.last().copied().unwrap_or(0)),
            delay_mean_s: round3(mean),
            delayed_over_1s: delays_ms.iter().filter(|&&d| d > 1_000).count(),
            delayed_over_10s: delays_ms.iter().filter(|&&d| d > 10_000).count(),
            migrations: t.migrations,
            background_moves: t.background_moves,
            migration_seconds: secs(t.migration_ms),
            scale_outs: t.scale_outs,
            scale_ins: t.scale_ins,
            host_memory_peak_mib: t.host_memory_peak_mib,
            memory_refusals: t.memory_refusals,
            hosts_peak: series.iter().map(|p| p.hosts).max().unwrap_or(0),
            hosts_mean: round3(hosts_mean),
            trainings: t.trainings,
            completed: t.completed,
            cut: t.cut,
            not_started: t.not_started,
            sim_hours: round3(span_h),
            violations: t.violations.len(),
            violation_samples: t.violations.into_iter().take(5).collect(),
            series,
            delays_ms,
            policy,
            users: None,
            decisions: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<Millis> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), 50);
        assert_eq!(percentile(&v, 95.0), 95);
        assert_eq!(percentile(&v, 100.0), 100);
        assert_eq!(percentile(&[7], 99.0), 7);
        assert_eq!(percentile(&[], 50.0), 0);
    }
}
