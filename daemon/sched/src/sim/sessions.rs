//! The session generator: the Sensei trace has trainings but no sessions, so we group
//! its trainings into notebook sessions, calibrated on the NotebookOS session template
//! `Template-8Session-39.53IAT-22.95Dur.json` (8 sessions, 53 trainings):
//!
//! | template statistic | value | parameter |
//! |---|---|---|
//! | trainings per session | 6.6 (3–9) | `mean_trainings` |
//! | idle minutes between a training's end and the next submission | mean 39, median 26, max 164 | `mean_gap_min`, `max_gap_min` |
//! | minutes from session start to its first training | mean 30.6 | `mean_lead_min` |
//! | minutes from the last training's end to session stop | 2 | `tail_min` |
//! | GPUs per training within a session | constant | (sessions are per GPU count) |
//!
//! Trainings are taken in submission order. A training joins an open session of its GPU
//! count whose previous training has ended and has been idle at most `max_gap_min`, with
//! probability `1 - 1/mean_trainings` (so sessions hold `mean_trainings` on average when
//! idle sessions are at hand); among those it joins the one whose idle time is closest to a
//! gap drawn from an exponential of mean `mean_gap_min`. Otherwise it opens a session that
//! started an exponential `mean_lead_min` earlier (not before time 0). A session stops
//! `tail_min` after its last training ends. Its namespace size is drawn as
//! [`super::namespace`] says. Everything is drawn from the seed.

use super::rng::{minutes_ms, Rng};
use super::workload::{Job, Session, Training, Workload};

/// The generator's parameters (defaults: the template's calibration).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct SessionParams {
    /// Mean trainings per session.
    pub mean_trainings: f64,
    /// Mean idle minutes between trainings of a session.
    pub mean_gap_min: f64,
    /// A session idle longer than this is over.
    pub max_gap_min: f64,
    /// Mean minutes from session start to its first training.
    pub mean_lead_min: f64,
    /// Minutes from the last training's end to the session's stop.
    pub tail_min: f64,
}

impl Default for SessionParams {
    fn default() -> Self {
        Self { mean_trainings: 6.6, mean_gap_min: 39.0, max_gap_min: 164.0, mean_lead_min: 30.6, tail_min: 2.0 }
    }
}

struct Open {
    session: usize,
    free_at: u64,
}

/// Groups `jobs` (sorted by submission) into sessions.
pub fn generate(name: String, jobs: &[Job], p: &SessionParams, seed: u64) -> Workload {
    let mut rng = Rng::new(seed, 0x5E55);
    let mut ns = Rng::new(seed, super::namespace::STREAM);
    let mut sessions: Vec<Session> = Vec::new();
    // Open sessions per GPU count (few distinct counts: a small sorted vec of lists).
    let mut open: Vec<(u32, Vec<Open>)> = Vec::new();
    let join_p = if p.mean_trainings > 1.0 { 1.0 - 1.0 / p.mean_trainings } else { 0.0 };
    let max_gap = minutes_ms(p.max_gap_min);
    for j in jobs {
        let submit = j.submit_min * 60_000;
        let duration = j.duration_min * 60_000;
        let list = match open.iter().position(|(g, _)| *g == j.gpus) {
            Some(i) => &mut open[i].1,
            None => {
                open.push((j.gpus, Vec::new()));
                let last = open.len() - 1;
                &mut open[last].1
            }
        };
        // Sessions idle too long are over.
        list.retain(|o| o.free_at > submit || submit - o.free_at <= max_gap);
        let joined = if rng.chance(join_p) {
            let want = minutes_ms(rng.exp(p.mean_gap_min));
            list.iter_mut()
                .filter(|o| o.free_at <= submit)
                .min_by_key(|o| ((submit - o.free_at).abs_diff(want), o.session))
                .map(|o| {
                    o.free_at = submit + duration;
                    o.session
                })
        } else {
            None
        };
        let t = Training { submit, duration, gpus: j.gpus };
        match joined {
            Some(s) => sessions[s].trainings.push(t),
            None => {
                let lead = minutes_ms(rng.exp(p.mean_lead_min));
                list.push(Open { session: sessions.len(), free_at: submit + duration });
                sessions.push(Session {
                    start: submit.saturating_sub(lead),
                    stop: 0,
                    gpus: j.gpus,
                    trainings: vec![t],
                    namespace_mib: super::namespace::draw(&mut ns),
                });
            }
        }
    }
    let tail = minutes_ms(p.tail_min);
    for s in &mut sessions {
        let end = s.trainings.iter().map(|t| t.submit + t.duration).max().unwrap_or(s.start);
        s.stop = end + tail;
    }
    Workload::new(name, sessions)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The defaults are the template's own statistics (the calibration the docs state), so
    /// a change to either shows here.
    #[test]
    fn the_defaults_are_the_calibration_templates_statistics() {
        let json = include_str!("../../../../traces/templates/Template-8Session-39.53IAT-22.95Dur.json");
        let t = crate::template::Template::parse(json).expect("template");
        let w = Workload::from_template("template".into(), &t);
        let st = w.stats();
        let d = SessionParams::default();
        let min = |ms: u64| ms as f64 / 60_000.0;
        assert_eq!((st.sessions, st.trainings), (8, 53));
        assert!((st.trainings_per_session - d.mean_trainings).abs() < 0.05, "{st:?}");
        assert!((st.gap_min - d.mean_gap_min).abs() < 1.0, "{st:?}");
        assert!((st.lead_min - d.mean_lead_min).abs() < 0.1, "{st:?}");
        let gaps =
            w.sessions.iter().flat_map(|s| s.trainings.windows(2).map(|p| p[1].submit - (p[0].submit + p[0].duration)));
        assert_eq!(gaps.map(min).fold(0.0, f64::max), d.max_gap_min);
        for s in &w.sessions {
            let last = s.trainings.last().expect("a training");
            assert_eq!(min(s.stop - (last.submit + last.duration)), d.tail_min, "session at {}", s.start);
            assert!(s.trainings.iter().all(|t| t.gpus == s.trainings[0].gpus), "one GPU count per session");
        }
    }

    fn jobs(n: u64) -> Vec<Job> {
        (0..n)
            .map(|i| Job { id: i, gpus: [1, 4, 8][(i % 3) as usize], submit_min: i * 7, duration_min: 5 + i % 11 })
            .collect()
    }

    #[test]
    fn every_training_lands_in_exactly_one_session_without_overlap() {
        let js = jobs(600);
        let w = generate("t".into(), &js, &SessionParams::default(), 3);
        let n: usize = w.sessions.iter().map(|s| s.trainings.len()).sum();
        assert_eq!(n, js.len());
        for s in &w.sessions {
            assert!(s.trainings.iter().all(|t| t.gpus == s.gpus), "one GPU count per session");
            assert!(
                s.start <= s.trainings[0].submit && s.stop >= s.trainings.last().map_or(0, |t| t.submit + t.duration)
            );
            for p in s.trainings.windows(2) {
                assert!(p[1].submit >= p[0].submit + p[0].duration, "one training at a time");
            }
        }
        assert!(w.stats().trainings_per_session > 1.5, "{:?}", w.stats());
        assert_eq!(w, generate("t".into(), &js, &SessionParams::default(), 3), "same seed, same sessions");
    }

    #[test]
    fn one_training_per_session_when_asked() {
        let p = SessionParams { mean_trainings: 1.0, ..SessionParams::default() };
        let w = generate("t".into(), &jobs(50), &p, 1);
        assert_eq!(w.sessions.len(), 50);
    }
}
