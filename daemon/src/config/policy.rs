//! The daemon's configuration as the scheduler core's `notebookos` policy
//! ([`PolicyConfig`]): what `nbos sim --config FILE` simulates.

use nbos_sched::policy::PolicyConfig;

use super::Config;

impl Config {
    /// The scheduling policy this configuration runs. `Config::default().policy()` is
    /// `PolicyConfig::default()` (the config defaults are taken from it).
    pub fn policy(&self) -> PolicyConfig {
        PolicyConfig {
            subscription_ratio: self.gpu.subscription_ratio,
            idle_release_ms: u64::try_from(self.gpu.idle_release.as_millis()).unwrap_or(u64::MAX),
            replicas: self.cluster.replicas,
            prewarm_min: self.kernel.prewarm_min,
            prewarm_max: self.kernel.prewarm_max,
            autoscale: self.autoscale.params(),
            fair_share: self.gpu.fair_share,
            fair_share_half_life_ms: u64::try_from(self.gpu.fair_share_half_life.as_millis()).unwrap_or(u64::MAX),
            fair_share_headroom: self.gpu.fair_share_headroom,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_the_policy_default_and_every_field_is_read() {
        assert_eq!(Config::default().policy(), PolicyConfig::default());
        let text =
            "[gpu]\nsubscription_ratio = 6.0\nidle_release = \"1m\"\nfair_share = false\nfair_share_half_life = \"2h\"\nfair_share_headroom = true\n[kernel]\nprewarm_min = 2\nprewarm_max = 5\n\
                    [autoscale]\nrule = \"notebookos\"\nspare_hosts = 2\npeak_window = \"20m\"\ninterval = \"10s\"\n";
        let p = Config::parse(text, "t.toml").expect("valid").policy();
        assert_eq!((p.subscription_ratio, p.idle_release_ms, p.prewarm_min, p.prewarm_max), (6.0, 60_000, 2, 5));
        assert_eq!((p.fair_share, p.fair_share_half_life_ms, p.fair_share_headroom), (false, 7_200_000, true));
        let a = p.autoscale;
        assert_eq!((a.spare_hosts, a.peak_window_ms, a.interval_ms), (2, 1_200_000, 10_000));
        assert_eq!(a.rule, nbos_sched::policy::AutoscaleRule::Notebookos);
    }
}
