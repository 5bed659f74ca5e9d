//! Namespace sizes: how many MiB of state a session's kernel holds, what a moved replica
//! or a single-replica container must load. No trace we replay records it, so it is an
//! assumption, drawn per session from a seeded lognormal: median [`MEDIAN_MIB`] MiB
//! (a notebook holding a few tensors or data frames), σ = [`SIGMA`] (one in ten above
//! ~440 MiB, one in a hundred above ~2 GiB: the notebooks that load a data set), capped at
//! [`MAX_MIB`]. `nbos sim --namespace-scale F` multiplies every size
//! ([`super::Workload::scale_namespaces`]) to test the sensitivity.
//!
//! Each source draws from a stream of its own, so adding sizes leaves the sessions and
//! trainings of a seed as they were.

use super::rng::Rng;

/// Median namespace, MiB.
pub const MEDIAN_MIB: f64 = 64.0;
/// σ of the size's natural log.
pub const SIGMA: f64 = 1.5;
/// The largest namespace drawn, MiB.
pub const MAX_MIB: u64 = 16 * 1024;
/// The random stream of namespace sizes (separate from the sessions' own).
pub const STREAM: u64 = 0x4E53;

/// One session's namespace, MiB (at least 1).
pub fn draw(rng: &mut Rng) -> u64 {
    // Box–Muller: a standard normal from two uniforms (1 - u keeps ln away from 0).
    let (u1, u2) = (1.0 - rng.unit(), rng.unit());
    let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    let mib = (MEDIAN_MIB.ln() + SIGMA * z).exp();
    #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "clamped to 1..=MAX_MIB")]
    let v = mib.round().clamp(1.0, MAX_MIB as f64) as u64;
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_draws_have_the_stated_median_and_tail() {
        let mut rng = Rng::new(7, STREAM);
        let mut v: Vec<u64> = (0..20_000).map(|_| draw(&mut rng)).collect();
        v.sort_unstable();
        let at = |q: f64| v[(q * v.len() as f64) as usize];
        assert!((56..=72).contains(&at(0.5)), "median {}", at(0.5));
        assert!((350..=550).contains(&at(0.9)), "p90 {}", at(0.9));
        assert!(v[0] >= 1 && *v.last().unwrap() <= MAX_MIB);
    }
}
