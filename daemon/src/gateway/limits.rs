//! The caps of `[limits]` that need counting: open WebSocket connections (per kernel and
//! in all), bytes of WebSocket messages in flight, and kernels (per credential and in
//! all). Pure bookkeeping: the handlers ask
//! for a slot before they take the resource, and the slot gives it back when dropped.
//! Every refusal is a [`Refused`] that names its config key and is counted in
//! `notebookos_refused_total{reason}`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::LimitsConfig;

/// A request refused at a cap.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// `limits.websocket_connections_per_kernel`.
    #[error("too many WebSocket connections to kernel {kernel}: {cap} are open (limits.websocket_connections_per_kernel); close one first")]
    ConnectionsPerKernel {
        /// The kernel.
        kernel: String,
        /// The cap.
        cap: usize,
    },
    /// `limits.websocket_connections`.
    #[error("too many WebSocket connections: {cap} are open on this host (limits.websocket_connections)")]
    Connections {
        /// The cap.
        cap: usize,
    },
    /// `limits.websocket_inflight_bytes`.
    #[error("no room for a {size}-byte WebSocket message: up to {cap} bytes of messages are handled at once on this host (limits.websocket_inflight_bytes); retry")]
    InflightBytes {
        /// The message's size.
        size: usize,
        /// The budget.
        cap: usize,
    },
    /// `limits.kernels_per_token`.
    #[error("kernel limit of this credential reached: it created {cap} kernels that still exist (limits.kernels_per_token); delete one first")]
    KernelsPerToken {
        /// The cap.
        cap: usize,
    },
    /// `limits.kernels`.
    #[error("kernel limit reached: {cap} kernels exist (limits.kernels); delete one first")]
    Kernels {
        /// The cap.
        cap: usize,
    },
}

impl Refused {
    /// The `reason` label of `notebookos_refused_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Refused::ConnectionsPerKernel { .. } => "websocket_connections_per_kernel",
            Refused::Connections { .. } => "websocket_connections",
            Refused::InflightBytes { .. } => "websocket_inflight_bytes",
            Refused::KernelsPerToken { .. } => "kernels_per_token",
            Refused::Kernels { .. } => "kernels",
        }
    }

    fn counted(self) -> Self {
        crate::metrics::count_refusal(self.reason());
        tracing::warn!(reason = self.reason(), "{self}");
        self
    }
}

impl From<Refused> for super::error::ApiError {
    /// 429: the client may retry once it closed a connection or deleted a kernel.
    fn from(e: Refused) -> Self {
        Self { status: axum::http::StatusCode::TOO_MANY_REQUESTS, message: e.to_string() }
    }
}

/// Who created a kernel, for `limits.kernels_per_token`. Today the API has one users'
/// credential (the token, or a client certificate of the same standing), so every kernel
/// created through the gateway counts against it.
pub const USERS_CREDENTIAL: &str = "users";

#[derive(Debug, Default)]
struct Sockets {
    total: usize,
    per_kernel: HashMap<String, usize>,
}

#[derive(Debug, Default)]
struct Created {
    /// Kernel ids each credential created (pruned against the live kernels at each create).
    by_credential: HashMap<String, HashSet<String>>,
    /// Creates under way, by credential (their kernels are not live yet).
    in_flight: HashMap<String, usize>,
}

/// The counters behind the caps.
#[derive(Debug)]
pub struct Limits {
    /// The caps.
    pub config: LimitsConfig,
    sockets: Mutex<Sockets>,
    created: Mutex<Created>,
    /// One permit a byte of `limits.websocket_inflight_bytes`.
    inflight: Arc<Semaphore>,
}

