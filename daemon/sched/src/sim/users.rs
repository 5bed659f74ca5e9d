//! Users of a simulated cluster (`nbos sim --users N`, `--flood-user`).
//!
//! - [`assign`]: each session's owner, drawn from a Zipf law over N users (user `k`,
//!   from 0, with weight 1 ÷ (k + 1)): a few users own most sessions, as in a team where a
//!   few people train all day and most open a notebook now and then. Seeded, from a
//!   random stream of its own (the sessions of a seed are unchanged).
//! - [`add_flood`]: one user additionally runs kernels that submit GPU cells back to
//!   back for the whole workload, enough to saturate the largest cluster the autoscaler
//!   may build, their first cells staggered over one cell's duration so that flood cells
//!   end (and ask again) at a steady rate: the flood a fair share must keep from the
//!   others' cells.

use super::rng::Rng;
use super::workload::{session_order, Session, Training, Workload};
use crate::Millis;

/// A flood kernel's namespace: the median of [`super::namespace`].
const FLOOD_NAMESPACE_MIB: u64 = 64;

/// The random stream users are drawn from.
const STREAM: u64 = 0x05E5;

/// The flood: `kernels` kernels of `gpus` GPUs, each submitting a cell of `cell_ms` the
/// moment its previous one ends, from the workload's first session start to its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Flood {
    /// The flooding user.
    pub user: u32,
    /// Kernels the flood runs at once.
    pub kernels: u32,
    /// GPUs per kernel (and per cell).
    pub gpus: u32,
    /// Each cell's duration.
    pub cell_ms: Millis,
}

impl Flood {
    /// A flood whose cells ask `factor` × the GPUs of `max_hosts` hosts of `gpus_per_host`.
    pub fn saturating(user: u32, gpus: u32, cell_ms: Millis, max_hosts: u32, gpus_per_host: u32, factor: u32) -> Self {
        let want = max_hosts.saturating_mul(gpus_per_host).saturating_mul(factor);
        Self { user, kernels: want.div_ceil(gpus.max(1)).max(1), gpus: gpus.max(1), cell_ms: cell_ms.max(1) }
    }
}

/// Assigns each session of `w` an owner among `users` users, Zipf-distributed, seeded.
pub fn assign(w: &mut Workload, users: u32, seed: u64) {
    let users = users.max(1);
    let mut cumulative = Vec::with_capacity(users as usize);
    let mut total = 0.0;
    for k in 0..users {
        total += 1.0 / f64::from(k + 1);
        cumulative.push(total);
    }
    let mut rng = Rng::new(seed, STREAM);
    w.users = (0..w.sessions.len())
        .map(|_| {
            let x = rng.unit() * total;
            let k = cumulative.partition_point(|&c| c <= x);
            u32::try_from(k.min(users as usize - 1)).unwrap_or(0)
        })
        .collect();
}

/// Adds `f`'s kernels to `w`, owned by `f.user`. A workload without an end floods until
/// its last session stops.
pub fn add_flood(w: &mut Workload, f: &Flood) {
    let t0 = w.sessions.iter().map(|s| s.start).min().unwrap_or(0);
    let end = w.end.unwrap_or_else(|| w.sessions.iter().map(|s| s.stop).max().unwrap_or(t0));
    // Kernel j starts its first cell j ÷ kernels of a cell later: a steady stream whose
    // cells end one after another, not all at once.
    let kernel = |j: u64| {
        let first = t0 + j * f.cell_ms / u64::from(f.kernels.max(1));
        let cells = end.saturating_sub(first).div_ceil(f.cell_ms);
        let trainings: Vec<Training> =
            (0..cells).map(|i| Training { submit: first + i * f.cell_ms, duration: f.cell_ms, gpus: f.gpus }).collect();
        Session { start: t0, stop: end, gpus: f.gpus, trainings, namespace_mib: FLOOD_NAMESPACE_MIB }
    };
    let mut owned: Vec<(Session, u32)> =
        std::mem::take(&mut w.sessions).into_iter().enumerate().map(|(i, s)| (s, w.user(index(i)))).collect();
    owned.extend((0..u64::from(f.kernels)).map(|j| (kernel(j), f.user)));
    // Stable: the workload's own sessions keep their order among equals, the flood's come after.
    owned.sort_by_key(|(s, _)| session_order(s));
    (w.sessions, w.users) = owned.into_iter().unzip();
    w.flood_user = Some(f.user);
}

