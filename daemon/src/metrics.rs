//! Prometheus metrics of the daemon. Every name starts with `notebookos_` and
//! carries its unit.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Appends `registry`'s metrics to an OpenMetrics exposition (before its `# EOF`): for
/// parts of the daemon that keep their own registry.
pub fn append_registry(registry: &Registry, exposition: &mut String) {
    let mut mine = String::new();
    if let Err(e) = encode(&mut mine, registry) {
        tracing::error!(error = %e, "encoding metrics failed");
        return;
    }
    append_exposition(&mine, exposition);
}

/// Appends another component's encoded exposition (e.g. the raft store's) before the final
/// `# EOF` of `exposition`.
pub fn append_exposition(other: &str, exposition: &mut String) {
    let body = other.strip_suffix("# EOF\n").unwrap_or(other);
    match exposition.rfind("# EOF") {
        Some(at) => exposition.insert_str(at, body),
        None => exposition.push_str(body),
    }
}

/// Labels of `notebookos_build_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// Daemon version.
    pub version: String,
    /// Host name.
    pub node: String,
}

/// Labels of `notebookos_http_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    /// Route template, e.g. `/api/v1/status`.
    pub route: String,
    /// Status code.
    pub code: u16,
}

/// Labels of `notebookos_messages_dropped_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropLabels {
    /// Who sent it: `websocket`, `kernel`, `proxy`.
    pub source: String,
    /// Why: `bad_signature`, `malformed_json`, `too_large`, …
    pub reason: String,
}

/// Labels of `notebookos_refused_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    /// Which cap or check refused it: `websocket_message_too_large`, `kernels_total`,
    /// `object_corrupt`, … (see docs/configuration.md, `[limits]`).
    pub reason: String,
}

/// Requests, connections and objects refused at a cap or a check, by reason. One
/// process-wide family because the places that refuse (the object store, the cluster
/// API, the WebSocket relay) do not all hold the daemon's [`Metrics`]; every
/// [`Metrics`] registers it.
static REFUSED: std::sync::LazyLock<Family<RefusedLabels, Counter>> = std::sync::LazyLock::new(Family::default);

/// Counts one refusal in `notebookos_refused_total{reason}`.
pub fn count_refusal(reason: &str) {
    REFUSED.get_or_create(&RefusedLabels { reason: reason.to_owned() }).inc();
}

/// `notebookos_refused_total{reason}` so far (for tests of the refusing code).
pub fn refusal_count(reason: &str) -> u64 {
    REFUSED.get_or_create(&RefusedLabels { reason: reason.to_owned() }).get()
}

/// Labels of `notebookos_http_auth_refusals_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AuthRefusalLabels {
    /// `no_credential`, `wrong_token`, `not_a_node`, `not_an_operator`, `tls_handshake`
    /// (a client certificate from another CA, or not TLS at all), `tls_handshake_timeout`.
    pub reason: String,
}

/// HTTP requests refused by authentication, by reason. Process-wide, because both the
/// gateway's and the cluster API's checks refuse.
static AUTH_REFUSALS: std::sync::LazyLock<Family<AuthRefusalLabels, Counter>> =
    std::sync::LazyLock::new(Family::default);

/// Counts one refusal in `notebookos_http_auth_refusals_total{reason}`.
pub fn count_auth_refusal(reason: &str) {
    AUTH_REFUSALS.get_or_create(&AuthRefusalLabels { reason: reason.to_owned() }).inc();
}

/// Labels of `notebookos_kernels`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// Execution state (`idle`, `busy`, `starting`, `dead`, …).
    pub state: String,
}

/// Labels of `notebookos_cells_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `ok`, `error`, `aborted`, `rejected` (could never get its GPUs).
    pub outcome: String,
}

/// Labels of `notebookos_prewarm_takes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PrewarmTakeLabels {
    /// `hit` (a ready process), `warming` (one still importing), `empty` (none left: a
    /// new Python), `mismatch` (the kernel needs another account or environment).
    pub result: String,
}

/// Labels of `notebookos_prewarm_rejected_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PrewarmRejectLabels {
    /// Why a pool process was killed instead of becoming a kernel: `stopped`, `traced`,
    /// `exited`, `unresponsive` (no answer to the hand-over's ping), `not_up` (handed its
    /// kernel, ipykernel did not come up), `not_switched` (`kernel.run_as = "owner"`: up
    /// but not exactly its owner's account without capabilities).
    pub reason: String,
}