/// How long a WebSocket message waits for room in `limits.websocket_inflight_bytes`.
pub const INFLIGHT_WAIT: Duration = Duration::from_secs(5);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain counters: a panic while one was held leaves them usable.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Limits {
    /// Counters for `config`.
    pub fn new(config: LimitsConfig) -> Arc<Self> {
        // Validation keeps the budget within u32 (the semaphore's permit counts).
        let bytes = config.websocket_inflight_bytes.min(Semaphore::MAX_PERMITS);
        Arc::new(Self {
            config,
            sockets: Mutex::default(),
            created: Mutex::default(),
            inflight: Arc::new(Semaphore::new(bytes)),
        })
    }

    /// Takes room for a client message of `size` bytes in `limits.websocket_inflight_bytes`,
    /// waiting up to `wait` for other messages to be handled; the room comes back when the
    /// permit drops.
    pub async fn reserve_message(&self, size: usize, wait: Duration) -> Result<MessagePermit, Refused> {
        let cap = self.config.websocket_inflight_bytes;
        let refused = || Refused::InflightBytes { size, cap }.counted();
        // An empty message still takes a place: the budget also bounds the count.
        let Ok(n) = u32::try_from(size.max(1)) else { return Err(refused()) };
        if size > cap {
            return Err(refused());
        }
        match tokio::time::timeout(wait, self.inflight.clone().acquire_many_owned(n)).await {
            Ok(Ok(permit)) => Ok(MessagePermit { _permit: permit }),
            // Timed out (or the semaphore closed, which it never is).
            _ => Err(refused()),
        }
    }

    /// Takes a WebSocket connection slot for `kernel`, or says which cap is reached.
    pub fn open_socket(self: &Arc<Self>, kernel: &str) -> Result<SocketSlot, Refused> {
        let mut s = lock(&self.sockets);
        if s.total >= self.config.websocket_connections {
            return Err(Refused::Connections { cap: self.config.websocket_connections }.counted());
        }
        let mine = s.per_kernel.get(kernel).copied().unwrap_or(0);
        if mine >= self.config.websocket_connections_per_kernel {
            let cap = self.config.websocket_connections_per_kernel;
            return Err(Refused::ConnectionsPerKernel { kernel: kernel.to_owned(), cap }.counted());
        }
        s.total += 1;
        s.per_kernel.insert(kernel.to_owned(), mine + 1);
        Ok(SocketSlot { limits: self.clone(), kernel: kernel.to_owned() })
    }

    /// Open WebSocket connections (all, to `kernel`).
    pub fn sockets_open(&self, kernel: &str) -> (usize, usize) {
        let s = lock(&self.sockets);
        (s.total, s.per_kernel.get(kernel).copied().unwrap_or(0))
    }

    /// Reserves the creation of one kernel by `credential`, given the ids of the kernels
    /// that exist now (`live`), or says which cap is reached. The reservation holds a
    /// place until it is [`KernelReservation::created`] or dropped (a failed create).
    pub fn reserve_kernel(
        self: &Arc<Self>,
        credential: &str,
        live: &HashSet<String>,
    ) -> Result<KernelReservation, Refused> {
        let mut c = lock(&self.created);
        let in_flight_total: usize = c.in_flight.values().sum();
        if live.len() + in_flight_total >= self.config.kernels {
            return Err(Refused::Kernels { cap: self.config.kernels }.counted());
        }
        let mine = c.by_credential.entry(credential.to_owned()).or_default();
        mine.retain(|id| live.contains(id));
        let mine = mine.len() + c.in_flight.get(credential).copied().unwrap_or(0);
        if mine >= self.config.kernels_per_token {
            return Err(Refused::KernelsPerToken { cap: self.config.kernels_per_token }.counted());
        }
        *c.in_flight.entry(credential.to_owned()).or_default() += 1;
        Ok(KernelReservation { limits: self.clone(), credential: credential.to_owned() })
    }
}

/// One open WebSocket connection; its slot comes back when dropped.
#[derive(Debug)]
pub struct SocketSlot {
    limits: Arc<Limits>,
    kernel: String,
}

impl Drop for SocketSlot {
    fn drop(&mut self) {
        let mut s = lock(&self.limits.sockets);
        s.total = s.total.saturating_sub(1);
        if let Some(n) = s.per_kernel.get_mut(&self.kernel) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                s.per_kernel.remove(&self.kernel);
            }
        }
    }
}

/// Room for one WebSocket message in `limits.websocket_inflight_bytes`, given back when dropped.
#[derive(Debug)]
pub struct MessagePermit {
    _permit: OwnedSemaphorePermit,
}

