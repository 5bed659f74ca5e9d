//! The meta leader's driver of replica moves ([`crate::cluster::control::records::MoveRecord`]): it
//! finishes a move once the target's new replica is ready (caught up with the kernel's
//! group) and the source replica is quiesced (runs no cell and yields new ones, so no
//! cell is lost when it stops), and aborts one whose target died or never became ready.
//! A move whose source host died is finished by the re-placement of that host's replicas
//! (`Cluster::replace_replica_here`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::meta::Cluster;

/// How often the leader looks at the moves under way.
const DRIVE_EVERY: Duration = Duration::from_millis(200);
/// How long a move's target may take to be ready (start a kernel, catch up) before the
/// move is dropped; a front-end whose cell still waits asks for another.
const READY_TIMEOUT: Duration = Duration::from_secs(180);

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Runs on every host; acts while this host leads the meta group.
pub(super) async fn drive_moves(cluster: Arc<Cluster>) {
    loop {
        tokio::time::sleep(DRIVE_EVERY).await;
        if cluster.meta_leader().await != Some(cluster.node_id()) {
            continue;
        }
        let (Ok(hosts), Ok(kernels)) = (cluster.hosts().await, cluster.kernels().await) else { continue };
        let live: BTreeSet<u64> = hosts.iter().map(|h| h.node_id).collect();
        for k in &kernels {
            let Some(m) = &k.moving else { continue };
            if !live.contains(&m.to) {
                if let Err(e) = cluster.abort_move_here(&k.id, "the target host is down").await {
                    tracing::debug!(kernel = %k.id, error = %e, "could not abort a move; retrying");
                }
                continue;
            }
            let ready = cluster.ready_hosts(&k.id).await.is_ok_and(|r| r.contains(&m.to));
            if !ready {
                let age = Duration::from_millis(now_ms().saturating_sub(m.started_ms));
                if age > READY_TIMEOUT {
                    let why = format!("the new replica on host {} was not ready within {READY_TIMEOUT:?}", m.to);
                    if let Err(e) = cluster.abort_move_here(&k.id, &why).await {
                        tracing::debug!(kernel = %k.id, error = %e, "could not abort a move; retrying");
                    }
                }
                continue;
            }
            // A source host that is down runs nothing; its re-placement would finish the move
            // too, after `host_ttl`, but there is no reason to wait.
            let quiesced =
                !live.contains(&m.from) || cluster.quiesced_hosts(&k.id).await.is_ok_and(|q| q.contains(&m.from));
            if quiesced {
                if let Err(e) = cluster.finish_move_here(&k.id).await {
                    tracing::debug!(kernel = %k.id, error = %e, "could not finish a move; retrying");
                }
            }
        }
    }
}
