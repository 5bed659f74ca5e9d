//! Kernel records on the meta leader: placing a new kernel's replicas, deleting a kernel,
//! re-placing the replica of a host that is gone. Placement itself is pure
//! ([`nbos_sched::placement`]); this file reads the hosts and commits by compare-and-swap,
//! one placement at a time.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::error::{ClusterError, Result};
use super::forward::{Authority, HttpMethod};
use super::handle::Cluster;
use super::memory;
use crate::cluster::control::records::{self, keys, KernelRecord, ReplicaRecord};
use nbos_sched::placement::{self, HostLoad};

/// What a client asks for when it creates a kernel (`POST /api/v1/cluster/kernels`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelSpec {
    /// Kernel id; `None` lets the leader pick a UUID.
    #[serde(default)]
    pub id: Option<String>,
    /// Kernelspec name.
    pub name: String,
    /// GPUs each cell needs.
    #[serde(default)]
    pub gpus: u32,
    /// Environment: only names a client may set ([`crate::kernel::client_env`]); others are refused.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The user who owns it (the gateway's caller; operators may name anyone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The owner's groups (for group quotas).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owner_groups: Vec<String>,
}

/// `notebookos_refused_total` reason of a kernel placement refused because too few hosts
/// have the host memory for its replicas.
const PLACEMENT_NO_MEMORY: &str = "placement_no_memory";

/// `notebookos_refused_total` reason of a cluster API kernel whose environment is not a client's to set.
const KERNEL_ENV_NOT_ALLOWED: &str = "kernel_env_not_allowed";

/// What any host checks of a [`KernelSpec`] before it is placed: a kernelspec name, an owner
/// any identity source could vouch for (the operator may name anyone, but the owner may become
/// the kernel's system account and is matched against callers' names), and an environment a
/// client may set ([`crate::kernel::client_env`], the gateway's allow-list).
fn check_spec(spec: &KernelSpec) -> Result<()> {
    if spec.name.is_empty() {
        return Err(ClusterError::BadRequest("a kernel needs a kernelspec name".into()));
    }
    if let Some(owner) = &spec.owner {
        crate::users::account_name::check_user_name(owner)
            .map_err(|why| ClusterError::BadRequest(format!("a kernel's owner must be a user's name: {why}")))?;
    }
    let refused = crate::kernel::client_env::refused_names(spec.env.keys());
    if !refused.is_empty() {
        crate::metrics::count_refusal(KERNEL_ENV_NOT_ALLOWED);
        tracing::warn!(names = ?refused, "cluster API: refused a kernel whose environment is not a client's to set");
        return Err(ClusterError::BadRequest(format!(
            "a client may not set {} in a kernel's environment (only KERNEL_* and JPY_SESSION_NAME)",
            refused.join(", ")
        )));
    }
    Ok(())
}

