//! The autoscaler (`[autoscale]`): every `interval`, the meta leader decides with the
//! scheduler core's rule ([`nbos_sched::scale`]: ours or the paper's) whether the cluster
//! needs more hosts or fewer, then asks the [`provider`] for hosts, or drains idle ones
//! ([`nbos_sched::drain::choose`]: replicas moved off first, then `leave`) and has the
//! provider release them. Unmet demand counts: kernels that placement refused and cells that
//! found no host to move a replica to ([`crate::cluster::control::meta::demand`]) make it scale out
//! even when committed GPUs alone would not.
//!
//! What the rule says for the cluster as the leader sees it is the scheduler core's
//! [`nbos_sched::autoscaler::Decider`], the very decision `nbos sim` simulates.
//!
//! - [`provider`]: where hosts come from (the `exec` provider's JSON contract).

pub mod provider;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::task::JoinHandle;

use self::provider::{ClusterView, Provider, ProviderHost, ProviderRequest};
use super::elastic_metrics::ElasticMetrics;
use super::meta::Cluster;
use crate::config::AutoscaleConfig;
use nbos_sched::autoscaler::{ClusterNow, Decider};
use nbos_sched::drain::{self, Candidate};
use nbos_sched::scale::Scale;

/// How often a release waiting for its host's replicas checks for one that no move takes off.
const REDRAIN_EVERY: Duration = Duration::from_secs(5);
/// Tries of removing a drained host from the meta group (a second apart) before giving up.
const REMOVE_TRIES: u32 = 15;
/// Intervals a host whose release was given up is not chosen again.
const HOLD_BACK_INTERVALS: u32 = 10;
/// The longest wait between two tries of a provider release that failed.
const RELEASE_RETRY_MAX: Duration = Duration::from_secs(60);

/// Hosts asked for and not registered yet.
#[derive(Debug)]
struct Booting {
    /// Live hosts when they were asked for.
    known: BTreeSet<u64>,
    /// How many.
    count: u32,
    /// When they no longer count.
    until: Instant,
}

/// Starts the autoscaler on this host (it acts while this host leads the meta group).
pub fn start(cluster: Arc<Cluster>, config: AutoscaleConfig, provider: Arc<dyn Provider>) -> JoinHandle<()> {
    tokio::spawn(run(cluster, config, provider))
}

