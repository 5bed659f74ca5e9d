//! The `notebookos` policy's parameters, as one value: what `notebookosd` runs and what
//! `nbos sim` simulates. [`PolicyConfig::default`] IS the shipped default: the daemon's
//! config defaults (`[gpu]`, `[kernel]`, `[cluster]`, `[autoscale]`) take their values
//! from it, and `packaging/notebookosd.toml` must equal them (a daemon test checks).

use crate::Millis;

/// `autoscale.rule`: which scaling rule the autoscaler applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AutoscaleRule {
    /// Ours ([`crate::scale::ours`]): whole spare hosts above the recent demand peak.
    Notebookos,
    /// NotebookOS's ([`crate::scale::paper`]): committed GPUs times a factor, plus a buffer.
    Paper,
}

/// The autoscaler's parameters (`[autoscale]` less the provider's own settings).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct AutoscaleParams {
    /// The rule.
    pub rule: AutoscaleRule,
    /// Never fewer live hosts than this.
    pub min_hosts: u32,
    /// Never more hosts than this, booting ones included.
    pub max_hosts: u32,
    /// How often the autoscaler decides.
    pub interval_ms: Millis,
    /// `notebookos` rule: whole hosts kept free.
    pub spare_hosts: u32,
    /// `notebookos` rule: the window of the peak of committed plus waiting GPUs.
    pub peak_window_ms: Millis,
    /// `paper` rule: scale out to committed GPUs × this.
    pub scale_out_factor: f64,
    /// `paper` rule: scale in while hosts exceed committed GPUs × this.
    pub scale_in_limit: f64,
    /// `paper` rule: hosts kept above `min_hosts`.
    pub buffer_hosts: u32,
    /// Hosts released per decision at most.
    pub max_release: u32,
}

impl Default for AutoscaleParams {
    /// The `notebookos` rule with one spare host over a 30-minute peak: the point of
    /// `nbos sim --sweep` shipped (docs/simulator.md, "Defaults from evidence"). The
    /// paper rule keeps NotebookOS's anchors (factor 1.05, limit 1.1, 3 hosts of buffer);
    /// both decide every 30 s and release 2 hosts a step at most.
    fn default() -> Self {
        Self {
            rule: AutoscaleRule::Notebookos,
            min_hosts: 3,
            max_hosts: 64,
            interval_ms: 30_000,
            spare_hosts: 1,
            peak_window_ms: 1_800_000,
            scale_out_factor: 1.05,
            scale_in_limit: 1.1,
            buffer_hosts: 3,
            max_release: 2,
        }
    }
}

/// The `notebookos` policy's parameters.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct PolicyConfig {
    /// Subscribed replica GPUs per host GPU that placement and migration keep
    /// (`gpu.subscription_ratio`).
    pub subscription_ratio: f64,
    /// Idle-held GPUs are released this long after a cell (`gpu.idle_release`).
    pub idle_release_ms: Millis,
    /// Replicas per kernel, each on a distinct host (`cluster.replicas`).
    pub replicas: u32,
    /// Pre-warmed kernel processes kept per host when none is taken (`kernel.prewarm_min`).
    pub prewarm_min: u32,
    /// Most pre-warmed kernel processes per host; 0: no pool (`kernel.prewarm_max`).
    pub prewarm_max: u32,
    /// The autoscaler (`[autoscale]`).
    pub autoscale: AutoscaleParams,
    /// Cells waiting for GPUs go in fair-share order ([`crate::fairshare`]) rather than
    /// first come first served (`gpu.fair_share`; with one user the two are the same).
    pub fair_share: bool,
    /// Users' recent GPU time halves every this long (`gpu.fair_share_half_life`).
    pub fair_share_half_life_ms: Millis,
    /// With fair share, a user over their share leaves free the GPUs an idle kernel of a
    /// user within theirs asks ([`crate::fairshare::headroom`], `gpu.fair_share_headroom`).
    pub fair_share_headroom: bool,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            // The sweep's point (docs/simulator.md): at 3 the free hosts fill with replicas
            // and a month costs more than reservation; above 10 nothing changes.
            subscription_ratio: 10.0,
            idle_release_ms: 30_000,
            replicas: 3,
            // NotebookOS keeps 3 per host; ours keeps 1 when nothing is taken and grows
            // to 3 with demand (crate::prewarm).
            prewarm_min: 1,
            prewarm_max: 3,
            autoscale: AutoscaleParams::default(),
            fair_share: true,
            fair_share_half_life_ms: crate::fairshare::DEFAULT_HALF_LIFE_MS,
            // Off: without a flood it costs the light users' p99 (docs/simulator.md).
            fair_share_headroom: false,
        }
    }
}
