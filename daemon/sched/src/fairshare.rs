//! Fair share of contended GPUs: which waiting cell gets the next free GPUs.
//!
//! Each user's recent GPU time is their GPU-milliseconds with exponential decay (half-life
//! [`Params::half_life_ms`], 1 hour by default), kept by a [`Ledger`] from the GPUs each
//! user holds over time. Waiting cells go lowest *normalised usage* first (decayed usage ÷
//! the user's weight: a weight-2 user is entitled to twice the GPU time of a weight-1 one),
//! first come first served within a user and between users of equal usage.
//!
//! Usage is compared in bands of [`Params::band_gpu_ms`] (1 GPU-second by default), so that
//! users who differ by crumbs are equal and go in arrival order, and so that no cell waits
//! forever: a user none of whose cells run only decays, reaching the lowest band within
//! `half_life × log2(usage ÷ band)`, and there the oldest cell goes first. With one user
//! (a cluster without users: everyone is the anonymous user) the order is plain FIFO.
//!
//! A fair order alone cannot help a light user whose cell arrives when every GPU is held by
//! long running cells of a heavy one: nothing is preempted. So a host may keep **headroom**
//! ([`headroom`], `gpu.fair_share_headroom`, off by default: it costs the light users' p99
//! without a flood, docs/simulator.md): a cell of a user *over their share* (normalised usage above the mean of
//! the users with kernels on the host) may not take the GPUs that would leave fewer free than
//! the largest idle kernel of a user within their share there asks. Whoever is within their
//! share is never held back by it; a heavy user gets what the light ones cannot use.
//!
//! Pure: time is an argument, and the same inputs give the same order.

use std::collections::BTreeMap;

use crate::Millis;

/// The default half-life of recent GPU time: an hour.
pub const DEFAULT_HALF_LIFE_MS: Millis = 3_600_000;

/// The default band usages are compared in: a GPU-second.
pub const DEFAULT_BAND_GPU_MS: f64 = 1_000.0;

/// The user a kernel belongs to when nobody says otherwise (a cluster without users).
pub const ANONYMOUS: &str = "";

/// How usage is counted and compared.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// Recent GPU time halves every this long (> 0).
    pub half_life_ms: Millis,
    /// Normalised usages within one band of each other are equal (FIFO between them).
    pub band_gpu_ms: f64,
}

impl Default for Params {
    fn default() -> Self {
        Self { half_life_ms: DEFAULT_HALF_LIFE_MS, band_gpu_ms: DEFAULT_BAND_GPU_MS }
    }
}

/// A cell waiting for GPUs, as the decision sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Waiting<'a> {
    /// Its kernel's owner.
    pub user: &'a str,
    /// The owner's weight (the largest of their groups' weights; 1 by default). A weight
    /// that is not a positive number counts as 1.
    pub weight: f64,
    /// Its place in arrival order (smaller: earlier); ties keep the slice's order.
    pub arrival: u64,
}

