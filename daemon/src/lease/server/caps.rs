//! Caps on lease-socket connections served at once, in total and per peer uid
//! ([`Slots`]), and the rate-limited warning about connections refused for one.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::actor::lock;
use super::config::ConnectionLimits;
use crate::sys::peer_credentials::PeerCred;

/// At most one warning per this interval about connections refused for a cap (a flood
/// would otherwise log a line per connection).
const CAP_WARN_INTERVAL: Duration = Duration::from_secs(10);

/// Which connection cap a new connection is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cap {
    Total,
    PerUid,
}

impl Cap {
    pub(super) fn label(self) -> &'static str {
        match self {
            Cap::Total => "total",
            Cap::PerUid => "per_uid",
        }
    }
}

#[derive(Default)]
pub(super) struct OpenCounts {
    pub(super) total: usize,
    pub(super) by_uid: HashMap<u32, usize>,
}

/// The connections served now, against the caps.
pub(super) struct Slots {
    pub(super) limits: ConnectionLimits,
    pub(super) open: Mutex<OpenCounts>,
    /// `notebookos_lease_connections`.
    pub(super) gauge: prometheus_client::metrics::gauge::Gauge,
}

impl Slots {
    /// Takes a slot for a connection from `uid`, or says which cap is reached.
    pub(super) fn take(self: &Arc<Self>, uid: u32) -> Result<Slot, Cap> {
        let mut open = lock(&self.open);
        // Per uid first: when both caps are reached, the peer's own uid is the likelier flood.
        if open.by_uid.get(&uid).copied().unwrap_or(0) >= self.limits.per_uid {
            return Err(Cap::PerUid);
        }
        if open.total >= self.limits.total {
            return Err(Cap::Total);
        }
        open.total += 1;
        *open.by_uid.entry(uid).or_insert(0) += 1;
        self.gauge.set(i64::try_from(open.total).unwrap_or(i64::MAX));
        Ok(Slot { slots: self.clone(), uid })
    }
}

/// One connection's place under the caps, given back when dropped: by the connection
/// thread on any exit (panic included), or at once if that thread cannot start.
pub(super) struct Slot {
    pub(super) slots: Arc<Slots>,
    pub(super) uid: u32,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = lock(&self.slots.open);
        open.total = open.total.saturating_sub(1);
        if let Entry::Occupied(mut e) = open.by_uid.entry(self.uid) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
        self.slots.gauge.set(i64::try_from(open.total).unwrap_or(i64::MAX));
    }
}

/// Rate limit of the warning about capped connections.
#[derive(Default)]
pub(super) struct CapWarnings {
    pub(super) last: Option<Instant>,
    /// Refusals not logged since `last`.
    pub(super) quiet: u64,
}

impl CapWarnings {
    pub(super) fn refused(&mut self, cred: PeerCred, cap: Cap, limits: ConnectionLimits) {
        let now = Instant::now();
        if self.last.is_some_and(|t| now.duration_since(t) < CAP_WARN_INTERVAL) {
            self.quiet += 1;
            return;
        }
        tracing::warn!(
            uid = cred.uid,
            pid = cred.pid,
            cap = cap.label(),
            total_limit = limits.total,
            per_uid_limit = limits.per_uid,
            also_refused_since_last_warning = self.quiet,
            "lease connection refused: too many open connections"
        );
        self.last = Some(now);
        self.quiet = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::super::config::ConnectionLimits;
    use super::{Cap, OpenCounts, Slots};
    use std::sync::{Arc, Mutex};

    fn slots(total: usize, per_uid: usize) -> Arc<Slots> {
        Arc::new(Slots {
            limits: ConnectionLimits { total, per_uid },
            open: Mutex::new(OpenCounts::default()),
            gauge: prometheus_client::metrics::gauge::Gauge::default(),
        })
    }

    #[test]
    fn slots_cap_per_uid_and_in_total_and_come_back_when_dropped() {
        let s = slots(3, 2);
        let a = s.take(1000).expect("first of uid 1000");
        let _b = s.take(1000).expect("second of uid 1000");
        assert_eq!(s.take(1000).err(), Some(Cap::PerUid));
        let _c = s.take(1001).expect("another uid");
        assert_eq!(s.take(1002).err(), Some(Cap::Total));
        assert_eq!(s.gauge.get(), 3);
        drop(a);
        assert_eq!(s.gauge.get(), 2);
        let _d = s.take(1000).expect("the freed slot is taken again");
    }

    #[test]
    fn a_connection_thread_that_panics_gives_its_slot_back() {
        let s = slots(1, 1);
        let slot = s.take(7).expect("slot");
        let died = std::thread::spawn(move || {
            let _slot = slot;
            panic!("connection handler bug");
        })
        .join();
        assert!(died.is_err());
        assert_eq!(s.gauge.get(), 0);
        assert!(s.take(7).is_ok());
    }
}