/// The daemon's metrics and their registry.
pub struct Metrics {
    registry: Registry,
    /// Always 1; the labels say what is running.
    pub build_info: Family<BuildLabels, Gauge>,
    /// GPUs on this host.
    pub gpus_total: Gauge,
    /// HTTP requests served, by route and status code.
    pub http_requests_total: Family<HttpLabels, Counter>,
    /// Requests refused for a missing or wrong token.
    pub http_auth_failures_total: Counter,
    /// Messages dropped, by source and reason.
    pub messages_dropped_total: Family<DropLabels, Counter>,
    /// Kernels started.
    pub kernels_started_total: Counter,
    /// Kernel processes that died on their own.
    pub kernel_deaths_total: Counter,
    /// Kernels restarted by the daemon after their process died.
    pub kernel_auto_restarts_total: Counter,
    /// Heartbeats a kernel did not answer in time.
    pub kernel_heartbeat_failures_total: Counter,
    /// Kernels by execution state (set when scraped).
    pub kernels: Family<StateLabels, Gauge>,
    /// Cells (execute requests) finished, by outcome.
    pub cells_total: Family<OutcomeLabels, Counter>,
    /// Submit (execute_request received) to start of execution (execute_input), seconds.
    pub interactivity_delay_seconds: Histogram,
    /// Cells waiting for GPUs right now.
    pub cells_waiting_for_gpus: Gauge,
    /// GPUs committed to running cells.
    pub gpus_committed: Gauge,
    /// GPUs idle-held after a cell, until `idle_release` or another kernel needs them.
    pub gpus_idle_held: Gauge,
    /// GPUs taken back from kernels (idle release or preemption).
    pub gpu_revocations_total: Counter,
    /// GPUs requested by hosted kernels divided by GPUs on the host.
    pub subscription_ratio: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// Bytes free (to the daemon) on the filesystem of `node.state_dir`, read when scraped.
    pub state_dir_free_bytes: Gauge,
    /// `notebookos_prewarm_pool_processes{state="ready|warming"}`
    pub prewarm_pool_processes: Family<StateLabels, Gauge>,
    /// `notebookos_prewarm_takes_total`
    pub prewarm_takes_total: Family<PrewarmTakeLabels, Counter>,
    /// `notebookos_prewarm_started_total`
    pub prewarm_started_total: Counter,
    /// `notebookos_prewarm_rejected_total{reason}`
    pub prewarm_rejected_total: Family<PrewarmRejectLabels, Counter>,
    /// Host memory this host's kernels use now, measured (cluster hosts, at each load report).
    pub host_memory_replicas_bytes: Gauge,
    /// Host memory this host's kernels may use together (`cluster.kernel_memory_mib`).
    pub host_memory_replicas_capacity_bytes: Gauge,
}

