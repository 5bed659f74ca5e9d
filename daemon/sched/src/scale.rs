//! Scale-out and scale-in targets of a GPU cluster, evaluated every scaling interval.
//!
//! - [`paper`]: NotebookOS's rule as in the authors' code (ds2-lab/NotebookOS,
//!   `multiReplicaTryScaleOut` / `defaultTryScaleIn`): scale out to
//!   `max(⌈committed × factor ÷ G⌉, min_hosts + buffer)` hosts, scale in while above
//!   `⌈committed × limit ÷ G⌉`, at most `max_release` hosts a step. We clamp the scale-in
//!   limit to the scale-out target so that the two never chase each other.
//! - [`ours`]: keeps a few *whole* hosts free (so a cell of any size finds one while
//!   another boots), never goes below what placement needs to keep every replica within
//!   the subscription ratio, and releases free hosts only when the recent peak of demand
//!   (committed plus waiting GPUs over a trailing window, [`PeakTracker`]) no longer
//!   needs them, `max_release` a step.

use std::collections::VecDeque;

use super::Millis;

/// What the autoscaler should do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// Request this many hosts.
    Out(u32),
    /// Release this many hosts (the drain choice says which).
    In(u32),
    /// Nothing.
    Hold,
}

/// NotebookOS's scaling parameters (their sample config: 1.05, 1.1, buffer 3, release 2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PaperRule {
    /// Scale-out factor on committed GPUs.
    pub factor: f64,
    /// Scale-in limit factor on committed GPUs.
    pub limit: f64,
    /// Hosts kept above the minimum.
    pub buffer: u32,
    /// The minimum capacity (their older code: the number of replicas).
    pub min_hosts: u32,
    /// Hosts released per step at most.
    pub max_release: u32,
}

impl Default for PaperRule {
    fn default() -> Self {
        Self { factor: 1.05, limit: 1.1, buffer: 3, min_hosts: 3, max_release: 2 }
    }
}

fn hosts_for(gpus: f64, per_host: u32) -> u32 {
    if per_host == 0 {
        return 0;
    }
    let h = (gpus / f64::from(per_host) - 1e-9).ceil().max(0.0);
    // Saturates on absurd inputs; hosts counts are small.
    #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "non-negative, clamped")]
    let h = h.min(f64::from(u32::MAX)) as u32;
    h
}

fn decide(hosts: u32, target: u32, limit: u32, max_release: u32) -> Scale {
    if hosts < target {
        Scale::Out(target - hosts)
    } else if hosts > limit && max_release > 0 {
        Scale::In((hosts - limit).min(max_release))
    } else {
        Scale::Hold
    }
}

/// NotebookOS's rule. `hosts` counts live and provisioning hosts.
pub fn paper(rule: &PaperRule, hosts: u32, committed_gpus: u32, gpus_per_host: u32) -> Scale {
    let c = f64::from(committed_gpus);
    let target = hosts_for(c * rule.factor, gpus_per_host).max(rule.min_hosts + rule.buffer);
    let limit = hosts_for(c * rule.limit, gpus_per_host).max(target);
    decide(hosts, target, limit, rule.max_release)
}

/// Our rule's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OursRule {
    /// Whole hosts kept above the recent peak (absorb a burst while a host boots).
    pub spare_hosts: u32,
    /// The minimum (a kernel needs `replicas` distinct hosts).
    pub min_hosts: u32,
    /// Hosts released per step at most.
    pub max_release: u32,
}

impl Default for OursRule {
    fn default() -> Self {
        Self { spare_hosts: 1, min_hosts: 3, max_release: 2 }
    }
}

/// Our rule. `free_hosts` counts hosts with no GPU committed (booting ones included:
/// they will be free); `peak_gpus` is the recent peak of committed plus waiting GPUs;
/// `subscribed_gpus` the GPUs subscribed by all replicas; `ratio` the subscription ratio.
///
/// Keep `spare_hosts` whole hosts free, so that a cell of any size (up to a host) finds a
/// host at once while another boots; never go below what placement needs or the
/// minimum; release free hosts beyond the spare ones only when the recent peak (plus the
/// spare) no longer needs them, at most `max_release` a step.
pub fn ours(
    rule: &OursRule,
    hosts: u32,
    free_hosts: u32,
    peak_gpus: u32,
    subscribed_gpus: u32,
    ratio: f64,
    gpus_per_host: u32,
) -> Scale {
    let for_placement = hosts_for(f64::from(subscribed_gpus) / ratio.max(1.0), gpus_per_host);
    let floor = for_placement.max(rule.min_hosts);
    let for_peak = hosts_for(f64::from(peak_gpus), gpus_per_host) + rule.spare_hosts;
    let out = rule.spare_hosts.saturating_sub(free_hosts).max(floor.saturating_sub(hosts));
    if out > 0 {
        return Scale::Out(out);
    }
    let keep = for_peak.max(floor);
    let release = free_hosts.saturating_sub(rule.spare_hosts).min(hosts.saturating_sub(keep)).min(rule.max_release);
    if release > 0 {
        Scale::In(release)
    } else {
        Scale::Hold
    }
}

/// The maximum of a value over a trailing window of virtual time (monotonic deque:
/// amortised O(1) per sample).
#[derive(Debug, Clone, Default)]
pub struct PeakTracker {
    window: Millis,
    samples: VecDeque<(Millis, u32)>,
}

impl PeakTracker {
    /// A tracker over the last `window` ms.
    pub fn new(window: Millis) -> Self {
        Self { window, samples: VecDeque::new() }
    }

