//! Workloads: sessions (notebook kernels) with their trainings (GPU cells), from the
//! Sensei CSV (through the session generator), a NotebookOS template, or the synthetic
//! generator. Times are virtual milliseconds from the workload's start.

use crate::template::{Template, TICK_MS};
use crate::Millis;

/// One training event (a GPU cell).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Training {
    /// When the user submits it.
    pub submit: Millis,
    /// How long it runs once started.
    pub duration: Millis,
    /// GPUs it needs.
    pub gpus: u32,
}

/// One notebook session.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Session {
    /// When the kernel starts.
    pub start: Millis,
    /// When it is shut down (if its last training is still running then, when that ends).
    pub stop: Millis,
    /// GPUs the kernel declares (its largest training).
    pub gpus: u32,
    /// Its trainings, in submission order; one runs at a time.
    pub trainings: Vec<Training>,
    /// MiB of state its kernel holds (an assumption: [`super::namespace`]).
    pub namespace_mib: u64,
}

/// Statistics of a workload, for the report (and the generator's calibration).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Stats {
    /// Sessions.
    pub sessions: usize,
    /// Trainings.
    pub trainings: usize,
    /// Mean trainings per session.
    pub trainings_per_session: f64,
    /// Mean minutes from session start to its first training.
    pub lead_min: f64,
    /// Mean minutes between a training's end and the next submission in its session.
    pub gap_min: f64,
    /// Mean training duration, minutes.
    pub duration_min: f64,
    /// Hours from the first session start to the last submission.
    pub span_hours: f64,
    /// The floor: GPU-hours of the trainings themselves (in a window, the part of each
    /// before the window's end, had it started at its submission).
    pub floor_gpu_hours: f64,
}

/// A workload ready to simulate.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Workload {
    /// Where it came from, for the report.
    pub name: String,
    /// The sessions, by start time.
    pub sessions: Vec<Session>,
    /// The window's end (`--hours`): the simulation stops there, whatever still runs.
    /// `None`: every session runs to its stop.
    pub end: Option<Millis>,
    /// Per session, the user who owns it ([`super::users`]); empty: one user owns all.
    pub users: Vec<u32>,
    /// The user who floods the cluster with cells, if any ([`super::users::add_flood`]).
    pub flood_user: Option<u32>,
}

/// The order sessions are numbered in: by start, then first submission, stop and GPUs.
pub(crate) fn session_order(s: &Session) -> (Millis, Option<Millis>, Millis, u32) {
    (s.start, s.trainings.first().map(|t| t.submit), s.stop, s.gpus)
}

#[expect(clippy::cast_precision_loss, reason = "statistics for display")]
fn ms_min(ms: u128) -> f64 {
    ms as f64 / 60_000.0
}

impl Workload {
    /// Sorts sessions by (start, first submission) so every source numbers them the same way.
    pub fn new(name: String, mut sessions: Vec<Session>) -> Self {
        sessions.sort_by_key(session_order);
        Self { name, sessions, end: None, users: Vec::new(), flood_user: None }
    }

    /// The user who owns session `s` (0 when the workload has no users).
    pub fn user(&self, s: u32) -> u32 {
        self.users.get(s as usize).copied().unwrap_or(0)
    }

    /// The same workload, simulated only up to `end`.
    #[must_use]
    pub fn ending_at(self, end: Millis) -> Self {
        Self { end: Some(end), ..self }
    }