impl Metrics {
    /// Creates and registers the metrics.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let build_info = Family::<BuildLabels, Gauge>::default();
        let gpus_total = Gauge::default();
        let http_requests_total = Family::<HttpLabels, Counter>::default();
        let http_auth_failures_total = Counter::default();
        registry.register("notebookos_build_info", "Build and host of this daemon (always 1)", build_info.clone());
        registry.register("notebookos_gpus", "GPUs on this host", gpus_total.clone());
        registry.register("notebookos_http_requests", "HTTP requests served", http_requests_total.clone());
        registry.register(
            "notebookos_http_auth_failures",
            "HTTP requests refused for a missing or wrong token",
            http_auth_failures_total.clone(),
        );
        let messages_dropped_total = Family::<DropLabels, Counter>::default();
        registry.register(
            "notebookos_messages_dropped",
            "Jupyter messages dropped (bad HMAC, malformed, too large), by source and reason",
            messages_dropped_total.clone(),
        );
        let kernels_started_total = Counter::default();
        registry.register("notebookos_kernels_started", "Kernels started", kernels_started_total.clone());
        let kernel_deaths_total = Counter::default();
        registry.register(
            "notebookos_kernel_deaths",
            "Kernel processes that exited without being asked to",
            kernel_deaths_total.clone(),
        );
        let kernel_auto_restarts_total = Counter::default();
        registry.register(
            "notebookos_kernel_auto_restarts",
            "Kernel processes started again by the daemon after the kernel's process died",
            kernel_auto_restarts_total.clone(),
        );
        let kernel_heartbeat_failures_total = Counter::default();
        registry.register(
            "notebookos_kernel_heartbeat_failures",
            "Heartbeats a kernel did not answer in time",
            kernel_heartbeat_failures_total.clone(),
        );
        let kernels = Family::<StateLabels, Gauge>::default();
        registry.register("notebookos_kernels", "Kernels hosted, by execution state", kernels.clone());
        let cells_total = Family::<OutcomeLabels, Counter>::default();
        registry.register("notebookos_cells", "Cells finished, by outcome", cells_total.clone());
        let interactivity_delay_seconds = Histogram::new(exponential_buckets(0.000_25, 2.0, 20));
        registry.register(
            "notebookos_interactivity_delay_seconds",
            "Time from a cell's submission to the start of its execution",
            interactivity_delay_seconds.clone(),
        );
        let cells_waiting_for_gpus = Gauge::default();
        registry.register(
            "notebookos_cells_waiting_for_gpus",
            "Cells queued until their GPUs can be committed",
            cells_waiting_for_gpus.clone(),
        );
        let gpus_committed = Gauge::default();
        registry.register("notebookos_gpus_committed", "GPUs committed to running cells", gpus_committed.clone());
        let gpus_idle_held = Gauge::default();
        registry.register("notebookos_gpus_idle_held", "GPUs idle-held after a cell", gpus_idle_held.clone());
        let gpu_revocations_total = Counter::default();
        registry.register(
            "notebookos_gpu_revocations",
            "GPUs taken back from kernels (idle release or preemption)",
            gpu_revocations_total.clone(),
        );
        let subscription_ratio = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "notebookos_subscription_ratio",
            "GPUs requested by hosted kernels / GPUs on this host",
            subscription_ratio.clone(),
        );
        let state_dir_free_bytes = Gauge::default();
        registry.register(
            "notebookos_state_dir_free_bytes",
            "Bytes available on the filesystem of node.state_dir (the raft log stops the host when it cannot write)",
            state_dir_free_bytes.clone(),
        );
        registry.register(
            "notebookos_http_auth_refusals",
            "HTTP requests refused by authentication, by reason",
            AUTH_REFUSALS.clone(),
        );
        registry.register(
            "notebookos_refused",
            "Requests, connections and objects refused at a cap or a check, by reason",
            REFUSED.clone(),
        );
        let prewarm_pool_processes = Family::<StateLabels, Gauge>::default();
        registry.register(
            "notebookos_prewarm_pool_processes",
            "Pre-warmed kernel processes waiting to be taken over, ready or still importing",
            prewarm_pool_processes.clone(),
        );
        let prewarm_takes_total = Family::<PrewarmTakeLabels, Counter>::default();
        registry.register(
            "notebookos_prewarm_takes",
            "Kernel starts that asked the pre-warm pool, by result",
            prewarm_takes_total.clone(),
        );
        let prewarm_started_total = Counter::default();
        registry.register(
            "notebookos_prewarm_started",
            "Pre-warmed kernel processes started",
            prewarm_started_total.clone(),
        );
        let prewarm_rejected_total = Family::<PrewarmRejectLabels, Counter>::default();
        registry.register(
            "notebookos_prewarm_rejected",
            "Pre-warmed kernel processes killed instead of handed a kernel (stopped, traced, not answering), by reason",
            prewarm_rejected_total.clone(),
        );
        let host_memory_replicas_bytes = Gauge::default();
        registry.register(
            "notebookos_host_memory_replicas_bytes",
            "Host memory this host's kernels use now: each kernel's memory cgroup usage, else its process tree's RSS",
            host_memory_replicas_bytes.clone(),
        );
        let host_memory_replicas_capacity_bytes = Gauge::default();
        registry.register(
            "notebookos_host_memory_replicas_capacity_bytes",
            "Host memory this host's kernels may use together; placement puts no replica here past it (0: not accounted)",
            host_memory_replicas_capacity_bytes.clone(),
        );
        Self {
            registry,
            build_info,
            gpus_total,
            http_requests_total,
            http_auth_failures_total,
            messages_dropped_total,
            kernels_started_total,
            kernel_deaths_total,
            kernel_auto_restarts_total,
            kernel_heartbeat_failures_total,
            kernels,
            cells_total,
            interactivity_delay_seconds,
            cells_waiting_for_gpus,
            gpus_committed,
            gpus_idle_held,
            gpu_revocations_total,
            subscription_ratio,
            state_dir_free_bytes,
            prewarm_pool_processes,
            prewarm_takes_total,
            prewarm_started_total,
            prewarm_rejected_total,
            host_memory_replicas_bytes,
            host_memory_replicas_capacity_bytes,
        }
    }

    /// The registry, for components that register their own metrics at start-up.
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// Renders the OpenMetrics text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail; an encoding error would be a bug in a metric type.
        if let Err(e) = encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "encoding metrics failed");
        }
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_prefixed_names_and_values() {
        let m = Metrics::new();
        m.gpus_total.set(2);
        m.build_info.get_or_create(&BuildLabels { version: "0.1.0".into(), node: "h1".into() }).set(1);
        m.http_requests_total.get_or_create(&HttpLabels { route: "/healthz".into(), code: 200 }).inc();
        let text = m.render();
        assert!(text.contains("notebookos_gpus 2"), "{text}");
        assert!(text.contains("notebookos_build_info{version=\"0.1.0\",node=\"h1\"} 1"), "{text}");
        assert!(text.contains("notebookos_http_requests_total{route=\"/healthz\",code=\"200\"} 1"), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }
}
