//! The garbage collector of the large-object store, run by the meta leader every
//! `cluster.object_gc_interval` (and by `nbos objects gc`).
//!
//! A run lists the store, then asks every host that may hold a kernel group (each live
//! host, and each host a kernel record names) which objects its groups' `ns/` values point
//! to ([`crate::cluster::cells::state_sync::referenced_objects`], `GET /api/v1/cluster/objects/refs`
//! over the hosts' certificates). Only when every one of them answered does it delete, and
//! then only objects no one refers to whose last write is older than
//! `cluster.object_gc_grace` ([`super::objects::collect`]), reading each one's time again just before
//! its delete. Deleted kernels' objects and overwritten values go this way.
//!
//! Nothing is kept between runs, so a crash or a leader change mid-run loses nothing: the
//! next run decides again from the store and the hosts. Several clusters must not share a
//! store prefix: each would collect the other's objects.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;

use super::objects::collect::{self, Tally};
use super::objects::store::Objects;
use crate::cluster::cells::state_sync::{referenced_objects, HostRefs};
use crate::cluster::control::meta::{Authority, Cluster, ClusterError, HttpMethod};

/// Where hosts answer which objects they refer to.
pub const REFS_PATH: &str = "/api/v1/cluster/objects/refs";
/// The collector's report (`GET`: a dry run) and a run on demand (`POST`).
pub const OBJECTS_PATH: &str = "/api/v1/cluster/objects";
/// `POST` here runs the collector.
pub const GC_PATH: &str = "/api/v1/cluster/objects/gc";

/// What one run found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcReport {
    /// The store (its URL or directory).
    pub store: String,
    /// The host that ran it (the meta leader).
    pub node_id: u64,
    /// Nothing was deleted on purpose.
    pub dry_run: bool,
    /// Every host that may hold a kernel group answered (else nothing is deleted).
    pub complete: bool,
    /// Hosts asked.
    pub hosts_asked: Vec<u64>,
    /// Hosts that did not answer, and why.
    pub unanswered: Vec<String>,
    /// The grace period, seconds.
    pub grace_s: u64,
    /// Everything in the store.
    pub stored: Tally,
    /// Objects some replica refers to.
    pub referenced: Tally,
    /// Objects no one refers to, written within the grace period (kept).
    pub recent: Tally,
    /// Objects no one refers to, written before the grace period.
    pub collectable: Tally,
    /// Objects deleted by this run.
    pub collected: Tally,
    /// Deletes that failed (retried next run).
    pub failed_deletes: u64,
    /// Objects referred to that are not in the store.
    pub dangling: u64,
    /// How long the run took, milliseconds.
    pub took_ms: u64,
}

/// `POST /api/v1/cluster/objects/gc`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcRequest {
    /// Report what would go without deleting it.
    #[serde(default)]
    pub dry_run: bool,
}

/// Labels of `notebookos_object_store_gc_runs_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunLabels {
    /// `complete`, `incomplete` (a host did not answer: nothing deleted) or `failed`.
    outcome: &'static str,
}

/// The collector's metrics (set on the host that runs it: the meta leader).
#[derive(Debug, Clone, Default)]
struct GcMetrics {
    objects: Gauge,
    bytes: Gauge,
    collected_objects: Counter,
    collected_bytes: Counter,
    delete_failures: Counter,
    runs: Family<RunLabels, Counter>,
}

/// The collector of this host's store; it acts while this host leads the meta group.
pub struct Collector {
    cluster: Arc<Cluster>,
    objects: Objects,
    grace: Duration,
    metrics: GcMetrics,
    /// One run at a time on this host (the periodic one and `nbos objects gc`).
    running: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collector").field("store", &self.objects.name()).field("grace", &self.grace).finish()
    }
}

impl Collector {
    /// A collector of `objects` with `grace`.
    pub fn new(cluster: Arc<Cluster>, objects: Objects, grace: Duration) -> Arc<Self> {
        Arc::new(Self { cluster, objects, grace, metrics: GcMetrics::default(), running: tokio::sync::Mutex::new(()) })
    }

