//! The synthetic generator: sessions arriving as a Poisson process, each with a
//! geometric number of trainings (mean `mean_trainings`), exponential lead, gaps and
//! durations, and GPUs drawn from the Sensei mix (1: 49 %, 4: 20 %, 8: 31 % of jobs).
//! Namespace sizes as [`super::namespace`] says. The defaults follow the session template's calibration ([`super::sessions`]) and its
//! 23-minute mean training.

use super::rng::{minutes_ms, Rng};
use super::sessions::SessionParams;
use super::workload::{Session, Training, Workload};

/// The synthetic generator's parameters.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct SyntheticParams {
    /// Sessions to generate.
    pub sessions: u32,
    /// Hours over which they arrive.
    pub hours: f64,
    /// Mean training duration, minutes.
    pub mean_duration_min: f64,
    /// Session shape (trainings, gaps, lead, tail).
    pub shape: SessionParams,
}

impl Default for SyntheticParams {
    fn default() -> Self {
        Self { sessions: 200, hours: 17.5, mean_duration_min: 23.0, shape: SessionParams::default() }
    }
}

/// Generates a workload.
pub fn generate(p: &SyntheticParams, seed: u64) -> Workload {
    let mut rng = Rng::new(seed, 0x5717);
    let mut ns = Rng::new(seed, super::namespace::STREAM);
    let mean_iat = p.hours * 60.0 / f64::from(p.sessions.max(1));
    let mut t = 0.0f64;
    let mut sessions = Vec::new();
    for _ in 0..p.sessions {
        t += rng.exp(mean_iat);
        let gpus = match rng.below(100) {
            0..=48 => 1,
            49..=68 => 4,
            _ => 8,
        };
        let start = minutes_ms(t);
        let mut at = start + minutes_ms(rng.exp(p.shape.mean_lead_min));
        let mut trainings = Vec::new();
        loop {
            let duration = minutes_ms(rng.exp(p.mean_duration_min)).max(60_000);
            trainings.push(Training { submit: at, duration, gpus });
            if p.shape.mean_trainings <= 1.0 || rng.chance(1.0 / p.shape.mean_trainings) {
                break;
            }
            at += duration + minutes_ms(rng.exp(p.shape.mean_gap_min).min(p.shape.max_gap_min));
        }
        let stop = at + trainings.last().map_or(0, |x| x.duration) + minutes_ms(p.shape.tail_min);
        sessions.push(Session { start, stop, gpus, trainings, namespace_mib: super::namespace::draw(&mut ns) });
    }
    Workload::new(format!("synthetic ({} sessions over {} h)", p.sessions, p.hours), sessions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_shaped_like_the_template() {
        let p = SyntheticParams { sessions: 2_000, ..SyntheticParams::default() };
        let w = generate(&p, 9);
        assert_eq!(w, generate(&p, 9));
        let s = w.stats();
        assert_eq!(s.sessions, 2_000);
        assert!((s.trainings_per_session - 6.6).abs() < 0.6, "{s:?}");
        assert!((s.lead_min - 30.6).abs() < 3.0, "{s:?}");
        for x in &w.sessions {
            assert!(x.trainings.windows(2).all(|p| p[1].submit >= p[0].submit + p[0].duration));
            assert!(x.stop >= x.trainings.last().map_or(0, |t| t.submit + t.duration));
        }
    }
}
