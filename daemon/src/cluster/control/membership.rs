//! Membership: this host's heartbeat (host and load records on a store lease), learning
//! other hosts' raft addresses, and — on the meta leader — re-placing the replicas of
//! hosts that stayed down. [`Cluster::start`] is here: it opens the meta group and spawns
//! these tasks, so that the handle ([`super::meta`]) never calls up into them.
//!
//! A host is up exactly while its `hosts/{id}` record exists. The record is attached to
//! a lease of `host_ttl` renewed every `host_ttl / 3`; when the lease is lost (a
//! partition longer than the TTL, a new meta leader that did not hear from the host in
//! time) the heartbeat grants a new one and puts the records again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use raft_store::{Error as StoreError, WatchEventKind};

use super::meta::{Cluster, PeerRecord, PEERS};
use super::records::{self, keys, HostRecord};

/// How often the load is compared with the last published one (written only when it
/// changed: two writes per cell at most). Front-ends pre-select executors from it, so a GPU
/// freed by a finished cell should show within a round trip or so.
const LOAD_EVERY: Duration = Duration::from_millis(100);

impl Cluster {
    /// Starts the background work: meta group bootstrap (or recovery), heartbeat and load
    /// publishing, peer discovery, and re-placement of lost replicas while this host leads.
    /// Returns at once: a cluster without a quorum leaves the host up and not ready.
    pub fn start(self: &Arc<Self>) {
        let this = self.clone();
        let main = tokio::spawn(async move {
            if let Err(e) = this.bootstrap().await {
                tracing::error!(error = %e, "cannot open the meta group; this host stays out of the cluster");
                return;
            }
            let tasks = [
                tokio::spawn(heartbeat(this.clone())),
                tokio::spawn(learn_peers(this.clone())),
                tokio::spawn(replace_lost_replicas(this.clone())),
                tokio::spawn(super::moves::drive_moves(this.clone())),
            ];
            if let Ok(mut t) = this.tasks.lock() {
                t.extend(tasks);
            }
        });
        if let Ok(mut t) = self.tasks.lock() {
            t.push(main);
        }
    }
}

/// This host's record, as it heartbeats it.
pub fn host_record(cluster: &Cluster) -> HostRecord {
    let s = cluster.settings();
    HostRecord {
        node_id: s.node_id,
        name: s.name.clone(),
        gateway_url: s.gateway_url.clone(),
        raft_addr: s.raft_addr,
        gpus: s.gpus.clone(),
        memory_bytes: s.memory_bytes,
        version: env!("CARGO_PKG_VERSION").to_owned(),
    }
}

/// Grants a lease and puts the host record, the load record and the ready marks on it.
async fn register(cluster: &Cluster) -> Result<u64, StoreError> {
    let meta = cluster.meta();
    let me = cluster.node_id();
    let lease = meta.lease_grant(cluster.settings().host_ttl).await?;
    let put = async {
        meta.put_with_lease(keys::host(me), records::encode(&host_record(cluster)), lease).await?;
        let load = cluster.local_load().await;
        meta.put_with_lease(keys::load(me), records::encode(&load), lease).await?;
        let ready: Vec<String> = cluster.state.lock().map(|s| s.ready.iter().cloned().collect()).unwrap_or_default();
        for k in ready {
            meta.put_with_lease(keys::ready(&k, me), Vec::new(), lease).await?;
        }
        if let Ok(mut st) = cluster.state.lock() {
            st.lease = Some(lease);
            st.last_load = Some(load);
        }
        Ok::<(), StoreError>(())
    };
    if let Err(e) = put.await {
        // Do not leave a half-registered lease behind to expire on its own.
        let _ = meta.lease_revoke(lease).await;
        return Err(e);
    }
    Ok(lease)
}

/// This host is a voter or learner of the meta group as far as its own replica knows.
async fn is_member(cluster: &Cluster) -> bool {
    let me = cluster.node_id();
    cluster
        .store()
        .status(super::records::META_GROUP)
        .await
        .is_ok_and(|s| s.membership.voters.contains(&me) || s.membership.learners.contains(&me))
}