fn index(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::synthetic::{self, SyntheticParams};

    #[test]
    fn owners_are_heavy_tailed_and_seeded() {
        let mut w = synthetic::generate(&SyntheticParams { sessions: 2_000, ..SyntheticParams::default() }, 1);
        let before = w.sessions.clone();
        assign(&mut w, 20, 1);
        assert_eq!(w.sessions, before, "the sessions are unchanged");
        let mut per = [0usize; 20];
        for &u in &w.users {
            per[u as usize] += 1;
        }
        // Zipf over 20 users: the first owns about 28 %, the last about 1.4 %.
        assert!(per[0] > 450 && per[0] < 680, "{per:?}");
        assert!(per[0] > 5 * per[19], "{per:?}");
        let mut again = w.clone();
        assign(&mut again, 20, 1);
        assert_eq!(again.users, w.users, "same seed, same owners");
        assign(&mut again, 20, 2);
        assert_ne!(again.users, w.users, "another seed, other owners");
    }

    #[test]
    fn a_flood_keeps_its_kernels_busy_to_the_end_and_owners_follow_their_sessions() {
        let mut w = synthetic::generate(&SyntheticParams { sessions: 50, hours: 2.0, ..SyntheticParams::default() }, 3)
            .ending_at(7_200_000);
        assign(&mut w, 5, 3);
        let owner_of_first = (w.sessions[0].clone(), w.users[0]);
        let f = Flood::saturating(0, 4, 600_000, 2, 8, 2);
        assert_eq!(f.kernels, 8, "2 × (2 hosts × 8 GPUs) ÷ 4 GPUs");
        add_flood(&mut w, &f);
        assert_eq!(w.sessions.len(), 58);
        assert_eq!(w.users.len(), 58);
        let flood: Vec<usize> = (0..w.sessions.len()).filter(|&i| w.sessions[i].gpus == 4 && w.users[i] == 0).collect();
        assert!(flood.len() >= 8, "the 8 flood kernels are user 0's");
        let firsts: Vec<Millis> = w
            .sessions
            .iter()
            .filter(|s| s.trainings.len() >= 12 && s.trainings[0].duration == 600_000)
            .map(|s| s.trainings[0].submit)
            .collect();
        assert_eq!(firsts.len(), 8, "each floods the 2 h with 10-minute cells");
        let mut sorted = firsts.clone();
        sorted.dedup();
        assert_eq!(sorted.len(), 8, "staggered: no two flood cells end together");
        let i = w.sessions.iter().position(|s| *s == owner_of_first.0).expect("still there");
        assert_eq!(w.users[i], owner_of_first.1, "an owner moves with its session");
        assert_eq!(w.flood_user, Some(0));
    }

    #[test]
    fn with_fair_share_a_flood_does_not_hold_back_the_others() {
        use crate::sim::{run, Model, PolicyKind};
        let mut w = synthetic::generate(&SyntheticParams { sessions: 20, hours: 4.0, ..SyntheticParams::default() }, 5)
            .ending_at(4 * 3_600_000);
        assign(&mut w, 10, 5);
        add_flood(&mut w, &Flood::saturating(0, 4, 600_000, 8, 8, 2));
        let others = |fair: bool| {
            let mut m = Model { fixed_hosts: 8, ..Model::default() };
            m.notebookos.fair_share = fair;
            let r = run(&w, PolicyKind::Notebookos, &m).expect("runs");
            assert_eq!(r.violations, 0);
            r.users.expect("the workload has users")
        };
        let (fair, fifo) = (others(true), others(false));
        assert!(
            fair.others_delay_p99_s < fifo.others_delay_p99_s / 2.0,
            "fair share: {} s, first come first served: {} s",
            fair.others_delay_p99_s,
            fifo.others_delay_p99_s
        );
        assert!(fair.jain_gpu_time_others > fifo.jain_gpu_time_others, "{fair:?} vs {fifo:?}");
        assert!(
            fair.flood_delay_p99_s > fair.others_delay_p99_s.into(),
            "the flood waits, not the others: {fair:?} vs {fifo:?}"
        );
    }

    #[test]
    fn with_headroom_the_others_do_not_wait_for_the_floods_running_cells() {
        use crate::sim::{run, Model, PolicyKind};
        let mut w = synthetic::generate(&SyntheticParams { sessions: 20, hours: 4.0, ..SyntheticParams::default() }, 5)
            .ending_at(4 * 3_600_000);
        assign(&mut w, 10, 5);
        add_flood(&mut w, &Flood::saturating(0, 4, 600_000, 8, 8, 2));
        let others = |headroom: bool| {
            let mut m = Model { fixed_hosts: 8, ..Model::default() };
            m.notebookos.fair_share_headroom = headroom;
            let r = run(&w, PolicyKind::Notebookos, &m).expect("runs");
            assert_eq!(r.violations, 0);
            r.users.expect("the workload has users")
        };
        let (kept, plain) = (others(true), others(false));
        assert!(
            kept.others_delay_p95_s < plain.others_delay_p95_s / 2.0,
            "others' p95 with headroom: {} s, without: {} s",
            kept.others_delay_p95_s,
            plain.others_delay_p95_s
        );
        assert!(
            kept.others_delay_p99_s <= plain.others_delay_p99_s,
            "p99 with headroom: {} s, without: {} s",
            kept.others_delay_p99_s,
            plain.others_delay_p99_s
        );
        assert!(kept.flood_delay_p99_s > kept.others_delay_p99_s.into(), "the flood waits: {kept:?}");
    }
}
