//! NotebookOS workload templates (`traces/templates/*.json`, from the
//! NotebookOS workload driver, MIT licence): sessions with training events, in
//! ticks of 60 s. Only the fields the scheduler needs are read; the rest is ignored.

use serde::Deserialize;

/// Length of one template tick.
pub const TICK_MS: u64 = 60_000;

/// A workload template.
#[derive(Debug, Clone, Deserialize)]
pub struct Template {
    /// The sessions (one notebook kernel each).
    pub sessions: Vec<Session>,
}

/// One notebook session.
#[derive(Debug, Clone, Deserialize)]
pub struct Session {
    /// Session id.
    pub id: String,
    /// Tick the kernel starts.
    pub start_tick: u64,
    /// Tick the kernel is shut down.
    pub stop_tick: u64,
    /// Training events (cells that use GPUs), in submission order.
    pub trainings: Vec<Training>,
}

/// One training event (a GPU cell).
#[derive(Debug, Clone, Deserialize)]
pub struct Training {
    /// Tick the cell is submitted.
    pub start_tick: u64,
    /// Ticks it runs once started.
    pub duration_in_ticks: u64,
    /// GPUs it needs.
    pub gpus: u32,
}

impl Template {
    /// Parses a template.
    pub fn parse(json: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(json)
    }

    /// The floor: the sum over training events of GPUs x duration, in GPU-ticks.
    pub fn gpu_ticks_floor(&self) -> u64 {
        self.sessions.iter().flat_map(|s| &s.trainings).map(|t| u64::from(t.gpus) * t.duration_in_ticks).sum()
    }

    /// What whole-session reservation binds: each session's largest request for its lifetime.
    pub fn gpu_ticks_reservation(&self) -> u64 {
        self.sessions
            .iter()
            .map(|s| {
                let g = s.trainings.iter().map(|t| t.gpus).max().unwrap_or(0);
                u64::from(g) * s.stop_tick.saturating_sub(s.start_tick)
            })
            .sum()
    }

    /// The largest single request.
    pub fn max_gpus(&self) -> u32 {
        self.sessions.iter().flat_map(|s| &s.trainings).map(|t| t.gpus).max().unwrap_or(0)
    }
}
