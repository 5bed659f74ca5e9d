//! Pre-warm pool sizing: how many started, GPU-less kernel containers to keep ready so
//! that a migration (or a new single-replica container) skips the container start.
//!
//! NotebookOS keeps a fixed 3 per host. Ours follows demand by Little's law: the
//! containers taken while one is being refilled, `⌈takes in window × refill ÷ window⌉`,
//! plus one, within `[floor, cap]`. A quiet cluster keeps `floor`; a burst of migrations
//! grows the pool for as long as the window remembers it.

use super::Millis;

/// The window over which pool takes are counted (the daemon's pool and the simulator's).
pub const WINDOW_MS: Millis = 600_000;

/// The pool size for `takes` containers taken over the last `window` ms, when starting
/// one takes `refill` ms.
pub fn pool_size(takes: u32, window: Millis, refill: Millis, floor: u32, cap: u32) -> u32 {
    let cap = cap.max(floor);
    if window == 0 {
        return cap;
    }
    let in_flight = (u128::from(takes) * u128::from(refill)).div_ceil(u128::from(window));
    let want = u32::try_from(in_flight).unwrap_or(u32::MAX).saturating_add(1);
    want.clamp(floor, cap)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prop::cases;

    #[test]
    fn littles_law_within_bounds() {
        // 60 takes in 10 min with a 5 s refill: 0.5 in flight -> 1, plus one.
        assert_eq!(pool_size(60, 600_000, 5_000, 0, 10), 2);
        assert_eq!(pool_size(0, 600_000, 5_000, 1, 10), 1);
        assert_eq!(pool_size(10_000, 600_000, 5_000, 1, 10), 10, "capped");
        assert_eq!(pool_size(5, 0, 5_000, 1, 4), 4);
    }

    #[test]
    fn property_monotone_in_demand_and_bounded() {
        cases(300, |g| {
            let (floor, cap) = (g.u32(0, 5), g.u32(0, 50));
            let (w, r) = (g.range(1, 3_600_000), g.range(0, 60_000));
            let a = g.u32(0, 5_000);
            let b = a + g.u32(0, 5_000);
            let (pa, pb) = (pool_size(a, w, r, floor, cap), pool_size(b, w, r, floor, cap));
            assert!(pa <= pb, "more demand never shrinks the pool");
            assert!(pa >= floor && pb <= cap.max(floor));
        });
    }
}
