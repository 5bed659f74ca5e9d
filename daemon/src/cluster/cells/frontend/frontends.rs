//! This host's front-end kernels ([`Frontends`]): opened on a client's first use (links to
//! every replica host and a cell worker each), closed when their kernel is deleted.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use raft_store::{Kv, RaftStore};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::cell_driver::cell_worker;
use super::kernel::FrontendKernel;
use super::metrics::{FrontendMetrics, MetricsRegistry};
use super::replica_link::keep_links;
use super::shared::{watch_hosts_and_loads, Shared};
use crate::cluster::cells::local_link::LocalReplicas;
use crate::cluster::control::meta::Cluster;
use crate::cluster::control::records::{HostRecord, KernelRecord};

/// The front-end kernels of this host.
pub struct Frontends {
    shared: Arc<Shared>,
    registry: MetricsRegistry,
    kernels: Mutex<HashMap<String, Arc<FrontendKernel>>>,
    watcher: JoinHandle<()>,
}

impl Drop for Frontends {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

impl Frontends {
    /// Front-ends reading the cluster from `meta` (the meta group's [`Kv`]) and, where this
    /// host is a member of a kernel's group, the group from `store`; other hosts are called
    /// with this host's own credential ([`crate::link::host`]).
    pub fn new(meta: Kv, store: Option<RaftStore>, metrics: FrontendMetrics) -> Arc<Self> {
        let (tx, rx) = watch::channel(0u64);
        let watcher = tokio::spawn(watch_hosts_and_loads(meta.clone(), tx));
        Arc::new(Self {
            registry: MetricsRegistry::new(&metrics),
            shared: Arc::new(Shared {
                meta,
                store,
                metrics,
                changes: rx,
                cache: Mutex::new(None),
                local: std::sync::OnceLock::new(),
                cluster: std::sync::OnceLock::new(),
            }),
            kernels: Mutex::new(HashMap::new()),
            watcher,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<FrontendKernel>>> {
        self.kernels.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Links front-ends to node `node_id`'s (this host's) replicas in-process from now on,
    /// instead of by WebSocket to this host's own gateway. Set once; later calls are ignored.
    pub fn set_local(&self, node_id: u64, replicas: Arc<dyn LocalReplicas>) {
        let _ = self.shared.local.set((node_id, replicas));
    }

    /// Lets front-ends ask the meta leader to move a replica when every replica yields a
    /// cell. Set once; later calls are ignored.
    pub fn set_cluster(&self, cluster: Arc<Cluster>) {
        let _ = self.shared.cluster.set(cluster);
    }

    /// The front-end of `record`'s kernel, opened on first use.
    pub fn open(&self, record: &KernelRecord) -> Arc<FrontendKernel> {
        let mut g = self.lock();
        if let Some(k) = g.get(&record.id) {
            return k.clone();
        }
        let k = start(record, self.shared.clone());
        g.insert(record.id.clone(), k.clone());
        k
    }

    /// The front-end of a kernel, if one is open here.
    pub fn get(&self, id: &str) -> Option<Arc<FrontendKernel>> {
        self.lock().get(id).cloned()
    }

    /// Closes the front-ends of kernels not in `ids` (deleted through another host).
    pub fn retain(&self, ids: &HashSet<&str>) {
        let gone: Vec<Arc<FrontendKernel>> = {
            let mut g = self.lock();
            let ids_gone: Vec<String> = g.keys().filter(|k| !ids.contains(k.as_str())).cloned().collect();
            ids_gone.iter().filter_map(|id| g.remove(id)).collect()
        };
        for k in gone {
            k.close();
        }
    }

    /// Closes a kernel's front-end (kernel deleted): its clients and links go.
    pub fn close(&self, id: &str) {
        if let Some(k) = self.lock().remove(id) {
            k.close();
        }
    }

    /// The replica that executed `record`'s last cell: from the kernel group when this
    /// host is a member, else as this host's front-end saw it.
    pub async fn last_executor(&self, record: &KernelRecord) -> Option<(u32, u64)> {
        match self.shared.group_last_executor(record.group).await {
            Some(x) => Some(x),
            None => self.get(&record.id).and_then(|f| f.state().last_executor),
        }
    }

    /// The live hosts (for the gateway's models and internal calls).
    pub async fn hosts(&self) -> HashMap<u64, HostRecord> {
        self.shared.hosts().await
    }

    /// The metrics.
    pub fn metrics(&self) -> &FrontendMetrics {
        &self.shared.metrics
    }

    /// Appends the front-end metrics to the daemon's exposition.
    pub fn append_metrics(&self, exposition: &mut String) {
        self.registry.append_to(exposition);
    }
}

/// Opens the front-end of `record`'s kernel: its links to every replica host, then its cell worker.
fn start(record: &KernelRecord, shared: Arc<Shared>) -> Arc<FrontendKernel> {
    let (k, cells, events) = FrontendKernel::new(record.clone(), shared);
    keep_links(&k, &record.hosts());
    k.set_worker(tokio::spawn(cell_worker(Arc::downgrade(&k), cells, events)));
    k
}