/// Usage after `elapsed_ms` from `usage_gpu_ms`, holding `gpus` GPUs all along: the old
/// usage decays and what was held meanwhile is added, itself decayed from when it was held
/// (the exact integral of `gpus × 2^(-(now - t) / half_life)`).
pub fn decayed(usage_gpu_ms: f64, gpus: u32, elapsed_ms: Millis, half_life_ms: Millis) -> f64 {
    #[expect(clippy::cast_precision_loss, reason = "milliseconds well within f64's exact range")]
    let (dt, h) = (elapsed_ms as f64, half_life_ms.max(1) as f64);
    let lambda = std::f64::consts::LN_2 / h;
    let keep = (-lambda * dt).exp();
    usage_gpu_ms * keep + f64::from(gpus) * (1.0 - keep) / lambda
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Account {
    /// Decayed GPU-ms as of `at`.
    usage_gpu_ms: f64,
    at: Millis,
    /// GPUs the user holds since `at`.
    holding: u32,
}

/// Each user's recent GPU time, from the GPUs they take and give back.
#[derive(Debug, Clone, PartialEq)]
pub struct Ledger {
    half_life_ms: Millis,
    accounts: BTreeMap<String, Account>,
}

impl Ledger {
    /// An empty ledger whose usage halves every `half_life_ms`.
    pub fn new(half_life_ms: Millis) -> Self {
        Self { half_life_ms: half_life_ms.max(1), accounts: BTreeMap::new() }
    }

    /// `user` took `gpus` GPUs at `now`.
    pub fn take(&mut self, user: &str, gpus: u32, now: Millis) {
        let a = self.settled(user, now);
        a.holding = a.holding.saturating_add(gpus);
    }

    /// `user` gave `gpus` GPUs back at `now`.
    pub fn give_back(&mut self, user: &str, gpus: u32, now: Millis) {
        let a = self.settled(user, now);
        a.holding = a.holding.saturating_sub(gpus);
    }

    /// `user`'s decayed GPU-ms at `now` (0 for a user never seen).
    pub fn usage_gpu_ms(&self, user: &str, now: Millis) -> f64 {
        self.accounts
            .get(user)
            .map_or(0.0, |a| decayed(a.usage_gpu_ms, a.holding, now.saturating_sub(a.at), self.half_life_ms))
    }

    /// GPUs `user` holds now.
    pub fn holding(&self, user: &str) -> u32 {
        self.accounts.get(user).map_or(0, |a| a.holding)
    }

    /// Forgets users who hold nothing and whose usage decayed below `floor_gpu_ms`, so the
    /// ledger stays as large as the users active lately.
    pub fn forget_idle(&mut self, now: Millis, floor_gpu_ms: f64) {
        let h = self.half_life_ms;
        self.accounts
            .retain(|_, a| a.holding > 0 || decayed(a.usage_gpu_ms, 0, now.saturating_sub(a.at), h) >= floor_gpu_ms);
    }

    /// Users with an account, with their usage at `now` (for metrics and status pages).
    pub fn usages(&self, now: Millis) -> Vec<(String, f64)> {
        self.accounts.keys().map(|u| (u.clone(), self.usage_gpu_ms(u, now))).collect()
    }

    fn settled(&mut self, user: &str, now: Millis) -> &mut Account {
        let h = self.half_life_ms;
        let a = self.accounts.entry(user.to_owned()).or_insert(Account { usage_gpu_ms: 0.0, at: now, holding: 0 });
        // Time never runs backwards in a caller's clock; if it seems to, nothing accrues.
        if now > a.at {
            a.usage_gpu_ms = decayed(a.usage_gpu_ms, a.holding, now - a.at, h);
            a.at = now;
        }
        a
    }
}

/// The order waiting cells get GPUs in: indices into `waiting`, first served first.
/// Lowest band of normalised usage (`ledger`'s usage at `now` ÷ weight) first; then
/// arrival; then the slice's order.
pub fn order(waiting: &[Waiting<'_>], ledger: &Ledger, now: Millis, params: &Params) -> Vec<usize> {
    let mut keyed: Vec<(u64, u64, usize)> =
        waiting.iter().enumerate().map(|(i, w)| (band(ledger, w.user, w.weight, now, params), w.arrival, i)).collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(_, _, i)| i).collect()
}

/// The band of `user`'s normalised usage at `now` (usage ÷ weight ÷ the band's width,
/// rounded down): cells of a lower band go first.
pub fn band(ledger: &Ledger, user: &str, weight: f64, now: Millis, params: &Params) -> u64 {
    let weight = if weight.is_finite() && weight > 0.0 { weight } else { 1.0 };
    let width = if params.band_gpu_ms.is_finite() && params.band_gpu_ms > 0.0 { params.band_gpu_ms } else { 1.0 };
    let normalised = ledger.usage_gpu_ms(user, now) / weight / width;
    #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a non-negative band number")]
    let b = normalised.floor().clamp(0.0, 1e18) as u64;
    b
}

/// A kernel on a host, as the headroom sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OnHost<'a> {
    /// Its owner.
    pub user: &'a str,
    /// The owner's weight (as [`Waiting::weight`]).
    pub weight: f64,
    /// The GPUs it declared: what its next cell asks.
    pub gpus: u32,
    /// A cell of it holds GPUs now (it asks for none until that cell ends).
    pub running: bool,
}