    /// The statistics.
    #[expect(clippy::cast_precision_loss, reason = "statistics for display")]
    pub fn stats(&self) -> Stats {
        let trainings: usize = self.sessions.iter().map(|s| s.trainings.len()).sum();
        let (mut lead, mut gap, mut gaps, mut dur, mut floor) = (0u128, 0u128, 0u128, 0u128, 0u128);
        for s in &self.sessions {
            if let Some(t) = s.trainings.first() {
                lead += u128::from(t.submit.saturating_sub(s.start));
            }
            for w in s.trainings.windows(2) {
                gap += u128::from(w[1].submit.saturating_sub(w[0].submit + w[0].duration));
                gaps += 1;
            }
            for t in &s.trainings {
                dur += u128::from(t.duration);
                floor += u128::from(self.clipped(t)) * u128::from(t.gpus);
            }
        }
        let first = self.sessions.iter().map(|s| s.start).min().unwrap_or(0);
        let last = self.sessions.iter().flat_map(|s| s.trainings.iter().map(|t| t.submit)).max().unwrap_or(first);
        let n = self.sessions.len().max(1) as f64;
        Stats {
            sessions: self.sessions.len(),
            trainings,
            trainings_per_session: trainings as f64 / n,
            lead_min: ms_min(lead) / n,
            gap_min: if gaps == 0 { 0.0 } else { ms_min(gap) / gaps as f64 },
            duration_min: if trainings == 0 { 0.0 } else { ms_min(dur) / trainings as f64 },
            span_hours: ms_min(u128::from(last.saturating_sub(first))) / 60.0,
            floor_gpu_hours: ms_min(floor) / 60.0,
        }
    }

    /// Multiplies every session's namespace by `factor` (at least 1 MiB each).
    pub fn scale_namespaces(&mut self, factor: f64) {
        for s in &mut self.sessions {
            #[expect(clippy::cast_precision_loss, reason = "MiB")]
            let mib = s.namespace_mib as f64 * factor;
            #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "clamped, finite")]
            let v = mib.round().clamp(1.0, 1e15) as u64;
            s.namespace_mib = v;
        }
    }

    /// The part of `t`'s duration before the window's end, had it started at its
    /// submission (what the floor counts in a window).
    pub fn clipped(&self, t: &Training) -> Millis {
        match self.end {
            Some(end) => t.duration.min(end.saturating_sub(t.submit)),
            None => t.duration,
        }
    }

    /// A template's sessions as they are (ticks of 60 s). The kernel declares its
    /// largest training's GPUs; each training keeps its own. Namespace sizes are drawn
    /// (the template has none) from a fixed seed: a template replays the same every time.
    pub fn from_template(name: String, t: &Template) -> Self {
        let mut ns = super::rng::Rng::new(0, super::namespace::STREAM);
        let sessions = t
            .sessions
            .iter()
            .map(|s| Session {
                start: s.start_tick * TICK_MS,
                stop: s.stop_tick * TICK_MS,
                gpus: s.trainings.iter().map(|t| t.gpus).max().unwrap_or(0),
                trainings: s
                    .trainings
                    .iter()
                    .map(|t| Training {
                        submit: t.start_tick * TICK_MS,
                        duration: t.duration_in_ticks * TICK_MS,
                        gpus: t.gpus,
                    })
                    .collect(),
                namespace_mib: super::namespace::draw(&mut ns),
            })
            .collect();
        Self::new(name, sessions)
    }
}

/// One row of a Tiresias-format trace (times in minutes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Job {
    /// `job_id`.
    pub id: u64,
    /// `num_gpu`.
    pub gpus: u32,
    /// `submit_time`, minutes.
    pub submit_min: u64,
    /// `duration`, minutes.
    pub duration_min: u64,
}

/// Why a trace could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    /// The header lacks a column we need.
    #[error("line 1: the header has no `{0}` column (expected job_id,num_gpu,submit_time,...,duration)")]
    MissingColumn(&'static str),
    /// A row is malformed.
    #[error("line {line}: {what}")]
    Row {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        what: String,
    },
    /// The trace has no rows.
    #[error("the trace has no jobs")]
    Empty,
}

