//! `[autoscale]`: adding and releasing hosts through a provider (cluster mode).

use std::path::Path;
use std::time::Duration;

use nbos_sched::policy::{AutoscaleParams, PolicyConfig};
use serde::{Deserialize, Serialize};

use super::ConfigError;

/// `[autoscale]`: the meta leader adds hosts through a provider when kernels cannot be
/// placed, cells find no host to move to, or committed GPUs call for it, and releases idle
/// hosts (drained first) when they do not. Defaults are the NotebookOS anchors' (30 s
/// interval; the paper's rule: factor 1.05, limit 1.1, 3 hosts of buffer, 2 released a step).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AutoscaleConfig {
    /// `none` (never scale) or `exec` (run `command` with a JSON request on stdin).
    pub provider: AutoscaleProvider,
    /// The `exec` provider's program and arguments (an absolute program path).
    pub command: Vec<String>,
    /// `notebookos` (keep `spare_hosts` whole hosts free above the recent peak of demand)
    /// or `paper` (NotebookOS's committed-GPU rule with `scale_out_factor`, `scale_in_limit`,
    /// `buffer_hosts`).
    pub rule: AutoscaleRule,
    /// Never fewer live hosts than this (a kernel needs `cluster.replicas` hosts).
    pub min_hosts: u32,
    /// Never more hosts than this, booting ones included.
    pub max_hosts: u32,
    /// How often the meta leader decides.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// `notebookos` rule: whole hosts kept free.
    pub spare_hosts: u32,
    /// `notebookos` rule: the window over which the peak of committed plus waiting GPUs is kept.
    #[serde(with = "humantime_serde")]
    pub peak_window: Duration,
    /// `paper` rule: scale out to committed GPUs × this.
    pub scale_out_factor: f64,
    /// `paper` rule: scale in while hosts exceed committed GPUs × this.
    pub scale_in_limit: f64,
    /// `paper` rule: hosts kept above `min_hosts`.
    pub buffer_hosts: u32,
    /// Hosts released per decision at most.
    pub max_release: u32,
    /// A requested host that has not registered by then no longer counts as booting.
    #[serde(with = "humantime_serde")]
    pub boot_timeout: Duration,
    /// How long one provider command may run.
    #[serde(with = "humantime_serde")]
    pub command_timeout: Duration,
    /// How long a released host's replicas may take to move off it; past it the release is
    /// given up (the host's draining mark is withdrawn: it stays in service, replicas and all).
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// How long `POST /api/kernels` waits for a host when placement finds none (0: refuse at once).
    #[serde(with = "humantime_serde")]
    pub placement_wait: Duration,
}

/// `autoscale.provider`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AutoscaleProvider {
    /// No autoscaling.
    None,
    /// An external command (see `docs/autoscaling.md` for its JSON contract).
    Exec,
}

/// `autoscale.rule`: the scheduler core's (`nbos_sched::policy::AutoscaleRule`).
pub use nbos_sched::policy::AutoscaleRule;

