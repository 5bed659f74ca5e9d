//! GPUs bound over time: every `period`, each host's `notebookos_gpus_committed` and
//! `notebookos_gpus_idle_held` gauges from `/metrics`, summed over the hosts. A thread of
//! its own (blocking HTTP), stopped by the replay when the workload is done.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::clock::unix_us_now;
use super::cluster::ReplayCluster;

/// One sample of the whole cluster.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// When it was taken (after every host answered), µs since the Unix epoch.
    pub unix_us: u64,
    /// GPUs committed to running cells.
    pub committed: f64,
    /// GPUs idle-held after a cell.
    pub idle_held: f64,
}

/// The sum over a metric's series (every label set) in an OpenMetrics text, `None` when
/// the text has no such metric.
pub fn metric_sum(text: &str, selector: &str) -> Option<f64> {
    // `name{k="v",…}` selects the series whose labels include every `k="v"` given.
    let (name, wanted) = match selector.split_once('{') {
        Some((n, rest)) => (n, rest.trim_end_matches('}').split(',').filter(|l| !l.is_empty()).collect::<Vec<_>>()),
        None => (selector, Vec::new()),
    };
    let mut found = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else { continue };
        // The name must end here: `notebookos_gpus` is not `notebookos_gpus_committed`.
        let (labels, rest) = match rest.chars().next() {
            Some('{') => rest[1..].split_once('}').unwrap_or(("", "")),
            Some(' ') => ("", rest),
            _ => continue,
        };
        if !wanted.iter().all(|w| labels.split(',').any(|l| l == *w)) {
            continue;
        }
        if let Some(v) = rest.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) {
            found = Some(found.unwrap_or(0.0) + v);
        }
    }
    found
}

/// Samples until [`Sampler::stop`].
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(Vec<Sample>, usize)>,
}

impl Sampler {
    /// Starts sampling `target`'s hosts every `period`.
    pub fn start(target: Arc<ReplayCluster>, period: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut samples = Vec::new();
            let mut last = vec![(0.0, 0.0); target.hosts.len()];
            let mut misses = 0;
            while !flag.load(Ordering::Relaxed) {
                let due = std::time::Instant::now() + period;
                for (i, prev) in last.iter_mut().enumerate() {
                    // A host that does not answer keeps its last values (counted as a miss).
                    match target.metrics(i) {
                        Ok(text) => {
                            *prev = (
                                metric_sum(&text, "notebookos_gpus_committed").unwrap_or(0.0),
                                metric_sum(&text, "notebookos_gpus_idle_held").unwrap_or(0.0),
                            );
                        }
                        Err(e) => {
                            misses += 1;
                            tracing::debug!(host = target.hosts[i].node_id, error = %format!("{e:#}"), "no sample");
                        }
                    }
                }
                samples.push(Sample {
                    unix_us: unix_us_now(),
                    committed: last.iter().map(|v| v.0).sum(),
                    idle_held: last.iter().map(|v| v.1).sum(),
                });
                std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
            }
            (samples, misses)
        });
        Self { stop, thread }
    }

    /// Stops; returns the samples in time order and how many host reads failed.
    pub fn stop(self) -> (Vec<Sample>, usize) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// GPU-µs (committed, bound) of the samples between `from` and `to` (µs since the epoch):
/// each sample's values hold until the next one (left Riemann sum).
pub fn integrate(samples: &[Sample], from: u64, to: u64) -> (f64, f64) {
    let (mut committed, mut bound) = (0.0, 0.0);
    for (i, s) in samples.iter().enumerate() {
        let start = s.unix_us.max(from);
        let end = samples.get(i + 1).map_or(to, |n| n.unix_us).min(to);
        if end > start {
            #[expect(clippy::cast_precision_loss, reason = "microseconds of a replay")]
            let dt = (end - start) as f64;
            committed += s.committed * dt;
            bound += (s.committed + s.idle_held) * dt;
        }
    }
    (committed, bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sums_match_whole_names_over_label_sets() {
        let text = "# TYPE notebookos_gpus gauge\nnotebookos_gpus 8\nnotebookos_gpus_committed 2\n\
                    notebookos_migrations_total{reason=\"a\"} 1\nnotebookos_migrations_total{reason=\"b\"} 2\n";
        assert_eq!(metric_sum(text, "notebookos_gpus"), Some(8.0));
        assert_eq!(metric_sum(text, "notebookos_gpus_committed"), Some(2.0));
        assert_eq!(metric_sum(text, "notebookos_migrations_total"), Some(3.0));
        assert_eq!(metric_sum(text, "notebookos_migrations_total{reason=\"b\"}"), Some(2.0));
        assert_eq!(metric_sum(text, "notebookos_migrations_total{reason=\"c\"}"), None);
        assert_eq!(metric_sum(text, "notebookos_scale_outs_total"), None);
    }

    #[test]
    fn integration_holds_each_sample_until_the_next_within_the_window() {
        let s = |unix_us, committed, idle_held| Sample { unix_us, committed, idle_held };
        let samples = [s(0, 1.0, 0.0), s(10, 2.0, 1.0), s(20, 0.0, 0.0)];
        assert_eq!(integrate(&samples, 0, 30), (10.0 + 20.0, 10.0 + 30.0));
        assert_eq!(integrate(&samples, 5, 15), (5.0 + 10.0, 5.0 + 15.0));
    }
}