async fn run(cluster: Arc<Cluster>, config: AutoscaleConfig, provider: Arc<dyn Provider>) {
    let mut decider = Decider::new(&config.params());
    let mut booting: Vec<Booting> = Vec::new();
    let releasing: Arc<Mutex<BTreeSet<u64>>> = Arc::default();
    // Hosts whose release was given up, and until when they are not chosen again: one that
    // cannot be drained now would otherwise be chosen every interval, ahead of any other.
    let held_back: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    // Hosts this autoscaler removed from the cluster: never live again to it, whatever a
    // lingering record says (a host id joins once).
    let removed: Arc<Mutex<BTreeSet<u64>>> = Arc::default();
    // The seeds (the meta group's founding voters) are the operator's own hosts and hold
    // the cluster's quorum: only hosts the provider added are released.
    let seeds: BTreeSet<u64> = cluster.settings().seeds.keys().copied().collect();
    let metrics = cluster.elastic_metrics().clone();
    loop {
        tokio::time::sleep(config.interval).await;
        let me = cluster.node_id();
        if cluster.meta_leader().await != Some(me) {
            booting.clear();
            continue;
        }
        let (Ok(hosts), Ok(loads), Ok(kernels), Ok(draining)) =
            (cluster.hosts().await, cluster.loads().await, cluster.kernels().await, cluster.draining_hosts().await)
        else {
            continue;
        };
        let mut gone: BTreeSet<u64> = releasing.lock().map(|r| r.clone()).unwrap_or_default();
        gone.extend(removed.lock().map(|r| r.clone()).unwrap_or_default());
        let live: Vec<_> =
            hosts.iter().filter(|h| !draining.contains(&h.node_id) && !gone.contains(&h.node_id)).collect();
        let live_ids: BTreeSet<u64> = live.iter().map(|h| h.node_id).collect();
        booting.retain(|b| Instant::now() < b.until && live_ids.difference(&b.known).count() < b.count as usize);
        let booting_hosts: u32 = booting
            .iter()
            .map(|b| b.count.saturating_sub(u32::try_from(live_ids.difference(&b.known).count()).unwrap_or(u32::MAX)))
            .sum();
        metrics.hosts_booting.set(i64::from(booting_hosts));
        let loads: HashMap<u64, _> = loads.into_iter().map(|l| (l.node_id, l)).collect();
        let busy = |id: u64| loads.get(&id).map_or(0, |l| l.gpus_total.saturating_sub(l.gpus_idle));
        let (refused, waiting) = cluster.demand().recent(config.interval.saturating_mul(2));
        let now = ClusterNow {
            hosts: u32::try_from(live.len()).unwrap_or(u32::MAX),
            booting: booting_hosts,
            free_hosts: u32::try_from(live.iter().filter(|h| busy(h.node_id) == 0).count()).unwrap_or(u32::MAX),
            committed_gpus: live.iter().map(|h| busy(h.node_id)).sum(),
            // Not the replicas on a host being drained or released: each is about to be gone
            // (its move's target counts), and counting it against the hosts that stay would
            // ask for a host back in the middle of a scale-in. A dead host's do count: they
            // need new homes.
            subscribed_gpus: kernels
                .iter()
                .map(|k| {
                    let staying = k.hosts().iter().filter(|h| !draining.contains(h) && !gone.contains(h)).count();
                    k.gpus.saturating_mul(u32::try_from(staying).unwrap_or(u32::MAX))
                })
                .sum(),
            gpus_per_host: live.iter().map(|h| u32::try_from(h.gpus.len()).unwrap_or(u32::MAX)).max().unwrap_or(0),
            refused_subscription: refused,
            waiting_gpus: waiting,
        };
        let millis = u64::try_from(cluster_clock().elapsed().as_millis()).unwrap_or(u64::MAX);
        let scale = decider.decide(millis, &now, cluster.settings().subscription_ratio);
        metrics.decisions.inc();
        match scale {
            Scale::Out(n) => {
                tracing::info!(hosts = now.hosts, booting = now.booting, count = n, ?now, "autoscaler: scaling out");
                let view = ClusterView {
                    hosts: live
                        .iter()
                        .map(|h| ProviderHost {
                            node_id: h.node_id,
                            name: h.name.clone(),
                            gateway_url: h.gateway_url.clone(),
                        })
                        .collect(),
                    meta_leader: me,
                };
                let request = ProviderRequest::ScaleOut { count: n, cluster: view };
                let p = provider.clone();
                match tokio::task::spawn_blocking(move || p.call(&request)).await {
                    Ok(Ok(answer)) => {
                        tracing::info!(count = n, message = %answer.message, "autoscaler: the provider is adding hosts");
                        metrics.scaled_hosts.get_or_create(&scale_labels("out", "ok")).inc_by(u64::from(n));
                        booting.push(Booting {
                            known: live_ids.clone(),
                            count: n,
                            until: Instant::now() + config.boot_timeout,
                        });
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "autoscaler: scaling out failed");
                        metrics.scaled_hosts.get_or_create(&scale_labels("out", "failed")).inc_by(u64::from(n));
                    }
                    Err(e) => tracing::warn!(error = %e, "autoscaler: the provider call panicked"),
                }
            }
            Scale::In(n) => {
                let held: BTreeSet<u64> = held_back
                    .lock()
                    .map(|mut m| {
                        m.retain(|_, until| Instant::now() < *until);
                        m.keys().copied().collect()
                    })
                    .unwrap_or_default();
                let candidates: Vec<Candidate> = live
                    .iter()
                    .filter(|h| h.node_id != me && !held.contains(&h.node_id) && !seeds.contains(&h.node_id))
                    .map(|h| Candidate {
                        node_id: h.node_id,
                        committed_gpus: busy(h.node_id),
                        bound_gpus: loads.get(&h.node_id).map_or(0, |l| l.gpus_committed),
                        replicas: u32::try_from(kernels.iter().filter(|k| k.hosts().contains(&h.node_id)).count())
                            .unwrap_or(u32::MAX),
                    })
                    .collect();
                // Hosts released together share no kernel, and none shares one with a host
                // being released or a replica on the move: a drain moves one replica of a
                // kernel at a time and would wait out the other's move past its call's
                // deadline, giving the release up. The rest wait for a later decision.
                let kernels_of =
                    |id: u64| kernels.iter().filter(move |k| k.hosts().contains(&id)).map(|k| k.id.as_str());
                let mut taken: BTreeSet<&str> = kernels
                    .iter()
                    .filter(|k| k.moving.is_some() || k.hosts().iter().any(|h| gone.contains(h)))
                    .map(|k| k.id.as_str())
                    .collect();
                let mut chosen = Vec::new();
                for id in drain::choose(&candidates, candidates.len()) {
                    if chosen.len() >= n as usize {
                        break;
                    }
                    if kernels_of(id).any(|k| taken.contains(k)) {
                        continue;
                    }
                    taken.extend(kernels_of(id));
                    chosen.push(id);
                }
                for id in chosen {
                    let Some(host) = live.iter().find(|h| h.node_id == id) else { continue };
                    let host =
                        ProviderHost { node_id: id, name: host.name.clone(), gateway_url: host.gateway_url.clone() };
                    if let Ok(mut r) = releasing.lock() {
                        r.insert(id);
                    }
                    tracing::info!(node = id, ?now, "autoscaler: releasing an idle host");
                    let (cluster, provider, releasing, metrics, held_back, removed) = (
                        cluster.clone(),
                        provider.clone(),
                        releasing.clone(),
                        metrics.clone(),
                        held_back.clone(),
                        removed.clone(),
                    );
                    let (drain_timeout, retry) = (config.drain_timeout, config.interval);
                    tokio::spawn(async move {
                        match drain_and_leave(&cluster, &host, drain_timeout).await {
                            Ok(()) => {
                                if let Ok(mut r) = removed.lock() {
                                    r.insert(id);
                                }
                                release(provider, host, &metrics, retry).await;
                            }
                            Err(e) => {
                                tracing::warn!(
                                    node = id,
                                    error = format!("{e:#}"),
                                    "autoscaler: releasing the host failed; it stays"
                                );
                                metrics.scaled_hosts.get_or_create(&scale_labels("in", "failed")).inc();
                                if let Ok(mut m) = held_back.lock() {
                                    m.insert(id, Instant::now() + retry.saturating_mul(HOLD_BACK_INTERVALS));
                                }
                            }
                        }
                        if let Ok(mut r) = releasing.lock() {
                            r.remove(&id);
                        }
                    });
                }
            }
            Scale::Hold => {}
        }
    }
}