    /// Records `value` at `now` (times must not go backwards).
    pub fn record(&mut self, now: Millis, value: u32) {
        while self.samples.back().is_some_and(|&(_, v)| v <= value) {
            self.samples.pop_back();
        }
        self.samples.push_back((now, value));
        self.expire(now);
    }

    fn expire(&mut self, now: Millis) {
        while self.samples.len() > 1 && self.samples.front().is_some_and(|&(t, _)| now.saturating_sub(t) > self.window)
        {
            self.samples.pop_front();
        }
    }

    /// The peak over the window ending at `now` (the last value recorded counts
    /// until a later one replaces it).
    pub fn peak(&mut self, now: Millis) -> u32 {
        self.expire(now);
        self.samples.front().map_or(0, |&(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prop::cases;

    #[test]
    fn paper_rule_matches_their_formula() {
        let r = PaperRule::default();
        // 100 committed GPUs on 8-GPU hosts: out to ⌈105 / 8⌉ = 14, in above ⌈110 / 8⌉ = 14.
        assert_eq!(paper(&r, 10, 100, 8), Scale::Out(4));
        assert_eq!(paper(&r, 14, 100, 8), Scale::Hold);
        assert_eq!(paper(&r, 20, 100, 8), Scale::In(2), "at most two a step");
        assert_eq!(paper(&r, 15, 100, 8), Scale::In(1));
        // An idle cluster keeps min + buffer hosts.
        assert_eq!(paper(&r, 0, 0, 8), Scale::Out(6));
        assert_eq!(paper(&r, 7, 0, 8), Scale::In(1));
    }

    #[test]
    fn ours_keeps_spare_free_hosts_placement_and_the_peak() {
        let r = OursRule { spare_hosts: 2, ..OursRule::default() };
        assert_eq!(ours(&r, 10, 0, 80, 0, 6.0, 8), Scale::Out(2), "two whole hosts free");
        assert_eq!(ours(&r, 10, 1, 80, 0, 6.0, 8), Scale::Out(1));
        assert_eq!(ours(&r, 12, 2, 80, 0, 6.0, 8), Scale::Hold);
        assert_eq!(ours(&r, 15, 5, 80, 0, 6.0, 8), Scale::In(2), "at most two a step");
        assert_eq!(ours(&r, 13, 5, 88, 0, 6.0, 8), Scale::Hold, "the recent peak needs 11 + 2");
        // 480 subscribed GPUs at ratio 6 need 10 hosts, free or not.
        assert_eq!(ours(&r, 6, 6, 0, 480, 6.0, 8), Scale::Out(4));
        assert_eq!(ours(&r, 0, 0, 0, 0, 6.0, 8), Scale::Out(3), "the minimum");
    }

    #[test]
    fn property_targets_are_stable_and_cover_demand() {
        cases(500, |g| {
            let per = [1, 2, 4, 8][g.u32(0, 3) as usize];
            let c = g.u32(0, 2_000);
            let hosts = g.u32(0, 600);
            let r = PaperRule::default();
            // After applying a decision, the rule holds (no flapping).
            let after = match paper(&r, hosts, c, per) {
                Scale::Out(n) => hosts + n,
                Scale::In(n) => hosts - n,
                Scale::Hold => hosts,
            };
            if let Scale::Out(_) = paper(&r, hosts, c, per) {
                assert_eq!(paper(&r, after, c, per), Scale::Hold);
            }
            assert!(!matches!(paper(&r, after, c, per), Scale::Out(_)), "never out right after acting");
            let o = OursRule { spare_hosts: g.u32(0, 3), min_hosts: 3, max_release: g.u32(1, 4) };
            let sub = g.u32(0, 5_000);
            let ratio = f64::from(g.u32(1, 8));
            let free = g.u32(0, hosts);
            match ours(&o, hosts, free, c, sub, ratio, per) {
                Scale::Out(n) => {
                    // Booting hosts are free: after acting, the spare and placement are covered.
                    let (h, f) = (hosts + n, free + n);
                    assert!(f >= o.spare_hosts);
                    assert!(f64::from(h) * f64::from(per) * ratio + 1e-6 >= f64::from(sub), "placement fits");
                    assert!(h >= o.min_hosts);
                    assert!(!matches!(ours(&o, h, f, c, sub, ratio, per), Scale::Out(_)));
                }
                Scale::In(n) => {
                    // Only free hosts beyond the spare go, never below the peak or placement.
                    assert!(n <= o.max_release && free - n >= o.spare_hosts);
                    let h = hosts - n;
                    assert!(u64::from(h) * u64::from(per) >= u64::from(c), "the peak still fits");
                    assert!(f64::from(h) * f64::from(per) * ratio + 1e-6 >= f64::from(sub));
                }
                Scale::Hold => {}
            }
        });
    }

    #[test]
    fn peak_tracker_keeps_the_window_max() {
        let mut p = PeakTracker::new(100);
        p.record(0, 5);
        p.record(10, 3);
        p.record(20, 9);
        p.record(30, 1);
        assert_eq!(p.peak(30), 9);
        assert_eq!(p.peak(120), 9);
        assert_eq!(p.peak(121), 1, "9 left the window; the last value stands");
        cases(200, |g| {
            let w = g.range(1, 50);
            let mut p = PeakTracker::new(w);
            let mut all: Vec<(u64, u32)> = Vec::new();
            let mut now = 0;
            for _ in 0..60 {
                now += g.range(0, 20);
                let v = g.u32(0, 100);
                p.record(now, v);
                all.push((now, v));
                let want = all
                    .iter()
                    .enumerate()
                    .filter(|(i, (t, _))| now - t <= w || *i == all.len() - 1)
                    .map(|(_, (_, v))| *v)
                    .max()
                    .unwrap_or(0);
                assert_eq!(p.peak(now), want);
            }
        });
    }
}