/// The heartbeat: keeps this host's lease alive, re-registers when it was lost, and
/// publishes the load when it changes. Runs until the host leaves or shuts down.
async fn heartbeat(cluster: Arc<Cluster>) {
    let ttl = cluster.settings().host_ttl;
    let renew_every = ttl / 3;
    let tick = renew_every.min(LOAD_EVERY);
    let mut last_renewal = Instant::now();
    let mut failures = 0u32;
    loop {
        if cluster.state.lock().map(|s| s.left).unwrap_or(true) {
            return;
        }
        let lease = cluster.host_lease();
        match lease {
            None if !is_member(&cluster).await => {
                // A host outside the seeds waits for `nbos cluster join`; a removed host stays out.
                if failures.is_multiple_of(50) {
                    tracing::info!(
                        node = cluster.node_id(),
                        "not a member of the meta group (yet): add it with `nbos cluster join`"
                    );
                }
                failures += 1;
                tokio::time::sleep(tick).await;
                continue;
            }
            None => match register(&cluster).await {
                Ok(lease) => {
                    tracing::info!(
                        node = cluster.node_id(),
                        lease = format!("{lease:#x}"),
                        "host registered in the cluster"
                    );
                    last_renewal = Instant::now();
                    failures = 0;
                }
                Err(e) => {
                    failures += 1;
                    // Expected while the meta group elects its first leader.
                    if failures % 10 == 1 {
                        tracing::info!(error = %e, "cannot register this host yet; retrying");
                    }
                    tokio::time::sleep(tick).await;
                    continue;
                }
            },
            Some(lease) if last_renewal.elapsed() >= renew_every => match cluster.meta().lease_keepalive(lease).await {
                Ok(_) => {
                    last_renewal = Instant::now();
                    failures = 0;
                }
                Err(StoreError::LeaseNotFound(_)) => {
                    tracing::warn!(
                        lease = format!("{lease:#x}"),
                        "host lease lost (expired while unreachable?); registering again"
                    );
                    if let Ok(mut st) = cluster.state.lock() {
                        st.lease = None;
                        st.last_load = None;
                    }
                    continue;
                }
                Err(e) => {
                    failures += 1;
                    if failures % 10 == 1 {
                        tracing::warn!(error = %e, "host lease keepalive failed; retrying");
                    }
                }
            },
            Some(_) => {}
        }
        if let Err(e) = cluster.publish_load().await {
            tracing::debug!(error = %e, "could not publish the load");
        }
        tokio::time::sleep(tick).await;
    }
}

/// Adds every member's raft address to the transport: from `peers/` (durable, written at
/// join) and `hosts/` (live). Seeds are known from the configuration.
async fn learn_peers(cluster: Arc<Cluster>) {
    let meta = cluster.meta().clone();
    let me = cluster.node_id();
    let add = |key: &[u8], value: &[u8]| {
        let addr = if key.starts_with(PEERS.as_bytes()) {
            records::decode::<PeerRecord>(key, value).map(|p| (p.node_id, p.raft_addr))
        } else {
            records::decode::<HostRecord>(key, value).map(|h| (h.node_id, h.raft_addr))
        };
        match addr {
            Ok((id, addr)) if id != me => cluster.store().add_peer(id, addr),
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "skipping a peer record"),
        }
    };
    loop {
        let mut from = 0;
        for prefix in [PEERS, keys::HOSTS] {
            match meta.range_stale(prefix, 0).await {
                Ok(out) => {
                    from = from.max(out.applied_index + 1);
                    for kv in &out.kvs {
                        add(&kv.key, &kv.value);
                    }
                }
                Err(e) => tracing::debug!(error = %e, "cannot read peers yet"),
            }
        }
        // One watch over both prefixes would need a common prefix; two short-lived reads and
        // a watch of each keep it simple: whichever ends first restarts both.
        let (w1, w2) = (meta.watch(PEERS, from).await, meta.watch(keys::HOSTS, from).await);
        let (Ok(mut w1), Ok(mut w2)) = (w1, w2) else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        loop {
            let ev = tokio::select! {
                e = w1.next() => e,
                e = w2.next() => e,
            };
            let Some(ev) = ev else { break };
            if let (WatchEventKind::Put, Some(v)) = (ev.kind, ev.value.as_deref()) {
                add(&ev.key, v);
            }
        }
    }
}

/// On the meta leader: a host whose `hosts/` record has been missing for longer than
/// `host_ttl` loses its replicas to other live hosts ([`Cluster::replace_replica`]). The
/// supervisors on the new hosts start the replicas; the kernel groups' membership change
/// follows from the new record.
async fn replace_lost_replicas(cluster: Arc<Cluster>) {
    let ttl = cluster.settings().host_ttl;
    let every = (ttl / 2).max(Duration::from_millis(100));
    // (kernel, node) → when this leader first saw the replica's host missing.
    let mut missing_since: HashMap<(String, u64), Instant> = HashMap::new();
    let mut no_room_logged: std::collections::HashSet<(String, u64)> = std::collections::HashSet::new();
    loop {
        tokio::time::sleep(every).await;
        if cluster.meta_leader().await != Some(cluster.node_id()) {
            missing_since.clear();
            continue;
        }
        let (Ok(hosts), Ok(kernels)) = (cluster.hosts().await, cluster.kernels().await) else { continue };
        let live: Vec<u64> = hosts.iter().map(|h| h.node_id).collect();
        let mut still_missing = HashMap::new();
        for k in &kernels {
            for r in k.replicas.iter().filter(|r| !live.contains(&r.node_id)) {
                let key = (k.id.clone(), r.node_id);
                let since = missing_since.get(&key).copied().unwrap_or_else(Instant::now);
                still_missing.insert(key, since);
            }
        }
        missing_since = still_missing;
        for ((kernel, node), since) in &missing_since {
            if since.elapsed() < ttl {
                continue;
            }
            match cluster.replace_replica_here(kernel, *node).await {
                Ok(Some(_)) => {
                    no_room_logged.remove(&(kernel.clone(), *node));
                }
                Ok(None) => {
                    if no_room_logged.insert((kernel.clone(), *node)) {
                        tracing::warn!(
                            kernel,
                            dead_node = node,
                            "no live host can take the lost replica; retrying as hosts come up"
                        );
                    }
                }
                Err(e) => tracing::debug!(kernel, error = %e, "re-placement failed; retrying"),
            }
        }
    }
}