fn scale_labels(
    direction: &'static str,
    result: &'static str,
) -> crate::cluster::control::elastic_metrics::ScaleLabels {
    crate::cluster::control::elastic_metrics::ScaleLabels { direction, result }
}

/// The autoscaler's own clock for the peak window (monotonic; the core takes plain ms).
fn cluster_clock() -> &'static Instant {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now)
}

/// Drains `host` (its replicas move off, a running cell ends first), then removes it from
/// the cluster. A replica that no move takes off (placement put it there as the drain
/// began, reading the host as live) is drained again. Should the replicas not all be off
/// within `timeout`, or removing fail, the release is given up: the host's draining mark is
/// withdrawn, so it stays in service with whatever replicas it still holds (the moves
/// already begun go on) and a later decision may choose it again.
async fn drain_and_leave(cluster: &Cluster, host: &ProviderHost, timeout: Duration) -> anyhow::Result<()> {
    let id = host.node_id;
    cluster.host_leave_phase(&host.gateway_url, "drain").await.with_context(|| format!("draining host {id}"))?;
    let mut result = wait_drained(cluster, host, timeout).await;
    if result.is_ok() {
        result = remove(cluster, host).await;
    }
    if let Err(e) = &result {
        if let Err(w) = cluster.withdraw_draining(id).await {
            tracing::warn!(node = id, error = %w, "autoscaler: could not withdraw the draining mark of a host kept");
        }
        return Err(anyhow::anyhow!("host {id}: {e:#}"));
    }
    Ok(())
}