/// Parses a Tiresias-format CSV (`job_id,num_gpu,submit_time,...,duration,...`; the
/// columns are found by name, others are ignored). Blank lines are skipped. A row that
/// no cluster of `gpus_per_host`-GPU hosts can run (0 GPUs, more than a host, 0 minutes)
/// is refused by its line: silently dropping or mis-attributing it changes the results.
pub fn parse_csv(text: &str, gpus_per_host: u32) -> Result<Vec<Job>, TraceError> {
    let mut lines = text.lines().enumerate();
    let header: Vec<&str> = lines.next().map(|(_, h)| h.split(',').map(str::trim).collect()).unwrap_or_default();
    let col = |name: &'static str| header.iter().position(|h| *h == name).ok_or(TraceError::MissingColumn(name));
    let (c_id, c_gpu, c_submit, c_dur) = (col("job_id")?, col("num_gpu")?, col("submit_time")?, col("duration")?);
    let mut jobs = Vec::new();
    for (i, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let cells: Vec<&str> = line.split(',').map(str::trim).collect();
        let field = |c: usize, name: &str| -> Result<u64, TraceError> {
            let v = cells.get(c).ok_or_else(|| TraceError::Row {
                line: i + 1,
                what: format!("{} fields, no `{name}` (column {})", cells.len(), c + 1),
            })?;
            v.parse::<u64>().map_err(|e| TraceError::Row {
                line: i + 1,
                what: format!("`{name}` is {v:?}: {e} (expected a whole number of minutes or GPUs)"),
            })
        };
        let gpus = field(c_gpu, "num_gpu")?;
        let refuse = |what: String| TraceError::Row { line: i + 1, what };
        let gpus = u32::try_from(gpus).ok().filter(|&g| g <= gpus_per_host).ok_or_else(|| {
            refuse(format!("`num_gpu` is {gpus}, more than a host's {gpus_per_host} GPUs (see --gpus-per-host)"))
        })?;
        if gpus == 0 {
            return Err(refuse("`num_gpu` is 0: a training needs at least 1 GPU".to_owned()));
        }
        let duration_min = field(c_dur, "duration")?;
        if duration_min == 0 {
            return Err(refuse("`duration` is 0: a training lasts at least 1 minute".to_owned()));
        }
        jobs.push(Job { id: field(c_id, "job_id")?, gpus, submit_min: field(c_submit, "submit_time")?, duration_min });
    }
    if jobs.is_empty() {
        return Err(TraceError::Empty);
    }
    jobs.sort_by_key(|j| (j.submit_min, j.id));
    Ok(jobs)
}

/// The jobs submitted in `[start_min, start_min + len_min)`, shifted so the window starts
/// at 0. Jobs submitted before the window are not in it (the cluster starts empty); the
/// simulation stops at the window's end ([`Workload::ending_at`]).
pub fn window(jobs: &[Job], start_min: u64, len_min: u64) -> Vec<Job> {
    jobs.iter()
        .filter(|j| j.submit_min >= start_min && j.submit_min < start_min.saturating_add(len_min))
        .map(|j| Job { submit_min: j.submit_min - start_min, ..*j })
        .collect()
}

/// GPU-minutes the jobs submitted in `[start_min, start_min + len_min)` can run inside
/// it: each job's GPUs × its minutes before the window's end.
pub fn window_gpu_min(jobs: &[Job], start_min: u64, len_min: u64) -> u64 {
    let end = start_min.saturating_add(len_min);
    jobs.iter()
        .filter(|j| j.submit_min >= start_min && j.submit_min < end)
        .map(|j| u64::from(j.gpus) * j.duration_min.min(end - j.submit_min))
        .sum()
}

