//! Per-user figures of a run whose sessions have owners (`nbos sim --users N`): each user's
//! cell delays, and how evenly GPU time went to users.
//!
//! Evenness is Jain's index `(Σx)² ÷ (n Σx²)` over users' GPU time *served ÷ demanded*:
//! the GPU-ms their cells ran (up to the window's end) ÷ the GPU-ms they asked for (their
//! cells' GPUs × durations, clipped the same way). 1 means every user got the same
//! fraction of what they asked; 1/n that one user got it all. Over delays it would not do:
//! the ideal delay is 0, where the index is undefined, and it would score everyone waiting
//! alike as fair. Normalising by demand (Jain's own advice) keeps a user who asks little
//! from counting as starved. A fair share does *not* aim at 1 under a flood: it serves the
//! light users fully and the flooder with what remains, so the index over all users falls
//! while the index over the others (`jain_gpu_time_others`) is the one that should stay
//! near 1.

use super::stats::{percentile, round3};
use super::workload::Workload;
use crate::Millis;

/// Users listed one by one in the report: the ones with most cells.
const LISTED: usize = 10;
/// A user's p99 counts towards the spread of per-user p99s from this many cells.
const MIN_CELLS: usize = 20;

/// One user's figures.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct UserRow {
    /// The user (`u<n>`: 0 owns most sessions).
    pub user: u32,
    /// Cells that started or were waiting at the end.
    pub cells: usize,
    /// Their delay p99, s.
    pub delay_p99_s: f64,
    /// GPU-hours their cells ran.
    pub gpu_hours_served: f64,
    /// GPU-hours their cells asked for.
    pub gpu_hours_demanded: f64,
}

/// What users got, for the report and `--json`'s `"users"`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct UserFigures {
    /// Users owning at least one cell.
    pub users: usize,
    /// The flooding user, if any.
    pub flood_user: Option<u32>,
    /// Cells of the users other than the flooder (all users without a flood).
    pub others_cells: usize,
    /// Their delay p99, s: the figure the target is on.
    pub others_delay_p99_s: f64,
    /// Their delay p95, s.
    pub others_delay_p95_s: f64,
    /// The flooder's cells' delay p99, s.
    pub flood_delay_p99_s: Option<f64>,
    /// The largest per-user delay p99 among the others with at least 20 cells, s.
    pub worst_user_delay_p99_s: f64,
    /// The median per-user delay p99 among them, s.
    pub median_user_delay_p99_s: f64,
    /// Jain's index over every user's GPU time served ÷ demanded.
    pub jain_gpu_time: f64,
    /// The same over the users other than the flooder.
    pub jain_gpu_time_others: f64,
    /// The users with most cells (and the flooder).
    pub per_user: Vec<UserRow>,
}

#[derive(Default)]
struct Acc {
    delays: Vec<Millis>,
    served: u128,
    demanded: u128,
}

