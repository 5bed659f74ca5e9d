//! The cluster over time: every `period`, the hosts that are up (the cluster status: an
//! autoscaled cluster's hosts come and go), and each one's `notebookos_gpus_committed` and
//! `notebookos_gpus_idle_held` gauges and [`COUNTERS`] from `/metrics`, summed over the
//! hosts. A thread of its own (blocking HTTP), stopped by the replay when the workload is done.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::clock::unix_us_now;
use super::cluster::ReplayCluster;

/// Counters read from the hosts' `/metrics` as deltas over the replay (absent means 0):
/// completed replica moves to run a cell and off hosts being drained (the simulator's
/// `migrations` and `background_moves`), and hosts the autoscaler added and released.
pub const COUNTERS: [&str; 4] = [
    "notebookos_migrations_total{reason=\"all_yield\",result=\"completed\"}",
    "notebookos_migrations_total{reason=\"drain\",result=\"completed\"}",
    "notebookos_autoscale_hosts_total{direction=\"out\",result=\"ok\"}",
    "notebookos_autoscale_hosts_total{direction=\"in\",result=\"ok\"}",
];

/// One sample of the whole cluster.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// When it was taken (after every host answered), µs since the Unix epoch.
    pub unix_us: u64,
    /// GPUs committed to running cells.
    pub committed: f64,
    /// GPUs idle-held after a cell.
    pub idle_held: f64,
    /// GPUs of the hosts that are up (what is provisioned).
    pub gpus: f64,
    /// Hosts with GPUs that are up.
    pub hosts: u32,
}

/// What the sampler saw.
#[derive(Debug, Default)]
pub struct Sampled {
    /// The samples, in time order.
    pub samples: Vec<Sample>,
    /// Reads (cluster status or a host's `/metrics`) that failed.
    pub misses: usize,
    /// [`COUNTERS`] over the sampling, summed over every host ever seen: a host's last
    /// value less its first (a host seen only after the first sample started from 0: a
    /// new daemon); `None` where no host has the metric.
    pub counters: [Option<f64>; COUNTERS.len()],
}

/// Per host: its counters when first seen (`None`: seen after the first sample) and last.
type CounterSeen = BTreeMap<u64, (Option<[Option<f64>; COUNTERS.len()]>, [Option<f64>; COUNTERS.len()])>;

fn counter_deltas(seen: &CounterSeen) -> [Option<f64>; COUNTERS.len()] {
    let mut out = [None; COUNTERS.len()];
    for (first, last) in seen.values() {
        for (i, slot) in out.iter_mut().enumerate() {
            if let Some(v) = last[i] {
                let from = first.and_then(|f| f[i]).unwrap_or(0.0);
                *slot = Some(slot.unwrap_or(0.0) + (v - from));
            }
        }
    }
    out
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
    thread: std::thread::JoinHandle<Sampled>,
}

impl Sampler {
    /// Starts sampling `target`'s hosts every `period`.
    pub fn start(target: Arc<ReplayCluster>, period: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut out = Sampled::default();
            let mut hosts = target.hosts.clone();
            // Per host: (committed, idle-held) last read; a host that does not answer
            // keeps its last values (counted as a miss).
            let mut gauges: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
            let mut seen = CounterSeen::new();
            let mut first_round = true;
            while !flag.load(Ordering::Relaxed) {
                let due = std::time::Instant::now() + period;
                match target.live_hosts() {
                    Ok(h) => hosts = h,
                    Err(e) => {
                        out.misses += 1;
                        tracing::debug!(error = %format!("{e:#}"), "no cluster status");
                    }
                }
                for h in &hosts {
                    match target.metrics(h) {
                        Ok(text) => {
                            gauges.insert(
                                h.node_id,
                                (
                                    metric_sum(&text, "notebookos_gpus_committed").unwrap_or(0.0),
                                    metric_sum(&text, "notebookos_gpus_idle_held").unwrap_or(0.0),
                                ),
                            );
                            let now = COUNTERS.map(|c| metric_sum(&text, c));
                            let entry = seen.entry(h.node_id).or_insert((first_round.then_some(now), now));
                            entry.1 = now;
                        }
                        Err(e) => {
                            out.misses += 1;
                            tracing::debug!(host = h.node_id, error = %format!("{e:#}"), "no sample");
                        }
                    }
                }
                first_round = false;
                let live = |id: u64| hosts.iter().any(|h| h.node_id == id);
                out.samples.push(Sample {
                    unix_us: unix_us_now(),
                    committed: gauges.iter().filter(|(id, _)| live(**id)).map(|(_, v)| v.0).sum(),
                    idle_held: gauges.iter().filter(|(id, _)| live(**id)).map(|(_, v)| v.1).sum(),
                    gpus: hosts.iter().map(|h| f64::from(h.gpus)).sum(),
                    hosts: u32::try_from(hosts.len()).unwrap_or(u32::MAX),
                });
                std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
            }
            out.counters = counter_deltas(&seen);
            out
        });
        Self { stop, thread }
    }

    /// Stops; returns what was sampled.
    pub fn stop(self) -> Sampled {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// GPU-µs (committed, bound, provisioned) of the samples between `from` and `to` (µs
/// since the epoch): each sample's values hold until the next one (left Riemann sum).
pub fn integrate(samples: &[Sample], from: u64, to: u64) -> Integrals {
    let mut out = Integrals::default();
    for (i, s) in samples.iter().enumerate() {
        let start = s.unix_us.max(from);
        let end = samples.get(i + 1).map_or(to, |n| n.unix_us).min(to);
        if end > start {
            #[expect(clippy::cast_precision_loss, reason = "microseconds of a replay")]
            let dt = (end - start) as f64;
            out.committed += s.committed * dt;
            out.bound += (s.committed + s.idle_held) * dt;
            out.provisioned += s.gpus * dt;
        }
    }
    out
}

/// GPU-µs over a window ([`integrate`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Integrals {
    /// GPUs committed to cells.
    pub committed: f64,
    /// GPUs committed or idle-held.
    pub bound: f64,
    /// GPUs of the hosts that were up.
    pub provisioned: f64,
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
        let s = |unix_us, committed, idle_held, gpus| Sample { unix_us, committed, idle_held, gpus, hosts: 1 };
        let samples = [s(0, 1.0, 0.0, 8.0), s(10, 2.0, 1.0, 16.0), s(20, 0.0, 0.0, 8.0)];
        let i = |committed, bound, provisioned| Integrals { committed, bound, provisioned };
        assert_eq!(integrate(&samples, 0, 30), i(10.0 + 20.0, 10.0 + 30.0, 80.0 + 160.0 + 80.0));
        assert_eq!(integrate(&samples, 5, 15), i(5.0 + 10.0, 5.0 + 15.0, 40.0 + 80.0));
    }

    #[test]
    fn counters_add_each_hosts_growth_and_a_new_hosts_whole_count() {
        let mut seen = CounterSeen::new();
        // Host 1 was there at the start with 2 migrations and ends with 5; host 7 came
        // later (a new daemon) with 1; no host has the last counter.
        seen.insert(1, (Some([Some(2.0), Some(0.0), Some(0.0), None]), [Some(5.0), Some(3.0), Some(1.0), None]));
        seen.insert(7, (None, [Some(1.0), None, None, None]));
        assert_eq!(counter_deltas(&seen), [Some(4.0), Some(3.0), Some(1.0), None]);
    }
}