/// The busiest `len_min`-minute window of `jobs` (sorted by submission): the start minute
/// with the most [`window_gpu_min`], ties to the earliest, and that figure. A busiest
/// window starts at some job's submission, so only those starts are tried.
pub fn busiest_window(jobs: &[Job], len_min: u64) -> Option<(u64, u64)> {
    let mut best: Option<(u64, u64)> = None;
    let mut last = None;
    for j in jobs {
        if last == Some(j.submit_min) {
            continue;
        }
        last = Some(j.submit_min);
        // Quadratic in the worst case, but a window holds a few thousand jobs at most
        // and this runs once per command.
        let from = jobs.partition_point(|x| x.submit_min < j.submit_min);
        let to = jobs.partition_point(|x| x.submit_min < j.submit_min.saturating_add(len_min));
        let gpu_min = window_gpu_min(&jobs[from..to], j.submit_min, len_min);
        if best.is_none_or(|(_, b)| gpu_min > b) {
            best = Some((j.submit_min, gpu_min));
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_columns_by_name_and_errors_name_the_line() {
        let jobs = parse_csv(
            "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n1,4,10,0,x,7,0\n0,1,3,0,y,2,0\n\n",
            8,
        )
        .expect("parse");
        assert_eq!(jobs[0], Job { id: 0, gpus: 1, submit_min: 3, duration_min: 2 });
        assert_eq!(jobs.len(), 2);
        let e = parse_csv("job_id,num_gpu,submit_time,duration\n1,1,1,1\n2,x,1,1\n", 8).unwrap_err();
        assert!(e.to_string().starts_with("line 3: `num_gpu` is \"x\""), "{e}");
        let e = parse_csv("job_id,num_gpu,submit_time,duration\n1,1,1\n", 8).unwrap_err();
        assert!(e.to_string().contains("line 2") && e.to_string().contains("duration"), "{e}");
        assert_eq!(
            parse_csv("job_id,gpus,submit_time,duration\n", 8).unwrap_err(),
            TraceError::MissingColumn("num_gpu")
        );
        assert_eq!(parse_csv("job_id,num_gpu,submit_time,duration\n", 8).unwrap_err(), TraceError::Empty);
    }

    #[test]
    fn rows_no_host_can_run_are_refused_by_their_line() {
        let head = "job_id,num_gpu,submit_time,duration\n1,1,0,5\n";
        for (row, says) in [
            ("2,0,1,5", "line 3: `num_gpu` is 0"),
            ("2,1,1,0", "line 3: `duration` is 0"),
            ("2,16,1,5", "line 3: `num_gpu` is 16, more than a host's 8 GPUs"),
        ] {
            let e = parse_csv(&format!("{head}{row}\n"), 8).unwrap_err().to_string();
            assert!(e.starts_with(says), "{row}: {e}");
        }
        assert_eq!(parse_csv(&format!("{head}2,16,1,5\n"), 16).map(|j| j.len()), Ok(2));
    }

    #[test]
    fn the_busiest_window_counts_only_gpu_minutes_inside_it() {
        let job = |id, gpus, submit_min, duration_min| Job { id, gpus, submit_min, duration_min };
        // A long 8-GPU job at minute 0 holds 8 × 10 GPU-minutes of a 10-minute window,
        // not 8 × 1000; four 4-GPU jobs of 9 minutes from minute 50 hold 144.
        let jobs = [job(0, 8, 0, 1000), job(1, 4, 50, 9), job(2, 4, 51, 9), job(3, 4, 52, 9), job(4, 4, 53, 9)];
        assert_eq!(window_gpu_min(&jobs, 0, 10), 80);
        assert_eq!(window_gpu_min(&jobs, 50, 10), 4 * (9 + 9 + 8 + 7));
        assert_eq!(busiest_window(&jobs, 10), Some((50, 132)));
        assert_eq!(busiest_window(&[], 10), None);
    }

    #[test]
    fn a_window_floor_counts_what_fits_before_its_end() {
        let t = |submit, duration| Training { submit, duration, gpus: 2 };
        let s = Session {
            start: 0,
            stop: 500_000,
            gpus: 2,
            trainings: vec![t(0, 100_000), t(200_000, 300_000)],
            namespace_mib: 1,
        };
        let w = Workload::new("w".into(), vec![s]);
        assert!((w.stats().floor_gpu_hours - 2.0 * 400_000.0 / 3_600_000.0).abs() < 1e-9);
        let w = w.ending_at(250_000);
        assert!((w.stats().floor_gpu_hours - 2.0 * 150_000.0 / 3_600_000.0).abs() < 1e-9);
    }

    #[test]
    fn a_window_shifts_to_zero() {
        let jobs = [
            Job { id: 1, gpus: 1, submit_min: 5, duration_min: 1 },
            Job { id: 2, gpus: 1, submit_min: 10, duration_min: 100 },
            Job { id: 3, gpus: 1, submit_min: 20, duration_min: 1 },
        ];
        let w = window(&jobs, 10, 10);
        assert_eq!(w, vec![Job { id: 2, gpus: 1, submit_min: 0, duration_min: 100 }]);
    }
}
