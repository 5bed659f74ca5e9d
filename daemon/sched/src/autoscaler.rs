//! What the autoscaler does now, from the cluster as it is seen at one decision: the
//! configured rule ([`scale::ours`] or [`scale::paper`]), with unmet demand counted and
//! the result kept within `[min_hosts, max_hosts]`. The daemon's meta leader and the
//! simulator's `notebookos` both decide with this [`Decider`].

use crate::policy::{AutoscaleParams, AutoscaleRule};
use crate::scale::{self, OursRule, PaperRule, PeakTracker, Scale};
use crate::Millis;

/// The cluster at one decision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterNow {
    /// Live hosts that are not draining or being released.
    pub hosts: u32,
    /// Hosts asked for that have not registered yet.
    pub booting: u32,
    /// Live hosts with no GPU committed to a cell.
    pub free_hosts: u32,
    /// GPUs committed to cells.
    pub committed_gpus: u32,
    /// GPUs subscribed by every replica (and moving replica) of every kernel.
    pub subscribed_gpus: u32,
    /// GPUs per host (the largest live host's).
    pub gpus_per_host: u32,
    /// The largest subscription (GPUs × replicas) placement refused recently.
    pub refused_subscription: u32,
    /// The largest cell that recently found no host.
    pub waiting_gpus: u32,
}

/// The rule with its state (the peak of demand over its window).
#[derive(Debug)]
pub struct Decider {
    rule: AutoscaleRule,
    ours: OursRule,
    paper: PaperRule,
    peak: PeakTracker,
    min_hosts: u32,
    max_hosts: u32,
}

impl Decider {
    /// The rule `params` names.
    pub fn new(params: &AutoscaleParams) -> Self {
        Self {
            rule: params.rule,
            ours: OursRule {
                spare_hosts: params.spare_hosts,
                min_hosts: params.min_hosts,
                max_release: params.max_release,
            },
            paper: PaperRule {
                factor: params.scale_out_factor,
                limit: params.scale_in_limit,
                buffer: params.buffer_hosts,
                min_hosts: params.min_hosts,
                max_release: params.max_release,
            },
            peak: PeakTracker::new(params.peak_window_ms),
            min_hosts: params.min_hosts,
            max_hosts: params.max_hosts,
        }
    }

    /// The decision at `now` (ms on a monotonic clock); `ratio` is the subscription ratio.
    pub fn decide(&mut self, now: Millis, c: &ClusterNow, ratio: f64) -> Scale {
        let demand = c.committed_gpus.saturating_add(c.waiting_gpus);
        self.peak.record(now, demand);
        if c.gpus_per_host == 0 {
            return Scale::Hold; // no GPU host to size by (yet)
        }
        let hosts = c.hosts.saturating_add(c.booting);
        let decided = match self.rule {
            AutoscaleRule::Notebookos => scale::ours(
                &self.ours,
                hosts,
                c.free_hosts.saturating_add(c.booting),
                self.peak.peak(now),
                c.subscribed_gpus.saturating_add(c.refused_subscription),
                ratio,
                c.gpus_per_host,
            ),
            AutoscaleRule::Paper => scale::paper(&self.paper, hosts, demand, c.gpus_per_host),
        };
        // Work that found no host asks for one more whatever the rule says (once at a time).
        let unmet = c.refused_subscription > 0 || c.waiting_gpus > 0;
        let decided = match decided {
            Scale::Out(_) => decided,
            _ if unmet && c.booting == 0 => Scale::Out(1),
            Scale::In(_) if unmet => Scale::Hold,
            other => other,
        };
        match decided {
            Scale::Out(n) => match n.min(self.max_hosts.saturating_sub(hosts)) {
                0 => Scale::Hold,
                n => Scale::Out(n),
            },
            // Only live hosts are released, never below the minimum, never while hosts boot.
            Scale::In(n) if c.booting == 0 => match n.min(c.hosts.saturating_sub(self.min_hosts)) {
                0 => Scale::Hold,
                n => Scale::In(n),
            },
            _ => Scale::Hold,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(rule: AutoscaleRule) -> AutoscaleParams {
        AutoscaleParams {
            rule,
            min_hosts: 3,
            max_hosts: 5,
            spare_hosts: 1,
            buffer_hosts: 0,
            ..AutoscaleParams::default()
        }
    }

    fn idle(hosts: u32) -> ClusterNow {
        ClusterNow { hosts, free_hosts: hosts, gpus_per_host: 1, ..ClusterNow::default() }
    }

    #[test]
    fn refused_kernels_and_waiting_cells_scale_out_within_max_hosts() {
        for rule in [AutoscaleRule::Notebookos, AutoscaleRule::Paper] {
            let mut d = Decider::new(&params(rule));
            assert_eq!(d.decide(0, &idle(3), 3.0), Scale::Hold, "{rule:?}: an idle minimum cluster stays");
            let refused = ClusterNow { subscribed_gpus: 9, refused_subscription: 3, ..idle(3) };
            assert!(matches!(d.decide(1, &refused, 3.0), Scale::Out(_)), "{rule:?}");
            let booting = ClusterNow { booting: 1, ..refused.clone() };
            assert_eq!(d.decide(2, &booting, 3.0), Scale::Hold, "{rule:?}: one host boots already");
            let full = ClusterNow { hosts: 5, ..refused };
            assert_eq!(d.decide(3, &full, 3.0), Scale::Hold, "{rule:?}: max_hosts");
            let waiting = ClusterNow { committed_gpus: 3, free_hosts: 0, waiting_gpus: 1, ..idle(3) };
            assert!(matches!(d.decide(4, &waiting, 3.0), Scale::Out(_)), "{rule:?}");
        }
    }

    #[test]
    fn idle_hosts_go_back_to_the_minimum_once_demand_is_gone() {
        let mut p = params(AutoscaleRule::Notebookos);
        p.peak_window_ms = 10;
        let mut d = Decider::new(&p);
        let busy = ClusterNow {
            hosts: 5,
            free_hosts: 1,
            committed_gpus: 4,
            subscribed_gpus: 12,
            gpus_per_host: 1,
            ..ClusterNow::default()
        };
        assert_eq!(d.decide(0, &busy, 3.0), Scale::Hold);
        // Kernels gone: after the peak window, release down to min_hosts (max_release a step).
        assert_eq!(d.decide(100, &idle(5), 3.0), Scale::In(2));
        assert_eq!(d.decide(200, &idle(4), 3.0), Scale::In(1));
        assert_eq!(d.decide(300, &idle(3), 3.0), Scale::Hold);
        let booting = ClusterNow { booting: 1, ..idle(5) };
        assert_eq!(d.decide(400, &booting, 3.0), Scale::Hold, "never release while hosts boot");
    }
}