    /// Runs every `interval` while this host leads the meta group (never when zero).
    pub fn start(self: &Arc<Self>, interval: Duration) -> Option<JoinHandle<()>> {
        if interval.is_zero() {
            tracing::info!("large-object store collection is off (cluster.object_gc_interval = 0)");
            return None;
        }
        let me = self.clone();
        Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                if me.cluster.meta_leader().await != Some(me.cluster.node_id()) {
                    continue;
                }
                match me.collect(false).await {
                    Ok(r) if !r.complete => tracing::warn!(
                        unanswered = ?r.unanswered,
                        "object collection deleted nothing: not every host said which objects it needs"
                    ),
                    Ok(r) => tracing::info!(
                        collected = r.collected.objects,
                        collected_bytes = r.collected.bytes,
                        stored = r.stored.objects,
                        stored_bytes = r.stored.bytes,
                        failed = r.failed_deletes,
                        "large-object store collected"
                    ),
                    Err(e) => tracing::warn!(error = %e, "large-object store collection failed"),
                }
            }
        }))
    }

    /// Runs on the meta leader: here, or forwarded to it (`authority`: the caller's).
    pub async fn collect_on_leader(&self, dry_run: bool) -> Result<GcReport, ClusterError> {
        let body = GcRequest { dry_run };
        let authority = if dry_run { Authority::Host } else { Authority::Operator };
        self.cluster.on_leader(HttpMethod::Post, GC_PATH, Some(&body), authority, || self.collect_here(dry_run)).await
    }

    /// Runs here; `NotLeader` unless this host leads the meta group.
    pub async fn collect_here(&self, dry_run: bool) -> Result<GcReport, ClusterError> {
        self.cluster.require_leader().await?;
        self.collect(dry_run).await
    }

    async fn collect(&self, dry_run: bool) -> Result<GcReport, ClusterError> {
        let _one = self.running.lock().await;
        let started = Instant::now();
        let outcome = self.run(dry_run).await;
        let label = match &outcome {
            Ok(r) if r.complete => "complete",
            Ok(_) => "incomplete",
            Err(_) => "failed",
        };
        self.metrics.runs.get_or_create(&RunLabels { outcome: label }).inc();
        outcome.map(|mut r| {
            r.took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            r
        })
    }

    async fn run(&self, dry_run: bool) -> Result<GcReport, ClusterError> {
        // The listing comes first: an object whose pointer is committed after the hosts
        // answered was written after the listing, and its delete is checked against that.
        let listing = self.objects.list().await.map_err(|e| ClusterError::NotReady(e.to_string()))?;
        let (referenced, hosts_asked, unanswered) = self.references().await?;
        let now = SystemTime::now();
        let sorted = collect::sort(&listing, &referenced, now, self.grace);
        let stored = Tally::of(&listing);
        self.metrics.objects.set(i64::try_from(stored.objects).unwrap_or(i64::MAX));
        self.metrics.bytes.set(i64::try_from(stored.bytes).unwrap_or(i64::MAX));
        let mut report = GcReport {
            store: self.objects.name().to_owned(),
            node_id: self.cluster.node_id(),
            dry_run,
            complete: unanswered.is_empty(),
            hosts_asked,
            unanswered,
            grace_s: self.grace.as_secs(),
            stored,
            referenced: sorted.referenced,
            recent: sorted.recent,
            collectable: Tally::of(&sorted.collectable),
            dangling: sorted.dangling,
            ..GcReport::default()
        };
        if dry_run || !report.complete {
            return Ok(report);
        }
        for object in &sorted.collectable {
            // Written again since the listing (a cell stored the same value): kept.
            match self.objects.head(&object.sha256).await {
                Ok(Some(now_stored)) if collect::past_grace(&now_stored, SystemTime::now(), self.grace) => {}
                Ok(_) => continue,
                Err(e) => {
                    tracing::debug!(sha256 = %object.sha256, error = %e, "could not re-check an object before deleting it");
                    report.failed_deletes += 1;
                    continue;
                }
            }
            match self.objects.delete(&object.sha256).await {
                Ok(()) => {
                    report.collected.objects += 1;
                    report.collected.bytes += object.size;
                }
                Err(e) => {
                    tracing::warn!(sha256 = %object.sha256, error = %e, "could not delete an unreferenced object");
                    report.failed_deletes += 1;
                }
            }
        }
        self.metrics.collected_objects.inc_by(report.collected.objects);
        self.metrics.collected_bytes.inc_by(report.collected.bytes);
        self.metrics.delete_failures.inc_by(report.failed_deletes);
        let left = report.stored.objects.saturating_sub(report.collected.objects);
        self.metrics.objects.set(i64::try_from(left).unwrap_or(i64::MAX));
        let left_bytes = report.stored.bytes.saturating_sub(report.collected.bytes);
        self.metrics.bytes.set(i64::try_from(left_bytes).unwrap_or(i64::MAX));
        Ok(report)
    }

    /// Every object any host's kernel groups point to, the hosts asked, and those that did
    /// not answer.
    async fn references(&self) -> Result<(BTreeSet<String>, Vec<u64>, Vec<String>), ClusterError> {
        let hosts = self.cluster.hosts().await?;
        let mut wanted: BTreeSet<u64> = hosts.iter().map(|h| h.node_id).collect();
        for k in self.cluster.kernels().await? {
            wanted.extend(k.replicas.iter().map(|r| r.node_id));
            wanted.extend(k.moving.iter().map(|m| m.to));
        }
        let me = self.cluster.node_id();
        let asks = wanted.iter().map(|&node_id| {
            let url = hosts.iter().find(|h| h.node_id == node_id).map(|h| h.gateway_url.clone());
            async move {
                let answer: Result<HostRefs, String> = match url {
                    _ if node_id == me => self.local_refs().await.map_err(|e| e.to_string()),
                    None => Err("down (no heartbeat record) while a kernel record names it".to_owned()),
                    Some(url) => self
                        .cluster
                        .forward::<(), HostRefs>(HttpMethod::Get, &url, REFS_PATH, None, Authority::Host)
                        .await
                        .map_err(|e| e.to_string()),
                };
                (node_id, answer)
            }
        });
        let mut referenced = BTreeSet::new();
        let mut unanswered = Vec::new();
        for (node_id, answer) in futures_util::future::join_all(asks).await {
            match answer {
                Ok(refs) if refs.node_id == node_id => referenced.extend(refs.objects),
                Ok(refs) => unanswered.push(format!("host {node_id}: answered as host {}", refs.node_id)),
                Err(e) => unanswered.push(format!("host {node_id}: {e}")),
            }
        }
        Ok((referenced, wanted.into_iter().collect(), unanswered))
    }

    /// The objects this host's kernel groups point to (what it answers at [`REFS_PATH`]).
    pub async fn local_refs(&self) -> Result<HostRefs, ClusterError> {
        referenced_objects(self.cluster.store()).await.map_err(|e| ClusterError::NotReady(format!("{e:#}")))
    }

    /// A registry holding the collector's metrics.
    pub fn registry(&self) -> Registry {
        let m = &self.metrics;
        let mut r = Registry::default();
        let s = r.sub_registry_with_prefix("notebookos_object_store");
        s.register(
            "objects",
            "Objects in the large-object store at the last collection (meta leader)",
            m.objects.clone(),
        );
        s.register("bytes", "Bytes in the large-object store at the last collection (meta leader)", m.bytes.clone());
        s.register("collected_objects", "Unreferenced objects the collector deleted", m.collected_objects.clone());
        s.register(
            "collected_bytes",
            "Bytes of the unreferenced objects the collector deleted",
            m.collected_bytes.clone(),
        );
        s.register(
            "delete_failures",
            "Deletes of unreferenced objects that failed (retried next run)",
            m.delete_failures.clone(),
        );
        s.register(
            "gc_runs",
            "Collector runs, by outcome (incomplete: a host did not answer, nothing deleted)",
            m.runs.clone(),
        );
        r
    }
}