/// A kernel being created within the caps.
#[derive(Debug)]
pub struct KernelReservation {
    limits: Arc<Limits>,
    credential: String,
}

impl KernelReservation {
    /// The kernel exists: it counts against the credential from now on (until it is gone).
    pub fn created(self, kernel_id: &str) {
        let mut c = lock(&self.limits.created);
        c.by_credential.entry(self.credential.clone()).or_default().insert(kernel_id.to_owned());
        // The in-flight place goes when `self` drops, after this lock is released.
    }
}

impl Drop for KernelReservation {
    fn drop(&mut self) {
        let mut c = lock(&self.limits.created);
        if let Some(n) = c.in_flight.get_mut(&self.credential) {
            *n = n.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(per_kernel: usize, total: usize, per_token: usize, kernels: usize) -> Arc<Limits> {
        Limits::new(LimitsConfig {
            websocket_connections_per_kernel: per_kernel,
            websocket_connections: total,
            kernels_per_token: per_token,
            kernels,
            ..LimitsConfig::default()
        })
    }

    #[test]
    fn sockets_are_capped_per_kernel_and_in_all_and_slots_come_back() {
        let l = limits(2, 3, 10, 10);
        let a1 = l.open_socket("a").expect("a1");
        let _a2 = l.open_socket("a").expect("a2");
        let err = l.open_socket("a").expect_err("third to a");
        assert_eq!(err.reason(), "websocket_connections_per_kernel");
        assert!(err.to_string().contains("limits.websocket_connections_per_kernel"), "{err}");
        let _b1 = l.open_socket("b").expect("b1");
        assert_eq!(l.open_socket("c").expect_err("fourth in all").reason(), "websocket_connections");
        drop(a1);
        assert_eq!(l.sockets_open("a"), (2, 1));
        l.open_socket("a").expect("a slot came back");
    }

    #[test]
    fn kernels_are_capped_per_credential_and_in_all() {
        let l = limits(1, 1, 2, 3);
        let mut live: HashSet<String> = HashSet::new();
        for id in ["k1", "k2"] {
            l.reserve_kernel(USERS_CREDENTIAL, &live).expect("within").created(id);
            live.insert(id.to_owned());
        }
        let err = l.reserve_kernel(USERS_CREDENTIAL, &live).expect_err("third by the same credential");
        assert_eq!(err.reason(), "kernels_per_token");
        // Another credential may still create one, up to the total.
        let other = l.reserve_kernel("operator", &live).expect("other credential");
        assert_eq!(l.reserve_kernel("third", &live).expect_err("total, counting in-flight").reason(), "kernels");
        drop(other);
        // A deleted kernel no longer counts.
        live.remove("k1");
        l.reserve_kernel(USERS_CREDENTIAL, &live).expect("after a delete");
    }

    #[tokio::test]
    async fn messages_in_flight_share_the_byte_budget() {
        let l = Limits::new(LimitsConfig {
            websocket_max_message_bytes: 100,
            websocket_inflight_bytes: 150,
            ..LimitsConfig::default()
        });
        let wait = Duration::from_millis(20);
        let first = l.reserve_message(100, wait).await.expect("room for the first");
        let err = l.reserve_message(100, wait).await.expect_err("no room left for a second");
        assert_eq!(err.reason(), "websocket_inflight_bytes");
        assert!(err.to_string().contains("limits.websocket_inflight_bytes"), "{err}");
        let _small = l.reserve_message(50, wait).await.expect("what is left still fits");
        assert!(l.reserve_message(151, wait).await.is_err(), "larger than the whole budget");
        drop(first);
        l.reserve_message(100, wait).await.expect("the room came back");
    }

    #[test]
    fn a_failed_create_gives_its_place_back() {
        let l = limits(1, 1, 1, 1);
        let live = HashSet::new();
        drop(l.reserve_kernel(USERS_CREDENTIAL, &live).expect("first"));
        l.reserve_kernel(USERS_CREDENTIAL, &live).expect("the place came back");
    }
}
