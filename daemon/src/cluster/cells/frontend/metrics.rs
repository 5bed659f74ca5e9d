//! The front-end's metrics: election rounds and latency, fail-overs, cells whose executor
//! died; in a registry of their own, appended to the daemon's exposition.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Metrics of the front-end.
#[derive(Debug, Clone)]
pub struct FrontendMetrics {
    /// Election rounds started (a cell takes one, more when replicas yield).
    pub election_rounds_total: Counter,
    /// Cell submitted at this gateway → its executor started it (first IOPub), seconds.
    pub election_latency_seconds: Histogram,
    /// Cells elected on another replica because the previous executor's host was down.
    pub cells_failed_over_total: Counter,
    /// Cells answered `ExecutorHostDied` (their executor's host died mid-cell).
    pub cells_executor_died_total: Counter,
}

impl Default for FrontendMetrics {
    fn default() -> Self {
        Self {
            election_rounds_total: Counter::default(),
            election_latency_seconds: Histogram::new(exponential_buckets(0.000_125, 2.0, 20)),
            cells_failed_over_total: Counter::default(),
            cells_executor_died_total: Counter::default(),
        }
    }
}

impl FrontendMetrics {
    /// Registers the metrics (names as exported, units in the names).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "notebookos_election_rounds",
            "Executor election rounds started by this front-end",
            self.election_rounds_total.clone(),
        );
        registry.register(
            "notebookos_election_latency_seconds",
            "Cell submitted at the gateway until its elected replica starts it",
            self.election_latency_seconds.clone(),
        );
        registry.register(
            "notebookos_cells_failed_over",
            "Cells elected on another replica because the previous executor's host was down",
            self.cells_failed_over_total.clone(),
        );
        registry.register(
            "notebookos_cells_executor_died",
            "Cells answered ExecutorHostDied because their executor's host died mid-cell",
            self.cells_executor_died_total.clone(),
        );
    }
}

/// The front-end's metrics in a registry of their own, rendered after the daemon's.
pub struct MetricsRegistry {
    registry: Registry,
}

impl MetricsRegistry {
    /// A registry holding `metrics`.
    pub fn new(metrics: &FrontendMetrics) -> Self {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        Self { registry }
    }

    /// Appends these metrics to an OpenMetrics exposition (before its `# EOF`).
    pub fn append_to(&self, exposition: &mut String) {
        crate::metrics::append_registry(&self.registry, exposition);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn front_end_metrics_go_before_the_eof_marker() {
        let m = FrontendMetrics::default();
        m.election_rounds_total.inc();
        m.election_latency_seconds.observe(0.002);
        let mut text = "# HELP x y\n# TYPE x counter\nx_total 1\n# EOF\n".to_owned();
        MetricsRegistry::new(&m).append_to(&mut text);
        assert!(text.ends_with("# EOF\n"));
        assert_eq!(text.matches("# EOF").count(), 1);
        assert!(text.contains("notebookos_election_rounds_total 1"));
        assert!(text.contains("notebookos_election_latency_seconds_count 1"));
        assert!(text.contains("notebookos_cells_failed_over_total 0"));
    }
}
