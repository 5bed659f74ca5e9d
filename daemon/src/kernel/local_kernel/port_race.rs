//! Whether a kernel's start lost one of its ports to another process (the ports are
//! picked free, then bound by the kernel a moment later): such a start is tried again
//! with fresh ports, up to [`START_ATTEMPTS`] times.

/// Starts of a new kernel tried when it lost one of its ports to another process.
pub(super) const START_ATTEMPTS: u32 = 3;

/// Whether a start that failed with `err` lost one of its ports to another process: another
/// process listens on one of the kernel's ports (the daemon does not connect to it; the
/// kernel's own bind fails a moment later), the daemon reached a socket of another type
/// there, or the kernel log gained a failed bind after `offset`.
pub(super) fn lost_a_port_race(err: &anyhow::Error, log: &std::path::Path, offset: u64) -> bool {
    err.chain().any(|c| c.is::<crate::kernel::port_owner::PortTaken>())
        || reached_another_socket(err)
        || log_shows_failed_bind(log, offset)
}

/// Whether `err` comes from a ZMQ handshake with a socket type ours cannot talk to.
fn reached_another_socket(err: &anyhow::Error) -> bool {
    err.chain().any(|c| {
        matches!(c.downcast_ref::<zeromq::ZmqError>(), Some(zeromq::ZmqError::Other(m)) if m.contains("not compatible"))
    })
}

/// Whether the kernel log gained a failed bind (`zmq.error.ZMQError: Address already in
/// use`) after `offset`.
fn log_shows_failed_bind(log: &std::path::Path, offset: u64) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(log) else { return false };
    let mut tail = Vec::new();
    // The tail a start writes is a traceback of a few KiB; read at most 1 MiB of it.
    let needle = b"Address already in use";
    f.seek(SeekFrom::Start(offset)).is_ok()
        && f.take(1 << 20).read_to_end(&mut tail).is_ok()
        && tail.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_bind_failure_written_after_the_start_counts_as_a_lost_port_race() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("kernel.log");
        std::fs::write(&log, "zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:1')\n").expect("write");
        let before = std::fs::metadata(&log).expect("metadata").len();
        assert!(!log_shows_failed_bind(&log, before), "an earlier start's failure is not this one's");
        std::fs::write(&log, "ModuleNotFoundError: No module named 'ipykernel'\n").expect("write");
        assert!(!log_shows_failed_bind(&log, 0), "another failure is reported, not retried");
        let mut text = std::fs::read(&log).expect("read");
        let offset = text.len() as u64;
        text.extend_from_slice(b"\xff\xfe zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:2')\n");
        std::fs::write(&log, &text).expect("write");
        assert!(log_shows_failed_bind(&log, offset));
        assert!(!log_shows_failed_bind(&dir.path().join("missing.log"), 0));
    }

    /// CI: the daemon connected to a port another kernel had just taken (a PUB where it
    /// expected a ROUTER) before this kernel's failed bind reached its log.
    #[test]
    fn reaching_another_processs_socket_on_a_kernel_port_counts_as_a_lost_port_race() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("kernel.log");
        let other = anyhow::Error::new(zeromq::ZmqError::Other("Provided sockets combination is not compatible"))
            .context("connecting to the kernel at port 40000")
            .context("starting the kernel");
        assert!(lost_a_port_race(&other, &log, 0));
        let refused = anyhow::Error::new(zeromq::ZmqError::Other("No reply from server")).context("connecting");
        assert!(!lost_a_port_race(&refused, &log, 0), "another failure is reported, not retried");
    }
}