/// The figures of a run of `w`: `delays` are (session, delay ms) of every cell started or
/// waiting at the end; `served_gpu_ms` is per session. `None` when `w` has no users.
pub fn figures(w: &Workload, delays: &[(u32, Millis)], served_gpu_ms: &[u128]) -> Option<UserFigures> {
    if w.users.is_empty() {
        return None;
    }
    let n = w.users.iter().copied().max().map_or(0, |m| m as usize + 1);
    let mut acc: Vec<Acc> = (0..n).map(|_| Acc::default()).collect();
    for &(s, d) in delays {
        acc[w.user(s) as usize].delays.push(d);
    }
    for (s, sess) in w.sessions.iter().enumerate() {
        let a = &mut acc[w.users[s] as usize];
        a.served += served_gpu_ms.get(s).copied().unwrap_or(0);
        a.demanded += sess.trainings.iter().map(|t| u128::from(w.clipped(t)) * u128::from(t.gpus)).sum::<u128>();
    }
    for a in &mut acc {
        a.delays.sort_unstable();
    }
    let flood = w.flood_user;
    let is_other = |u: usize| flood.is_none_or(|f| f as usize != u);
    let mut others: Vec<Millis> =
        acc.iter().enumerate().filter(|(u, _)| is_other(*u)).flat_map(|(_, a)| a.delays.iter().copied()).collect();
    others.sort_unstable();
    let mut p99s: Vec<Millis> = acc
        .iter()
        .enumerate()
        .filter(|(u, a)| is_other(*u) && a.delays.len() >= MIN_CELLS)
        .map(|(_, a)| percentile(&a.delays, 99.0))
        .collect();
    p99s.sort_unstable();
    let ratio = |a: &Acc| {
        #[expect(clippy::cast_precision_loss, reason = "a fraction")]
        let r = a.served as f64 / a.demanded as f64;
        r.min(1.0)
    };
    let all: Vec<f64> = acc.iter().filter(|a| a.demanded > 0).map(ratio).collect();
    let rest: Vec<f64> =
        acc.iter().enumerate().filter(|(u, a)| is_other(*u) && a.demanded > 0).map(|(_, a)| ratio(a)).collect();
    let mut listed: Vec<usize> = (0..n).filter(|&u| !acc[u].delays.is_empty()).collect();
    listed.sort_by_key(|&u| (std::cmp::Reverse(acc[u].delays.len()), u));
    listed.truncate(LISTED);
    if let Some(f) = flood.map(|f| f as usize).filter(|f| *f < n && !listed.contains(f)) {
        listed.push(f);
    }
    Some(UserFigures {
        users: acc.iter().filter(|a| !a.delays.is_empty() || a.demanded > 0).count(),
        flood_user: flood,
        others_cells: others.len(),
        others_delay_p99_s: secs(percentile(&others, 99.0)),
        others_delay_p95_s: secs(percentile(&others, 95.0)),
        flood_delay_p99_s: flood.and_then(|f| acc.get(f as usize)).map(|a| secs(percentile(&a.delays, 99.0))),
        worst_user_delay_p99_s: secs(p99s.last().copied().unwrap_or(0)),
        median_user_delay_p99_s: secs(percentile(&p99s, 50.0)),
        jain_gpu_time: round3(jain(&all)),
        jain_gpu_time_others: round3(jain(&rest)),
        per_user: listed
            .into_iter()
            .map(|u| UserRow {
                user: u32::try_from(u).unwrap_or(u32::MAX),
                cells: acc[u].delays.len(),
                delay_p99_s: secs(percentile(&acc[u].delays, 99.0)),
                gpu_hours_served: hours(acc[u].served),
                gpu_hours_demanded: hours(acc[u].demanded),
            })
            .collect(),
    })
}

/// Jain's fairness index of `x` (1 for no values, or all zero).
pub fn jain(x: &[f64]) -> f64 {
    let (sum, squares) = x.iter().fold((0.0, 0.0), |(s, q), v| (s + v, q + v * v));
    if squares <= 0.0 {
        return 1.0;
    }
    #[expect(clippy::cast_precision_loss, reason = "a count of users")]
    let n = x.len() as f64;
    sum * sum / (n * squares)
}

#[expect(clippy::cast_precision_loss, reason = "ms to s for display")]
fn secs(ms: Millis) -> f64 {
    round3(ms as f64 / 1000.0)
}

#[expect(clippy::cast_precision_loss, reason = "GPU-ms to hours for display")]
fn hours(gpu_ms: u128) -> f64 {
    round3(gpu_ms as f64 / 3_600_000.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::workload::{Session, Training};

    #[test]
    fn jains_index_is_one_when_even_and_one_over_n_when_one_takes_all() {
        assert!((jain(&[0.5, 0.5, 0.5]) - 1.0).abs() < 1e-12);
        assert!((jain(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
        assert!((jain(&[]) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn figures_split_delays_and_gpu_time_by_owner() {
        let s = |gpus| Session {
            start: 0,
            stop: 1_000_000,
            gpus,
            trainings: vec![Training { submit: 0, duration: 100_000, gpus }],
            namespace_mib: 1,
        };
        let mut w = Workload::new("t".into(), vec![s(1), s(2)]);
        assert!(figures(&w, &[], &[]).is_none(), "no users, no per-user figures");
        w.users = vec![0, 1];
        w.flood_user = Some(1);
        // User 0 got all it asked, user 1 half.
        let f = figures(&w, &[(0, 5), (1, 9_000)], &[100_000, 100_000]).expect("users");
        assert_eq!((f.users, f.others_cells, f.others_delay_p99_s, f.flood_delay_p99_s), (2, 1, 0.005, Some(9.0)));
        assert!((f.jain_gpu_time - jain(&[1.0, 0.5])).abs() < 1e-3, "{}", f.jain_gpu_time);
        assert!((f.jain_gpu_time_others - 1.0).abs() < 1e-12);
    }
}
