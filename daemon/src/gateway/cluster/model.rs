//! The cluster kernel model: the Kernel Gateway model plus where the replicas are, which
//! one executes, and what this host's front-end saw.

use std::collections::HashMap;
use std::time::{Duration, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::mode::ClusterMode;
use crate::cluster::cells::frontend::ExecutionInfo;
use crate::cluster::control::records::KernelRecord;
use crate::jupyter::message::iso_date;
use crate::kernel::KernelModel;

/// One replica in the cluster kernel model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaModel {
    /// Replica number.
    pub replica: u32,
    /// Host (raft node id).
    pub node_id: u64,
    /// Host name (empty while the host is down).
    pub host: String,
    /// `executor` for the replica that ran the last cell seen here, else `standby`.
    pub role: String,
    /// Its host is up (has a `hosts/` record).
    pub live: bool,
    /// Its replica is caught up and serving (`ready/` mark).
    pub ready: bool,
}

/// The Kernel Gateway model plus where the replicas are and who executes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterKernelModel {
    /// The standard model.
    #[serde(flatten)]
    pub base: KernelModel,
    /// The replicas.
    pub replicas: Vec<ReplicaModel>,
    /// Execution as this host's front-end sees it (absent when no client used it here).
    #[serde(default)]
    pub execution: Option<ExecutionInfo>,
}

impl ClusterMode {
    /// The model of `record`.
    pub async fn model(&self, record: &KernelRecord) -> ClusterKernelModel {
        let hosts: HashMap<u64, String> = self.frontends.hosts().await.into_iter().map(|(n, h)| (n, h.name)).collect();
        let ready = self.cluster.ready_hosts(&record.id).await.unwrap_or_default();
        let front = self.frontends.get(&record.id);
        let execution = front.as_ref().map(|f| f.execution());
        let executor = self.frontends.last_executor(record).await.map(|(replica, _)| replica);
        let replicas = record
            .replicas
            .iter()
            .map(|r| ReplicaModel {
                replica: r.replica,
                node_id: r.node_id,
                host: hosts.get(&r.node_id).cloned().unwrap_or_default(),
                role: if executor == Some(r.replica) { "executor" } else { "standby" }.to_owned(),
                live: hosts.contains_key(&r.node_id),
                ready: ready.contains(&r.node_id),
            })
            .collect::<Vec<_>>();
        let all_ready = replicas.iter().all(|r| r.ready);
        let (state, activity, connections) = match &front {
            Some(f) => {
                let a = f.hub.activity();
                (a.execution_state, a.last_activity, a.connections)
            }
            None => (
                if all_ready { "idle" } else { "starting" }.to_owned(),
                UNIX_EPOCH + Duration::from_millis(record.created_ms),
                0,
            ),
        };
        let pids = self.replicas.kernels().get(&record.id).await.map(|k| k.pids()).unwrap_or_default();
        ClusterKernelModel {
            base: KernelModel {
                id: record.id.clone(),
                name: record.name.clone(),
                last_activity: iso_date(activity),
                execution_state: state,
                connections,
                gpus: record.gpus,
                gpu_memory_mib: crate::kernel::registry::gpu_memory_mib_of(&record.env),
                pids,
                owner: record.owner.clone(),
            },
            replicas,
            execution,
        }
    }
}
