//! Prometheus metrics of the daemon. Every name starts with `notebookos_` and
//! carries its unit.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

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
        Self { registry, build_info, gpus_total, http_requests_total, http_auth_failures_total }
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
