//! Demand the cluster could not meet, as the meta leader saw it: kernels that placement
//! refused (their replicas' subscribed GPUs) and cells whose every replica yielded with no
//! host to move to (their GPUs). The autoscaler adds the recent peak of each to what the
//! hosts report, so that it scales out for work that has not found a host yet.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Entries kept at most per kind (old ones go first; the window is short anyway).
const KEPT: usize = 1024;

/// Unmet demand, recorded on the meta leader.
#[derive(Debug, Default)]
pub struct Demand {
    refused: Mutex<VecDeque<(Instant, u32)>>,
    waiting: Mutex<VecDeque<(Instant, u32)>>,
}

fn note(q: &Mutex<VecDeque<(Instant, u32)>>, gpus: u32) {
    let mut q = q.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if q.len() >= KEPT {
        q.pop_front();
    }
    q.push_back((Instant::now(), gpus));
}

fn peak(q: &Mutex<VecDeque<(Instant, u32)>>, window: Duration) -> u32 {
    let mut q = q.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    while q.front().is_some_and(|(t, _)| t.elapsed() > window) {
        q.pop_front();
    }
    q.iter().map(|(_, g)| *g).max().unwrap_or(0)
}

impl Demand {
    /// Placement refused a kernel whose replicas subscribe `gpus` GPUs in all.
    pub fn note_refused(&self, gpus: u32) {
        note(&self.refused, gpus);
    }

    /// A cell needing `gpus` GPUs found no replica host and no host to move a replica to.
    pub fn note_waiting(&self, gpus: u32) {
        note(&self.waiting, gpus);
    }

    /// The largest refused subscription and waiting cell within `window` (0 when none).
    pub fn recent(&self, window: Duration) -> (u32, u32) {
        (peak(&self.refused, window), peak(&self.waiting, window))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recent_peak_of_each_kind_and_nothing_older() {
        let d = Demand::default();
        assert_eq!(d.recent(Duration::from_secs(60)), (0, 0));
        d.note_refused(3);
        d.note_refused(6);
        d.note_waiting(2);
        assert_eq!(d.recent(Duration::from_secs(60)), (6, 2));
        assert_eq!(d.recent(Duration::ZERO), (0, 0), "outside the window");
    }
}