/// Removes the drained `host` from the meta group, trying again for a while: the group takes
/// one membership change at a time, so a host released beside another is often refused once.
async fn remove(cluster: &Cluster, host: &ProviderHost) -> anyhow::Result<()> {
    let mut tries = 0;
    loop {
        match cluster.host_leave_phase(&host.gateway_url, "remove").await {
            Ok(_) => return Ok(()),
            Err(e) if tries < REMOVE_TRIES => {
                tries += 1;
                tracing::debug!(node = host.node_id, error = %e, "autoscaler: removing a drained host; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(anyhow::Error::new(e).context("removing it")),
        }
    }
}

/// Waits until no kernel record places a replica on `host`.
async fn wait_drained(cluster: &Cluster, host: &ProviderHost, timeout: Duration) -> anyhow::Result<()> {
    let id = host.node_id;
    let deadline = Instant::now() + timeout;
    let mut drained = Instant::now();
    loop {
        match cluster.kernels().await {
            Ok(kernels) => {
                let here: Vec<_> = kernels.iter().filter(|k| k.hosts().contains(&id)).collect();
                if here.is_empty() {
                    return Ok(());
                }
                let unmoved = here.iter().any(|k| k.moving.as_ref().is_none_or(|m| m.from != id));
                if unmoved && drained.elapsed() >= REDRAIN_EVERY {
                    drained = Instant::now();
                    if let Err(e) = cluster.host_leave_phase(&host.gateway_url, "drain").await {
                        tracing::debug!(node = id, error = %e, "autoscaler: draining a replica placed late failed");
                    }
                }
            }
            Err(e) => tracing::debug!(node = id, error = %e, "autoscaler: reading kernel records"),
        }
        anyhow::ensure!(Instant::now() < deadline, "its replicas did not all move off within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Has the provider release `host`, which has left the cluster, retrying until it does
/// (first after `retry`, doubling up to [`RELEASE_RETRY_MAX`]): a host left running is
/// paid for and serves no one. Each failed call counts, and the host counts as unreleased
/// until the provider succeeds. Retries live on this host: should it stop, the host
/// stays with the provider (its log says which).
async fn release(provider: Arc<dyn Provider>, host: ProviderHost, metrics: &ElasticMetrics, retry: Duration) {
    let id = host.node_id;
    let mut wait = retry;
    let mut unreleased = false;
    loop {
        let (p, request) = (provider.clone(), ProviderRequest::Release { host: host.clone() });
        match tokio::task::spawn_blocking(move || p.call(&request)).await {
            Ok(Ok(answer)) => {
                tracing::info!(node = id, message = %answer.message, "autoscaler: host released");
                metrics.scaled_hosts.get_or_create(&scale_labels("in", "ok")).inc();
                break;
            }
            Ok(Err(e)) => tracing::warn!(
                node = id, error = %e, retry_in = ?wait,
                "autoscaler: the provider did not release a host that has left the cluster; retrying"
            ),
            Err(e) => tracing::warn!(node = id, error = %e, retry_in = ?wait, "autoscaler: the provider call panicked"),
        }
        metrics.scaled_hosts.get_or_create(&scale_labels("in", "failed")).inc();
        if !unreleased {
            unreleased = true;
            metrics.hosts_unreleased.inc();
        }
        tokio::time::sleep(wait).await;
        wait = wait.saturating_mul(2).min(RELEASE_RETRY_MAX);
    }
    if unreleased {
        metrics.hosts_unreleased.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::provider::ExecProvider;
    use super::*;

    /// A provider whose first release call hangs past its timeout (it is killed) and whose
    /// second exits non-zero: the release is tried again until the third call succeeds,
    /// every failed call counted, the host unreleased meanwhile and not after.
    #[tokio::test]
    async fn a_release_the_provider_hangs_on_or_fails_is_retried_until_it_succeeds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let calls = dir.path().join("calls");
        let script = format!(
            "n=$(cat {c} 2>/dev/null || echo 0); n=$((n + 1)); echo $n > {c}; case $n in \
             1) exec sleep 30;; 2) echo refused >&2; exit 3;; *) echo '{{\"ok\": true, \"message\": \"gone\"}}';; esac",
            c = calls.display()
        );
        let provider: Arc<dyn Provider> =
            Arc::new(ExecProvider::new(vec!["/bin/sh".into(), "-c".into(), script], Duration::from_millis(500)));
        let metrics = ElasticMetrics::default();
        let host = ProviderHost { node_id: 7, name: "h7".into(), gateway_url: "https://h7:8888".into() };
        release(provider, host, &metrics, Duration::from_millis(10)).await;
        let count = |result| metrics.scaled_hosts.get_or_create(&scale_labels("in", result)).get();
        assert_eq!((count("failed"), count("ok")), (2, 1));
        assert_eq!(metrics.hosts_unreleased.get(), 0);
        assert_eq!(std::fs::read_to_string(&calls).expect("calls").trim(), "3");
    }
}
