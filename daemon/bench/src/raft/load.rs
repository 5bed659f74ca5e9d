//! What `nbos bench raft` measures a store with, ours or etcd: load loops of clients with
//! one write outstanding each ([`drive`]), their latencies and throughput ([`Phase`]), and
//! free loopback addresses for the nodes.

use std::net::SocketAddr;
use std::time::Instant;

/// A free loopback address for a node (bound, then released).
pub(super) fn free_addr() -> anyhow::Result<SocketAddr> {
    Ok(raft_store::service::free_loopback_addr()?)
}

fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let idx = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    Some(sorted[idx])
}

#[derive(Default)]
pub(super) struct Phase {
    pub(super) ops: u64,
    pub(super) seconds: f64,
    pub(super) latencies_ms: Vec<f64>,
}

impl Phase {
    pub(super) fn throughput(&self) -> f64 {
        if self.seconds > 0.0 {
            self.ops as f64 / self.seconds
        } else {
            0.0
        }
    }
    pub(super) fn p(&mut self, q: f64) -> Option<f64> {
        self.latencies_ms.sort_by(f64::total_cmp);
        percentile(&self.latencies_ms, q)
    }
}

/// Runs `clients` load loops (each returns the latencies of its acknowledged writes, in ms).
pub(super) async fn drive<F, Fut>(clients: usize, make: F) -> Phase
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Vec<f64>> + Send + 'static,
{
    let start = Instant::now();
    let tasks: Vec<_> = (0..clients).map(|c| tokio::spawn(make(c))).collect();
    let mut phase = Phase::default();
    for t in tasks {
        if let Ok(l) = t.await {
            phase.ops += l.len() as u64;
            phase.latencies_ms.extend(l);
        }
    }
    phase.seconds = start.elapsed().as_secs_f64();
    phase
}