/// Placement found no room (here, or on the meta leader the call was forwarded to).
fn is_placement_refusal(e: &ClusterError) -> bool {
    match e {
        ClusterError::Placement(_) => true,
        ClusterError::Remote { status: 409, message, .. } => message.contains(super::error::PLACEMENT_REFUSAL),
        _ => false,
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Cluster {
    /// The raft group of every kernel record, read linearizably (through the meta leader):
    /// a group this host holds that is not here belongs to a deleted kernel, even right
    /// after a restart, when this host's own replica of the meta group may still be behind.
    pub async fn kernel_groups(&self) -> Result<BTreeSet<u64>> {
        let kvs = self.meta.range(keys::KERNELS, 0).await?;
        let mut groups = BTreeSet::new();
        for kv in &kvs {
            let record: KernelRecord =
                records::decode(&kv.key, &kv.value).map_err(|e| ClusterError::Conflict(e.to_string()))?;
            groups.insert(record.group);
        }
        Ok(groups)
    }

    /// Hosts as placement sees them: live hosts that are not draining, with the
    /// subscriptions the kernel records place on them (a move's target included) and
    /// their memory for kernels ([`super::memory::host_memory_mib`]).
    pub(super) async fn host_loads(&self) -> Result<Vec<HostLoad>> {
        let hosts = self.hosts().await?;
        let kernels = self.kernels().await?;
        let draining = self.draining_hosts().await?;
        let loads = self.loads().await?;
        Ok(hosts
            .iter()
            .filter(|h| !draining.contains(&h.node_id))
            .map(|h| {
                let mine = kernels.iter().filter(|k| k.hosts().contains(&h.node_id));
                let (mut subscribed, mut replicas) = (0u32, 0u32);
                for k in mine {
                    subscribed = subscribed.saturating_add(k.gpus);
                    replicas = replicas.saturating_add(1);
                }
                let (memory_capacity_mib, memory_used_mib) = memory::host_memory_mib(h.node_id, &loads, &kernels);
                HostLoad {
                    node_id: h.node_id,
                    gpus_total: u32::try_from(h.gpus.len()).unwrap_or(u32::MAX),
                    subscribed_gpus: subscribed,
                    replicas,
                    memory_capacity_mib,
                    memory_used_mib,
                }
            })
            .collect())
    }

    /// Creates a kernel: places its replicas on `replicas` distinct live hosts (on the meta
    /// leader, forwarded there when this host is not it) and commits its record.
    /// While placement finds no room and `placement_wait` lasts (an autoscaler adds hosts),
    /// it tries again every second.
    pub async fn create_kernel(&self, spec: KernelSpec) -> Result<KernelRecord> {
        check_spec(&spec)?;
        let deadline = Instant::now() + self.settings.placement_wait;
        loop {
            let placed = self
                .on_leader(HttpMethod::Post, "/api/v1/cluster/kernels", Some(&spec), Authority::Host, || {
                    self.create_kernel_here(spec.clone())
                })
                .await;
            match placed {
                Err(e) if is_placement_refusal(&e) && Instant::now() < deadline => {
                    tracing::debug!(error = %e, "no room for a new kernel yet; waiting for the autoscaler");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                other => return other,
            }
        }
    }

    /// [`Cluster::create_kernel`] on this host, which must be the meta leader.
    pub async fn create_kernel_here(&self, spec: KernelSpec) -> Result<KernelRecord> {
        self.require_leader().await?;
        // Forwarded requests come from other hosts' API: checked again here, where records are written.
        check_spec(&spec)?;
        let id = spec.id.clone().unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        // Ids become raft keys, and directory and cgroup names on every replica host.
        if !crate::kernel::is_kernel_id(&id) {
            return Err(ClusterError::BadRequest(format!("kernel id {id:?} is not a lowercase hyphenated UUID")));
        }
        let _placing = self.placing.lock().await;
        let hosts = self.host_loads().await?;
        // A new kernel's namespace is empty: its replicas need what an idle kernel does.
        let chosen = placement::place_with_memory(
            &hosts,
            spec.gpus,
            memory::NEW_REPLICA_MIB,
            usize::try_from(self.settings.replicas).unwrap_or(usize::MAX),
            self.settings.subscription_ratio,
        )
        .inspect_err(|e| {
            if matches!(e, placement::PlacementError::NoMemory { .. }) {
                crate::metrics::count_refusal(PLACEMENT_NO_MEMORY);
            }
            // A GPU-less kernel refused (for memory, or too few hosts) is unmet demand too:
            // at least one unit, or the autoscaler would never see it.
            self.demand.note_refused(spec.gpus.saturating_mul(self.settings.replicas).max(1));
        })?;
        let group = self.allocate_kernel_group().await?;
        let record = KernelRecord {
            group,
            id: id.clone(),
            name: spec.name,
            gpus: spec.gpus,
            replicas: chosen.iter().zip(1u32..).map(|(&node_id, replica)| ReplicaRecord { replica, node_id }).collect(),
            created_ms: now_ms(),
            env: spec.env,
            moving: None,
            owner: spec.owner,
            owner_groups: spec.owner_groups,
        };
        let out = self.meta.cas(keys::kernel(&id), None, records::encode(&record)).await?;
        if !out.succeeded {
            return Err(ClusterError::Conflict(format!("kernel {id} already exists")));
        }
        tracing::info!(kernel = %id, hosts = ?chosen, gpus = record.gpus, "kernel placed");
        Ok(record)
    }

    /// A kernel group id no kernel has had: the meta group's counter, moved on by
    /// compare-and-swap (a number lost to a failed create is never handed out again).
    async fn allocate_kernel_group(&self) -> Result<u64> {
        let in_use: BTreeSet<u64> = self.kernels().await?.iter().map(|k| k.group).collect();
        for _ in 0..5 {
            let out = self.meta.get_stale(keys::NEXT_KERNEL_GROUP).await?;
            let current = out.kvs.first().map(|kv| kv.value.clone());
            let counter = match &current {
                Some(v) => Some(
                    records::decode::<u64>(keys::NEXT_KERNEL_GROUP.as_bytes(), v)
                        .map_err(|e| ClusterError::Conflict(e.to_string()))?,
                ),
                None => None,
            };
            let group = records::next_kernel_group(counter, &in_use);
            let cas =
                self.meta.cas(keys::NEXT_KERNEL_GROUP, current, records::encode(&group.saturating_add(1))).await?;
            if cas.succeeded {
                return Ok(group);
            }
        }
        Err(ClusterError::Conflict("the kernel group counter kept changing; try again".into()))
    }

    /// Deletes a kernel's record (its replicas' hosts stop them); true when it existed.
    pub async fn delete_kernel(&self, id: &str) -> Result<bool> {
        let path = format!("/api/v1/cluster/kernels/{id}");
        let deleted: serde_json::Value = self
            .on_leader(HttpMethod::Delete, &path, None::<&()>, Authority::Host, || async {
                let existed = self.meta.delete(keys::kernel(id)).await?;
                Ok(serde_json::json!({ "deleted": existed }))
            })
            .await?;
        Ok(deleted.get("deleted").and_then(serde_json::Value::as_bool).unwrap_or(false))
    }

    /// Re-places the replica of `kernel` on `dead_node` on a live host that does not hold the
    /// kernel yet (new replica number). Runs on the meta leader (forwarded when needed).
    /// Returns the new record, the record unchanged when `dead_node` holds no replica of it,
    /// and `None` when no host can take the replica now.
    pub async fn replace_replica(&self, kernel: &str, dead_node: u64) -> Result<Option<KernelRecord>> {
        let path = format!("/api/v1/cluster/kernels/{kernel}/replace");
        let body = serde_json::json!({ "node_id": dead_node });
        self.on_leader(HttpMethod::Post, &path, Some(&body), Authority::Host, || {
            self.replace_replica_here(kernel, dead_node)
        })
        .await
    }

    /// [`Cluster::replace_replica`] on this host, which must be the meta leader. A move under
    /// way ends here too: one whose source died is finished (its target takes the dead
    /// replica's place), one whose target died is dropped.
    pub async fn replace_replica_here(&self, kernel: &str, dead_node: u64) -> Result<Option<KernelRecord>> {
        self.require_leader().await?;
        let _placing = self.placing.lock().await;
        let hosts = self.host_loads().await?;
        let memory_mib = memory::expected_replica_mib(&self.loads().await?, kernel);
        let (record, written) = self
            .modify_kernel(kernel, |record| {
                let mut new = record.clone();
                if let Some(m) = record.moving.as_ref().filter(|m| m.from == dead_node || m.to == dead_node) {
                    new.moving = None;
                    if m.from == dead_node {
                        for r in new.replicas.iter_mut().filter(|r| r.node_id == dead_node) {
                            *r = ReplicaRecord { replica: m.new_replica, node_id: m.to };
                        }
                    }
                    return Ok(Some(new));
                }
                if !record.replicas.iter().any(|r| r.node_id == dead_node) {
                    return Ok(None);
                }
                let exclude = record.hosts();
                let Some(new_node) = placement::replace_with_memory(
                    &hosts,
                    record.gpus,
                    memory_mib,
                    self.settings.subscription_ratio,
                    &exclude,
                ) else {
                    return Ok(None);
                };
                let next = record.replicas.iter().map(|r| r.replica).max().unwrap_or(0) + 1;
                for r in new.replicas.iter_mut().filter(|r| r.node_id == dead_node) {
                    *r = ReplicaRecord { replica: next, node_id: new_node };
                }
                Ok(Some(new))
            })
            .await?;
        if written {
            let hosts = record.hosts();
            tracing::info!(kernel, dead_node, ?hosts, "replica re-placed");
        }
        // Unchanged with the dead host still in it: nowhere to go now.
        Ok((!record.replicas.iter().any(|r| r.node_id == dead_node)).then_some(record))
    }

    /// Reads `kernel`'s record and commits `change(record)` by compare-and-swap (`None`: leave
    /// it), again from the new record if another write got there first. Returns the record as
    /// it is now, and whether this call wrote it.
    pub(super) async fn modify_kernel(
        &self,
        kernel: &str,
        mut change: impl FnMut(&KernelRecord) -> Result<Option<KernelRecord>>,
    ) -> Result<(KernelRecord, bool)> {
        for _ in 0..5 {
            let out = self.meta.get_stale(keys::kernel(kernel)).await?;
            let Some(kv) = out.kvs.first() else { return Err(ClusterError::NoSuchKernel(kernel.to_owned())) };
            let record: KernelRecord =
                records::decode(&kv.key, &kv.value).map_err(|e| ClusterError::Conflict(e.to_string()))?;
            let Some(new) = change(&record)? else { return Ok((record, false)) };
            let cas = self.meta.cas(keys::kernel(kernel), Some(kv.value.clone()), records::encode(&new)).await?;
            if cas.succeeded {
                return Ok((new, true));
            }
        }
        Err(ClusterError::Conflict(format!("kernel {kernel}: its record kept changing; try again")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_recognised_here_and_when_forwarded() {
        let e = ClusterError::Placement(placement::PlacementError::TooFewHosts { needed: 3, up: 1, hosts_up: vec![1] });
        assert!(is_placement_refusal(&e));
        let forwarded = ClusterError::Remote { url: "https://h".into(), status: 409, message: e.to_string() };
        assert!(is_placement_refusal(&forwarded));
        let other = ClusterError::Conflict("kernel k already exists".into());
        assert!(!is_placement_refusal(&other));
    }

    #[test]
    fn an_owner_must_be_a_users_name() {
        let spec =
            |owner: &str| KernelSpec { name: "python3".into(), owner: Some(owner.into()), ..KernelSpec::default() };
        assert!(check_spec(&spec("alice")).is_ok());
        assert!(check_spec(&spec("j.doe")).is_ok());
        assert!(check_spec(&KernelSpec { name: "python3".into(), ..KernelSpec::default() }).is_ok(), "no owner");
        for (owner, want) in [
            ("../root", "POSIX account name"),
            ("Alice", "POSIX account name"),
            ("", "POSIX"),
            ("node-2", "hosts"),
            ("operator", "reserved"),
        ] {
            match check_spec(&spec(owner)) {
                Err(ClusterError::BadRequest(why)) => {
                    assert!(why.contains("owner") && why.contains(want), "{owner:?}: {why}");
                }
                other => panic!("{owner:?}: expected a bad request, got {other:?}"),
            }
        }
    }
}
