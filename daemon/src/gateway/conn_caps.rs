//! The HTTP listener's connection caps (`http.max_connections`, in all, and
//! `http.max_connections_per_source`, per source address): a connection takes a slot at
//! accept, before its TLS handshake or first byte, and gives it back when it closes or
//! becomes a WebSocket (those count under `limits.websocket_connections`). A connection
//! over a cap is closed at once and counted in `notebookos_refused_total{reason}`.
//!
//! Without them a client that opens connections and never finishes a request made the
//! daemon hold each one's buffers until memory ran out (issue 29).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex, MutexGuard};

/// `notebookos_refused_total` reason of `http.max_connections`.
pub const REFUSED_TOTAL: &str = "http_connections";
/// `notebookos_refused_total` reason of `http.max_connections_per_source`.
pub const REFUSED_PER_SOURCE: &str = "http_connections_per_source";

/// A connection refused at a cap.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnRefused {
    /// `http.max_connections`.
    #[error("{cap} HTTP connections are open (http.max_connections)")]
    Total {
        /// The cap.
        cap: usize,
    },
    /// `http.max_connections_per_source`.
    #[error("{cap} HTTP connections are open from {from} (http.max_connections_per_source)")]
    PerSource {
        /// The source (an IPv6 /64 as its first address).
        from: IpAddr,
        /// The cap.
        cap: usize,
    },
}

impl ConnRefused {
    /// The `reason` label of `notebookos_refused_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            ConnRefused::Total { .. } => REFUSED_TOTAL,
            ConnRefused::PerSource { .. } => REFUSED_PER_SOURCE,
        }
    }
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    per_source: HashMap<IpAddr, usize>,
}

/// The counters behind the caps.
#[derive(Debug)]
pub struct ConnCaps {
    max_total: usize,
    max_per_source: usize,
    open: Mutex<Open>,
}

/// The source a connection counts against: its IPv4 address, or its IPv6 /64 (one
/// machine commonly holds a whole /64).
fn source_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !u128::from(u64::MAX))),
        },
    }
}

impl ConnCaps {
    /// Caps of `max_total` connections, `max_per_source` from one source.
    pub fn new(max_total: usize, max_per_source: usize) -> Arc<Self> {
        Arc::new(Self { max_total, max_per_source, open: Mutex::default() })
    }

    fn lock(&self) -> MutexGuard<'_, Open> {
        // Plain counters: a panic while one was held leaves them usable.
        self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes a slot for a connection from `ip`, or says which cap is reached (and counts it).
    pub fn open(self: &Arc<Self>, ip: IpAddr) -> Result<ConnSlot, ConnRefused> {
        let source = source_of(ip);
        let mut open = self.lock();
        let refused = if open.total >= self.max_total {
            Some(ConnRefused::Total { cap: self.max_total })
        } else if open.per_source.get(&source).copied().unwrap_or(0) >= self.max_per_source {
            Some(ConnRefused::PerSource { from: source, cap: self.max_per_source })
        } else {
            None
        };
        if let Some(refused) = refused {
            drop(open);
            crate::metrics::count_refusal(refused.reason());
            // Debug: under attack this line would come thousands of times a second.
            tracing::debug!(peer = %ip, "refused a connection: {refused}");
            return Err(refused);
        }
        open.total += 1;
        *open.per_source.entry(source).or_default() += 1;
        Ok(ConnSlot { caps: self.clone(), source })
    }

    /// Open connections (all, from `ip`'s source).
    pub fn open_now(&self, ip: IpAddr) -> (usize, usize) {
        let open = self.lock();
        (open.total, open.per_source.get(&source_of(ip)).copied().unwrap_or(0))
    }
}

/// One open connection's place; it comes back when dropped.
#[derive(Debug)]
pub struct ConnSlot {
    caps: Arc<ConnCaps>,
    source: IpAddr,
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let mut open = self.caps.lock();
        open.total = open.total.saturating_sub(1);
        if let Some(n) = open.per_source.get_mut(&self.source) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.per_source.remove(&self.source);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn connections_are_capped_per_source_and_in_all_and_slots_come_back() {
        let caps = ConnCaps::new(3, 2);
        let a1 = caps.open(ip("10.0.0.1")).expect("a1");
        let _a2 = caps.open(ip("10.0.0.1")).expect("a2");
        let err = caps.open(ip("10.0.0.1")).expect_err("third from a");
        assert_eq!(err.reason(), REFUSED_PER_SOURCE);
        assert!(err.to_string().contains("http.max_connections_per_source"), "{err}");
        let _b1 = caps.open(ip("10.0.0.2")).expect("another source");
        assert_eq!(caps.open(ip("10.0.0.3")).expect_err("fourth in all").reason(), REFUSED_TOTAL);
        drop(a1);
        assert_eq!(caps.open_now(ip("10.0.0.1")), (2, 1));
        caps.open(ip("10.0.0.1")).expect("a's slot came back");
    }

    #[test]
    fn an_ipv6_64_is_one_source_and_mapped_ipv4_is_its_ipv4() {
        let caps = ConnCaps::new(10, 1);
        let _a = caps.open(ip("2001:db8:1:2::1")).expect("first of the /64");
        assert!(caps.open(ip("2001:db8:1:2:ffff::9")).is_err(), "same /64");
        caps.open(ip("2001:db8:1:3::1")).expect("another /64");
        let _v4 = caps.open(ip("192.0.2.7")).expect("ipv4");
        assert!(caps.open(ip("::ffff:192.0.2.7")).is_err(), "the same address, IPv4-mapped");
    }
}