impl Default for AutoscaleConfig {
    /// The rule's parameters are the scheduler core's policy default (`nbos_sched::policy`).
    fn default() -> Self {
        let p = PolicyConfig::default().autoscale;
        Self {
            provider: AutoscaleProvider::None,
            command: Vec::new(),
            rule: p.rule,
            min_hosts: p.min_hosts,
            max_hosts: p.max_hosts,
            interval: Duration::from_millis(p.interval_ms),
            spare_hosts: p.spare_hosts,
            peak_window: Duration::from_millis(p.peak_window_ms),
            scale_out_factor: p.scale_out_factor,
            scale_in_limit: p.scale_in_limit,
            buffer_hosts: p.buffer_hosts,
            max_release: p.max_release,
            boot_timeout: Duration::from_secs(600),
            command_timeout: Duration::from_secs(600),
            drain_timeout: Duration::from_secs(600),
            placement_wait: Duration::from_secs(300),
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl AutoscaleConfig {
    /// The rule's parameters as the scheduler core's autoscaler takes them.
    pub fn params(&self) -> AutoscaleParams {
        AutoscaleParams {
            rule: self.rule,
            min_hosts: self.min_hosts,
            max_hosts: self.max_hosts,
            interval_ms: millis(self.interval),
            spare_hosts: self.spare_hosts,
            peak_window_ms: millis(self.peak_window),
            scale_out_factor: self.scale_out_factor,
            scale_in_limit: self.scale_in_limit,
            buffer_hosts: self.buffer_hosts,
            max_release: self.max_release,
        }
    }

    /// `[autoscale]`: checked only when a provider is set; `cluster_enabled` is `cluster.enabled`.
    pub(super) fn validate(&self, cluster_enabled: bool, origin: &str) -> Result<(), ConfigError> {
        let invalid =
            |field: &'static str, reason: String| ConfigError::Invalid { origin: origin.to_owned(), field, reason };
        let a = self;
        if a.provider == AutoscaleProvider::None {
            return Ok(());
        }
        if !cluster_enabled {
            return Err(invalid("autoscale.provider", "needs a cluster ([cluster] enabled = true)".into()));
        }
        match a.command.first() {
            Some(p) if Path::new(p).is_absolute() => {}
            _ => {
                return Err(invalid(
                    "autoscale.command",
                    "the exec provider needs a command whose program is an absolute path".into(),
                ))
            }
        }
        if a.min_hosts > a.max_hosts || a.max_hosts == 0 {
            return Err(invalid(
                "autoscale.max_hosts",
                format!("must be at least 1 and autoscale.min_hosts ({}), got {}", a.min_hosts, a.max_hosts),
            ));
        }
        if a.drain_timeout.is_zero() {
            return Err(invalid("autoscale.drain_timeout", "must be more than 0".into()));
        }
        if a.interval < Duration::from_millis(100) {
            return Err(invalid("autoscale.interval", "must be at least 100ms".into()));
        }
        for (field, v) in
            [("autoscale.scale_out_factor", a.scale_out_factor), ("autoscale.scale_in_limit", a.scale_in_limit)]
        {
            if !(v.is_finite() && v > 0.0) {
                return Err(invalid(field, format!("must be a positive number, got {v}")));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::Config;
    use super::{AutoscaleProvider, AutoscaleRule};

    const CLUSTER: &str = "[cluster]\nenabled = true\nnode_id = 1\nraft_listen = \"127.0.0.1:7001\"\n";

    #[test]
    fn autoscaling_is_checked_when_a_provider_is_set() {
        let cluster = format!("{CLUSTER}seeds = [\"1=127.0.0.1:7001\"]\nobject_store = \"file:///srv/o\"\n");
        let exec = "[autoscale]\nprovider = \"exec\"\n";
        for (text, field) in [
            (exec.to_owned(), "autoscale.provider"),
            (format!("{cluster}{exec}"), "autoscale.command"),
            (format!("{cluster}{exec}command = [\"provider.sh\"]\n"), "autoscale.command"),
            (format!("{cluster}{exec}command = [\"/p\"]\nmin_hosts = 5\nmax_hosts = 4\n"), "autoscale.max_hosts"),
            (format!("{cluster}{exec}command = [\"/p\"]\ninterval = \"1ms\"\n"), "autoscale.interval"),
            (format!("{cluster}{exec}command = [\"/p\"]\ndrain_timeout = \"0s\"\n"), "autoscale.drain_timeout"),
            (format!("{cluster}{exec}command = [\"/p\"]\nscale_out_factor = 0.0\n"), "autoscale.scale_out_factor"),
            (format!("{cluster}{exec}command = [\"/p\"]\nrule = \"greedy\"\n"), "autoscale.rule"),
        ] {
            let err = Config::parse(&text, "t.toml").expect_err(&text);
            assert!(err.to_string().contains(field), "{text}: {err}");
        }
        let ok = Config::parse(
            &format!("{cluster}{exec}command = [\"/usr/lib/notebookos/provider\", \"--pool\", \"a\"]\n"),
            "t.toml",
        )
        .expect("a valid exec provider");
        assert_eq!(ok.autoscale.interval, Duration::from_secs(30), "the anchors' interval");
        assert_eq!(ok.autoscale.rule, AutoscaleRule::Notebookos, "the shipped rule");
        let none =
            Config::parse("[autoscale]\ncommand = [\"relative\"]\n", "t.toml").expect("provider none: unchecked");
        assert_eq!(none.autoscale.provider, AutoscaleProvider::None);
    }
}
