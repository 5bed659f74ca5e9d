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
    /// The floor: GPU-hours of the trainings themselves.
    pub floor_gpu_hours: f64,
}

/// A workload ready to simulate.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Workload {
    /// Where it came from, for the report.
    pub name: String,
    /// The sessions, by start time.
    pub sessions: Vec<Session>,
}

#[expect(clippy::cast_precision_loss, reason = "statistics for display")]
fn ms_min(ms: u128) -> f64 {
    ms as f64 / 60_000.0
}

impl Workload {
    /// Sorts sessions by (start, first submission) so every source numbers them the same way.
    pub fn new(name: String, mut sessions: Vec<Session>) -> Self {
        sessions.sort_by_key(|s| (s.start, s.trainings.first().map(|t| t.submit), s.stop, s.gpus));
        Self { name, sessions }
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
                floor += u128::from(t.duration) * u128::from(t.gpus);
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
/// columns are found by name, others are ignored). Blank lines are skipped.
pub fn parse_csv(text: &str) -> Result<Vec<Job>, TraceError> {
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
        let gpus = u32::try_from(gpus)
            .map_err(|_| TraceError::Row { line: i + 1, what: format!("`num_gpu` {gpus} is too large") })?;
        jobs.push(Job {
            id: field(c_id, "job_id")?,
            gpus,
            submit_min: field(c_submit, "submit_time")?,
            duration_min: field(c_dur, "duration")?,
        });
    }
    if jobs.is_empty() {
        return Err(TraceError::Empty);
    }
    jobs.sort_by_key(|j| (j.submit_min, j.id));
    Ok(jobs)
}

/// The jobs submitted in `[start_min, start_min + len_min)`, shifted so the window starts
/// at 0 (they run to completion, past the window's end if they must).
pub fn window(jobs: &[Job], start_min: u64, len_min: u64) -> Vec<Job> {
    jobs.iter()
        .filter(|j| j.submit_min >= start_min && j.submit_min < start_min.saturating_add(len_min))
        .map(|j| Job { submit_min: j.submit_min - start_min, ..*j })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_columns_by_name_and_errors_name_the_line() {
        let jobs = parse_csv(
            "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n1,4,10,0,x,7,0\n0,1,3,0,y,2,0\n\n",
        )
        .expect("parse");
        assert_eq!(jobs[0], Job { id: 0, gpus: 1, submit_min: 3, duration_min: 2 });
        assert_eq!(jobs.len(), 2);
        let e = parse_csv("job_id,num_gpu,submit_time,duration\n1,1,1,1\n2,x,1,1\n").unwrap_err();
        assert!(e.to_string().starts_with("line 3: `num_gpu` is \"x\""), "{e}");
        let e = parse_csv("job_id,num_gpu,submit_time,duration\n1,1,1\n").unwrap_err();
        assert!(e.to_string().contains("line 2") && e.to_string().contains("duration"), "{e}");
        assert_eq!(parse_csv("job_id,gpus,submit_time,duration\n").unwrap_err(), TraceError::MissingColumn("num_gpu"));
        assert_eq!(parse_csv("job_id,num_gpu,submit_time,duration\n").unwrap_err(), TraceError::Empty);
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
