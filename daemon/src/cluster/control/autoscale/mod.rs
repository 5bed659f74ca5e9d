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

use tokio::task::JoinHandle;

use self::provider::{ClusterView, Provider, ProviderHost, ProviderRequest};
use super::meta::Cluster;
use crate::config::AutoscaleConfig;
use nbos_sched::autoscaler::{ClusterNow, Decider};
use nbos_sched::drain::{self, Candidate};
use nbos_sched::scale::Scale;

/// How long a released host's replicas may take to move before its release is given up.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(600);

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
        let gone: BTreeSet<u64> = releasing.lock().map(|r| r.clone()).unwrap_or_default();
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
            subscribed_gpus: kernels
                .iter()
                .map(|k| k.gpus.saturating_mul(u32::try_from(k.hosts().len()).unwrap_or(u32::MAX)))
                .sum(),
            gpus_per_host: live.iter().map(|h| u32::try_from(h.gpus.len()).unwrap_or(u32::MAX)).max().unwrap_or(0),
            refused_subscription: refused,
            waiting_gpus: waiting,
        };
        let millis = u64::try_from(cluster_clock().elapsed().as_millis()).unwrap_or(u64::MAX);
        match decider.decide(millis, &now, cluster.settings().subscription_ratio) {
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
                let candidates: Vec<Candidate> = live
                    .iter()
                    .filter(|h| h.node_id != me)
                    .map(|h| Candidate {
                        node_id: h.node_id,
                        committed_gpus: busy(h.node_id),
                        bound_gpus: loads.get(&h.node_id).map_or(0, |l| l.gpus_committed),
                        replicas: u32::try_from(kernels.iter().filter(|k| k.hosts().contains(&h.node_id)).count())
                            .unwrap_or(u32::MAX),
                    })
                    .collect();
                for id in drain::choose(&candidates, n as usize) {
                    let Some(host) = live.iter().find(|h| h.node_id == id) else { continue };
                    let host =
                        ProviderHost { node_id: id, name: host.name.clone(), gateway_url: host.gateway_url.clone() };
                    if let Ok(mut r) = releasing.lock() {
                        r.insert(id);
                    }
                    tracing::info!(node = id, ?now, "autoscaler: releasing an idle host");
                    let (cluster, provider, releasing, metrics) =
                        (cluster.clone(), provider.clone(), releasing.clone(), metrics.clone());
                    tokio::spawn(async move {
                        let result = release(&cluster, provider, host).await;
                        let outcome = if let Err(e) = &result {
                            tracing::warn!(node = id, error = %e, "autoscaler: releasing the host failed");
                            "failed"
                        } else {
                            "ok"
                        };
                        metrics.scaled_hosts.get_or_create(&scale_labels("in", outcome)).inc();
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

/// Drains `host` (its replicas move off, a running cell ends first), removes it from the
/// cluster, then has the provider release it.
async fn release(cluster: &Cluster, provider: Arc<dyn Provider>, host: ProviderHost) -> anyhow::Result<()> {
    let id = host.node_id;
    cluster.host_leave_phase(&host.gateway_url, "drain").await?;
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    while cluster.kernels().await?.iter().any(|k| k.hosts().contains(&id)) {
        anyhow::ensure!(Instant::now() < deadline, "host {id}'s replicas did not move within {DRAIN_TIMEOUT:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    cluster.host_leave_phase(&host.gateway_url, "remove").await?;
    let request = ProviderRequest::Release { host };
    let answer = tokio::task::spawn_blocking(move || provider.call(&request)).await??;
    tracing::info!(node = id, message = %answer.message, "autoscaler: host released");
    Ok(())
}
