//! Accepting a lease-socket connection (under the caps), authenticating its peer
//! (`SO_PEERCRED`, a pidfd, the registered process tree) and serving its frames under
//! the actor lock.

use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nbos_lease_proto::{read_message, write_message, Message};

use super::actor::{lock, Event, Shared};
use super::caps::{Cap, CapWarnings, Slots};
use crate::lease::metrics::{ConnectionRefusedLabels, LeaseMetrics, RefusedLabels};
use crate::lease::peer;
use crate::sys;
use crate::sys::peer_credentials::PeerCred;

/// How long a new connection may take to send `Register`.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) fn accept_loop(listener: UnixListener, shared: Arc<Shared>, metrics: LeaseMetrics, slots: Arc<Slots>) {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let mut warnings = CapWarnings::default();
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "lease socket accept failed");
                // Do not spin on a persistent error (EMFILE): back off briefly.
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        // Refusals below are written by the acceptor itself, non-blocking: the frame fits
        // the fresh socket's empty buffer, and a peer that never reads cannot stall accepts.
        let cred = match sys::peer_credentials::peer_cred(&stream) {
            Ok(c) => c,
            Err(e) => {
                let _ = stream.set_nonblocking(true);
                refuse(stream, &metrics, "bad_peer", format!("cannot read peer credentials: {e}"));
                continue;
            }
        };
        let slot = match slots.take(cred.uid) {
            Ok(slot) => slot,
            Err(cap) => {
                metrics
                    .connections_refused
                    .get_or_create(&ConnectionRefusedLabels { reason: cap.label().into() })
                    .inc();
                warnings.refused(cred, cap, slots.limits);
                let reason = match cap {
                    Cap::PerUid => {
                        format!("too many lease connections from uid {} (limit {})", cred.uid, slots.limits.per_uid)
                    }
                    Cap::Total => format!("too many lease connections (limit {})", slots.limits.total),
                };
                let mut s = stream;
                let _ = s.set_nonblocking(true);
                let _ = write_message(&mut s, &Message::Refused { reason });
                continue;
            }
        };
        let conn = NEXT.fetch_add(1, Ordering::Relaxed);
        let (sh, m) = (shared.clone(), metrics.clone());
        let spawned = std::thread::Builder::new().name("lease-conn".into()).spawn(move || {
            // Held for the thread's whole life: released however it ends.
            let _slot = slot;
            serve_conn(conn, cred, stream, &sh, &m);
        });
        // On failure the closure, and with it the slot and the stream, is dropped.
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start a lease connection thread");
        }
    }
}

pub(super) fn refuse(mut s: UnixStream, metrics: &LeaseMetrics, reason_label: &str, reason: String) {
    tracing::warn!(reason = %reason, "lease connection refused");
    metrics.refused.get_or_create(&RefusedLabels { reason: reason_label.to_owned() }).inc();
    let _ = write_message(&mut s, &Message::Refused { reason });
    let _ = s.flush();
}

/// Authenticates a connection, then handles its frames (under the actor lock).
pub(super) fn serve_conn(conn: u64, cred: PeerCred, mut s: UnixStream, shared: &Shared, metrics: &LeaseMetrics) {
    let _ = s.set_read_timeout(Some(REGISTER_TIMEOUT));
    let (kernel_id, pid) = match read_message(&mut s) {
        Ok(Message::Register { kernel_id, pid, .. }) => (kernel_id, pid),
        Ok(other) => return refuse(s, metrics, "bad_frame", format!("expected Register, got tag {}", other.tag())),
        Err(e) => return refuse(s, metrics, "bad_frame", e.to_string()),
    };
    // Pinned before /proc is read: while the pidfd's process lives, its pid names nothing else.
    let pidfd = match sys::pidfd::peer_pidfd(&s, cred.pid) {
        Ok(fd) => fd,
        Err(e) => return refuse(s, metrics, "bad_peer", format!("cannot open a pidfd of process {}: {e}", cred.pid)),
    };
    // The nearest registered ancestor that is still the process registered under its pid (a
    // registered kernel process that exited is skipped, even if its pid now names another).
    let (root, stale) = {
        let reg = lock(&shared.registry);
        let mut stale = None;
        let mut root = None;
        for p in peer::lineage(cred.pid) {
            let Some(k) = reg.get(&p).filter(|k| k.process.uid == cred.uid) else { continue };
            if k.pidfd.as_ref().is_some_and(sys::pidfd::is_alive) {
                root = Some(k.process.clone());
                break;
            }
            stale.get_or_insert(k.process.clone());
        }
        (root, stale)
    };
    let Some(root) = root else {
        if let Some(k) = stale {
            return refuse(
                s,
                metrics,
                "pid_reused",
                format!(
                    "process {} is not a kernel process of this host: pid {} was kernel {}'s process, which \
                     exited; the pid was reused",
                    cred.pid, k.pid, k.kernel_id
                ),
            );
        }
        return refuse(
            s,
            metrics,
            "unregistered",
            format!("process {} (uid {}) is not a kernel process of this host", cred.pid, cred.uid),
        );
    };
    if !sys::pidfd::is_alive(&pidfd) {
        return refuse(s, metrics, "peer_exited", format!("process {} exited while it was checked", cred.pid));
    }
    // Its pid as it sees it: ours, or in a kernel's PID namespace its pid there.
    if pid != cred.pid && sys::procfs::innermost_pid(cred.pid) != Some(pid) {
        return refuse(s, metrics, "pid_mismatch", format!("claims pid {pid} but is pid {}", cred.pid));
    }
    if kernel_id != root.kernel_id {
        return refuse(
            s,
            metrics,
            "kernel_mismatch",
            format!("claims kernel {kernel_id:?}, registered as {:?}", root.kernel_id),
        );
    }
    let _ = s.set_read_timeout(None);
    let Ok(writer) = s.try_clone() else { return };
    // From here on the process is known by its pid in the daemon's namespace.
    let pid = cred.pid;
    if !shared.apply(Some(Event::Connected { conn, pid, kernel_id, gpus: root.gpus, writer })) {
        return;
    }
    // A frame arrives in one write; buffered, it is read in one syscall, not two.
    let mut s = std::io::BufReader::with_capacity(1024, s);
    loop {
        match read_message(&mut s) {
            Ok(msg) => {
                if !shared.apply(Some(Event::Frame { conn, msg })) {
                    return;
                }
            }
            Err(e) => {
                tracing::debug!(conn, error = %e, "lease connection ended");
                let _ = shared.apply(Some(Event::Closed { conn }));
                return;
            }
        }
    }
}