/// GPUs a cell of `user` (of `weight`) must leave free on a host whose kernels are
/// `kernels`: 0 when the user is within their share (normalised usage at most the mean of
/// the users with kernels there, the user included, weighted; or within one band of it);
/// else the most GPUs a kernel of another user within their share asks, one without a
/// running cell (it may ask any moment, or waits already).
pub fn headroom(user: &str, weight: f64, kernels: &[OnHost<'_>], ledger: &Ledger, now: Millis, params: &Params) -> u32 {
    // Nothing to keep (the common case, cheap): no idle kernel of another user asks for GPUs.
    if !kernels.iter().any(|k| k.user != user && !k.running && k.gpus > 0) {
        return 0;
    }
    let w = |x: f64| if x.is_finite() && x > 0.0 { x } else { 1.0 };
    let mut users: BTreeMap<&str, f64> = kernels.iter().map(|k| (k.user, w(k.weight))).collect();
    users.insert(user, w(weight));
    let (used, weights) =
        users.iter().fold((0.0, 0.0), |(u, ws), (name, wt)| (u + ledger.usage_gpu_ms(name, now), ws + wt));
    let mean = used / weights;
    let width = if params.band_gpu_ms.is_finite() && params.band_gpu_ms > 0.0 { params.band_gpu_ms } else { 1.0 };
    let within = |name: &str, wt: f64| ledger.usage_gpu_ms(name, now) / wt <= mean + width;
    if within(user, w(weight)) {
        return 0;
    }
    kernels
        .iter()
        .filter(|k| k.user != user && !k.running && within(k.user, w(k.weight)))
        .map(|k| k.gpus)
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prop::{cases, Gen};

    const H: Millis = DEFAULT_HALF_LIFE_MS;

    #[test]
    fn usage_halves_every_half_life_and_accrues_what_was_held() {
        assert!((decayed(1000.0, 0, H, H) - 500.0).abs() < 1e-9);
        assert!((decayed(1000.0, 0, 2 * H, H) - 250.0).abs() < 1e-9);
        // One GPU for 1 s, a second short of a half-life: about 1,000 GPU-ms.
        assert!((decayed(0.0, 1, 1_000, H) - 1_000.0).abs() < 1.0);
        // Held for ever, usage tends to gpus ÷ λ.
        let limit = 2.0 * 3_600_000.0 / std::f64::consts::LN_2;
        assert!((decayed(0.0, 2, 100 * H, H) - limit).abs() < 1.0);
    }

    #[test]
    fn the_ledger_splits_time_as_it_likes_and_gets_the_same_usage() {
        let mut once = Ledger::new(H);
        once.take("a", 2, 0);
        once.give_back("a", 2, 600_000);
        let mut often = Ledger::new(H);
        often.take("a", 2, 0);
        for t in (60_000..600_000).step_by(60_000) {
            often.take("a", 0, t);
        }
        often.give_back("a", 2, 600_000);
        let (x, y) = (once.usage_gpu_ms("a", 900_000), often.usage_gpu_ms("a", 900_000));
        assert!((x - y).abs() < 1e-6, "{x} vs {y}");
        assert!(x > 1_000_000.0 && x < 1_200_000.0, "2 GPUs × 600 s, decayed a little: {x}");
        assert_eq!(once.holding("a"), 0);
        once.forget_idle(900_000 + 40 * H, 1.0);
        assert!(once.usages(0).is_empty(), "long idle users are forgotten");
    }

    fn random_waiting(g: &mut Gen, users: &[String]) -> Vec<(usize, f64, u64)> {
        let n = g.range(1, 12) as usize;
        (0..n).map(|_| (g.range(0, users.len() as u64 - 1) as usize, 1.0, g.range(0, 50))).collect()
    }

    fn random_ledger(g: &mut Gen, users: &[String]) -> Ledger {
        let mut l = Ledger::new(g.range(60_000, 2 * H));
        for u in users {
            if g.bool() {
                let gpus = g.u32(1, 8);
                let from = g.range(0, 3_000_000);
                l.take(u, gpus, from);
                l.give_back(u, gpus, from + g.range(0, 3_000_000));
            }
        }
        l
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("u{i}")).collect()
    }

    #[test]
    fn prop_one_users_cells_go_in_arrival_order() {
        cases(300, |g| {
            let users = names(g.range(1, 4) as usize);
            let ledger = random_ledger(g, &users);
            let cells = random_waiting(g, &users);
            let waiting: Vec<Waiting<'_>> =
                cells.iter().map(|&(u, weight, arrival)| Waiting { user: &users[u], weight, arrival }).collect();
            let got = order(&waiting, &ledger, 6_000_000, &Params::default());
            for u in &users {
                let arrivals: Vec<(u64, usize)> =
                    got.iter().filter(|&&i| waiting[i].user == u).map(|&i| (waiting[i].arrival, i)).collect();
                assert!(arrivals.windows(2).all(|w| w[0] <= w[1]), "{u}: {arrivals:?}");
            }
            let mut sorted = got.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..waiting.len()).collect::<Vec<_>>(), "a permutation");
        });
    }

    #[test]
    fn prop_a_user_without_recent_usage_goes_before_a_heavy_one() {
        cases(300, |g| {
            let mut l = Ledger::new(g.range(60_000, 2 * H));
            let now = g.range(0, 10 * H);
            // The heavy user held GPUs for at least a minute, recently.
            let gpus = g.u32(1, 8);
            let from = now.saturating_sub(g.range(60_000, 3_600_000));
            l.take("heavy", gpus, from);
            if g.bool() {
                l.give_back("heavy", gpus, now);
            }
            let heavy_cells = g.range(1, 6);
            let mut waiting: Vec<Waiting<'_>> =
                (0..heavy_cells).map(|a| Waiting { user: "heavy", weight: 1.0, arrival: a }).collect();
            // The light one arrives last.
            waiting.push(Waiting { user: "light", weight: 1.0, arrival: heavy_cells + g.range(0, 100) });
            let got = order(&waiting, &l, now, &Params::default());
            assert_eq!(got[0], waiting.len() - 1, "the light user's cell first: {got:?}");
        });
    }

    #[test]
    fn prop_weights_scale_shares() {
        // Two users with usage in the ratio of their weights are equal: arrival decides.
        // A user below their weighted share goes first whatever arrived first.
        cases(300, |g| {
            let weight = g.range(2, 8) as f64;
            let gpu_ms = g.range(10_000, 1_000_000) as f64;
            let mut l = Ledger::new(H);
            // usage exactly weight × gpu_ms for "big", gpu_ms for "small", at time 0 + 1 ms of decay
            // avoided by reading at the instant they were settled.
            l.accounts.insert("big".into(), Account { usage_gpu_ms: weight * gpu_ms, at: 0, holding: 0 });
            l.accounts.insert("small".into(), Account { usage_gpu_ms: gpu_ms, at: 0, holding: 0 });
            let p = Params { half_life_ms: H, band_gpu_ms: 1.0 };
            let big_first = g.bool();
            let (ab, as_) = if big_first { (0, 1) } else { (1, 0) };
            let waiting =
                [Waiting { user: "big", weight, arrival: ab }, Waiting { user: "small", weight: 1.0, arrival: as_ }];
            let got = order(&waiting, &l, 0, &p);
            assert_eq!(got[0], if big_first { 0 } else { 1 }, "equal shares: arrival decides");
            // The weighted user used less than its share (weight × 0.9): it goes first.
            l.accounts.insert("big".into(), Account { usage_gpu_ms: weight * gpu_ms * 0.9, at: 0, holding: 0 });
            assert_eq!(order(&waiting, &l, 0, &p)[0], 0, "below its weighted share");
            // Without its weight, the same usage would put it last.
            let unweighted = [Waiting { weight: 1.0, ..waiting[0] }, waiting[1]];
            assert_eq!(order(&unweighted, &l, 0, &p)[0], 1, "weight 1: the heavier goes last");
        });
    }

    #[test]
    fn prop_the_order_is_determined_by_its_inputs() {
        cases(200, |g| {
            let users = names(g.range(1, 5) as usize);
            let seed = g.next_u64();
            let build = || {
                let mut g2 = Gen::new(seed);
                (random_ledger(&mut g2, &users), random_waiting(&mut g2, &users))
            };
            let (l1, c1) = build();
            let (l2, c2) = build();
            let w = |c: &[(usize, f64, u64)]| -> Vec<(String, u64)> {
                c.iter().map(|&(u, _, a)| (users[u].clone(), a)).collect()
            };
            let (w1, w2) = (w(&c1), w(&c2));
            let v1: Vec<Waiting<'_>> = w1.iter().map(|(u, a)| Waiting { user: u, weight: 1.0, arrival: *a }).collect();
            let v2: Vec<Waiting<'_>> = w2.iter().map(|(u, a)| Waiting { user: u, weight: 1.0, arrival: *a }).collect();
            let now = g.range(0, 10 * H);
            assert_eq!(order(&v1, &l1, now, &Params::default()), order(&v2, &l2, now, &Params::default()));
        });
    }

    #[test]
    fn with_one_user_the_order_is_fifo() {
        let mut l = Ledger::new(H);
        l.take(ANONYMOUS, 8, 0);
        let waiting: Vec<Waiting<'_>> =
            [5, 1, 3, 2].iter().map(|&a| Waiting { user: ANONYMOUS, weight: 1.0, arrival: a }).collect();
        assert_eq!(order(&waiting, &l, 3_600_000, &Params::default()), vec![1, 3, 2, 0]);
    }

    #[test]
    fn a_waiting_heavy_user_reaches_the_lowest_band_in_bounded_time() {
        // 8 GPUs for 10 hours: about 41,500 GPU-s; it then waits, holding nothing.
        let mut l = Ledger::new(H);
        l.take("heavy", 8, 0);
        l.give_back("heavy", 8, 10 * H);
        let u = l.usage_gpu_ms("heavy", 10 * H);
        let bound = (u / DEFAULT_BAND_GPU_MS).log2().ceil();
        #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a small count of half-lives")]
        let by = 10 * H + bound as u64 * H;
        let p = Params::default();
        assert_eq!(band(&l, "heavy", 1.0, by, &p), 0, "at the latest after {bound} half-lives");
        // There it goes before a newcomer who arrived later.
        let waiting =
            [Waiting { user: "new", weight: 1.0, arrival: 9 }, Waiting { user: "heavy", weight: 1.0, arrival: 1 }];
        assert_eq!(order(&waiting, &l, by, &p), vec![1, 0]);
    }

    fn on_host<'a>(user: &'a str, gpus: u32, running: bool) -> OnHost<'a> {
        OnHost { user, weight: 1.0, gpus, running }
    }

    #[test]
    fn a_heavy_user_leaves_free_what_an_idle_light_kernel_asks() {
        // "heavy" held 4 GPUs for an hour; "light" and "mid" held little.
        let mut l = Ledger::new(H);
        l.take("heavy", 4, 0);
        l.take("mid", 1, 0);
        l.give_back("mid", 1, 60_000);
        let now = H;
        let p = Params::default();
        let kernels = [
            on_host("heavy", 4, true),
            on_host("heavy", 4, false),
            on_host("light", 8, false),
            on_host("mid", 2, false),
            on_host("busy", 6, true),
        ];
        assert_eq!(headroom("heavy", 1.0, &kernels, &l, now, &p), 8, "the largest idle kernel of another user");
        assert_eq!(headroom("light", 1.0, &kernels, &l, now, &p), 0, "within their share: no headroom");
        assert_eq!(headroom("mid", 1.0, &kernels, &l, now, &p), 0, "below the mean: none either");
        // Alone on the host, or with only running kernels of others: nothing to keep.
        assert_eq!(headroom("heavy", 1.0, &kernels[..2], &l, now, &p), 0);
        assert_eq!(headroom("heavy", 1.0, &[kernels[0], kernels[4]], &l, now, &p), 0);
    }

    #[test]
    fn a_weight_scales_the_share_headroom_is_kept_above() {
        // "a" used twice what "b" did: over the mean at weight 1, within it at weight 3.
        let mut l = Ledger::new(H);
        l.take("a", 2, 0);
        l.take("b", 1, 0);
        let kernels = [on_host("a", 2, true), on_host("b", 4, false)];
        let p = Params::default();
        assert_eq!(headroom("a", 1.0, &kernels, &l, 600_000, &p), 4, "weight 1: over its share");
        let weighted = [OnHost { weight: 3.0, ..kernels[0] }, kernels[1]];
        assert_eq!(headroom("a", 3.0, &weighted, &l, 600_000, &p), 0, "weight 3: within its share");
    }

    #[test]
    fn prop_headroom_spares_the_lightest_and_never_exceeds_an_idle_kernels_ask() {
        cases(300, |g| {
            let users = names(g.range(1, 5) as usize);
            let ledger = random_ledger(g, &users);
            let now = g.range(3_000_000, 6_000_000);
            let n = g.range(1, 10) as usize;
            let kernels: Vec<OnHost<'_>> = (0..n)
                .map(|_| on_host(&users[g.range(0, users.len() as u64 - 1) as usize], g.u32(0, 8), g.bool()))
                .collect();
            let p = Params::default();
            let lightest = users
                .iter()
                .min_by(|a, b| ledger.usage_gpu_ms(a, now).total_cmp(&ledger.usage_gpu_ms(b, now)))
                .expect("a user");
            assert_eq!(headroom(lightest, 1.0, &kernels, &ledger, now, &p), 0, "the lightest user is never held back");
            for u in &users {
                let keep = headroom(u, 1.0, &kernels, &ledger, now, &p);
                let most = kernels.iter().filter(|k| k.user != u && !k.running).map(|k| k.gpus).max().unwrap_or(0);
                assert!(keep <= most, "{u}: keeps {keep}, the others' idle kernels ask at most {most}");
            }
        });
    }
}
