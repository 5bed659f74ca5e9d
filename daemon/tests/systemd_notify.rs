//! What systemd hears from the daemon (`Type=notify`, `NotifyAccess=main`, `WatchdogSec=`):
//! the test plays the service manager, with a `NOTIFY_SOCKET` of its own that reads each
//! datagram's sender credentials (as systemd does, to drop what the main PID did not send).
//! READY=1 once the API answers, a STATUS= line, WATCHDOG=1 at about half of
//! `WATCHDOG_USEC` (and none when `WATCHDOG_PID` names another process), STOPPING=1 on
//! SIGTERM after the last ping and before the daemon exits.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nbos_test_support::{http, signal, start_daemon, Daemon};

/// One notification: its sender's pid (SCM_CREDENTIALS) and its `KEY=value` lines.
#[derive(Debug)]
struct Notification {
    pid: i32,
    lines: Vec<String>,
}

impl Notification {
    fn has(&self, line: &str) -> bool {
        self.lines.iter().any(|l| l == line)
    }
}

/// The service manager's end: a datagram socket that receives its senders' credentials.
struct NotifySocket(UnixDatagram);

impl NotifySocket {
    fn bind(path: &Path) -> Self {
        let socket = UnixDatagram::bind(path).expect("bind the notify socket");
        let on: libc::c_int = 1;
        // SAFETY: setsockopt(2) on our own socket with a c_int option of the right size.
        let rc = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PASSCRED,
                (&raw const on).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "SO_PASSCRED: {}", std::io::Error::last_os_error());
        Self(socket)
    }

    /// The next notification, or `None` if none comes by `deadline`.
    fn next(&self, deadline: Instant) -> Option<Notification> {
        let left = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())?;
        self.0.set_read_timeout(Some(left)).expect("read timeout");
        let mut buf = [0u8; 4096];
        // Room for one SCM_CREDENTIALS message (CMSG_SPACE of a ucred), u64-aligned.
        let mut control = [0u64; 8];
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        // SAFETY: an all-zero msghdr is valid; the fields set below point at live buffers.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control);
        // SAFETY: recvmsg(2) into the buffers `msg` describes, which outlive the call.
        let n = unsafe { libc::recvmsg(self.0.as_raw_fd(), &raw mut msg, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            assert!(matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut), "recvmsg: {e}");
            return None;
        }
        let len = usize::try_from(n).expect("length");
        let text = String::from_utf8_lossy(&buf[..len]);
        let mut pid = 0;
        // SAFETY: CMSG_FIRSTHDR/CMSG_NXTHDR walk the control buffer recvmsg filled in and
        // `msg` describes; a SCM_CREDENTIALS message's data is a ucred.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&raw const msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_CREDENTIALS {
                    pid = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::ucred>()).pid;
                }
                c = libc::CMSG_NXTHDR(&raw const msg, c);
            }
        }
        Some(Notification { pid, lines: text.lines().map(str::to_owned).collect() })
    }

    /// Notifications until one has `line` (returned last), failing the test after `within`.
    fn until(&self, line: &str, within: Duration) -> Vec<Notification> {
        let deadline = Instant::now() + within;
        let mut seen = Vec::new();
        loop {
            let n = self.next(deadline).unwrap_or_else(|| panic!("no {line} within {within:?}; got {seen:?}"));
            let done = n.has(line);
            seen.push(n);
            if done {
                return seen;
            }
        }
    }

    /// Every notification that arrives within `window`.
    fn during(&self, window: Duration) -> Vec<Notification> {
        let deadline = Instant::now() + window;
        std::iter::from_fn(|| self.next(deadline)).collect()
    }
}

/// A daemon (no GPUs, no kernels) whose environment has `NOTIFY_SOCKET=socket`,
/// `WATCHDOG_USEC=watchdog_usec` and `WATCHDOG_PID`: its own pid, or `other_pid`.
fn start(socket: &Path, watchdog_usec: u64, other_pid: Option<u32>) -> Daemon {
    // The shell sets WATCHDOG_PID to its own pid ($$), which exec hands to the daemon.
    let watchdog_pid = other_pid.map_or_else(|| "$$".to_owned(), |p| p.to_string());
    let shell = format!(
        "NOTIFY_SOCKET={} WATCHDOG_USEC={watchdog_usec} WATCHDOG_PID={watchdog_pid} exec \"$0\" \"$@\"",
        socket.display()
    );
    start_daemon(&["sh", "-c", &shell], Stdio::inherit(), |c| {
        c.fake_gpus(1);
    })
}

#[test]
fn systemd_hears_ready_status_watchdog_pings_and_stopping_from_the_main_pid() {
    let dir = tempfile::tempdir().expect("tmp");
    let socket = NotifySocket::bind(&dir.path().join("notify"));
    let mut d = start(&dir.path().join("notify"), 1_000_000, None);
    let main_pid = i32::try_from(d.child.id()).expect("pid");

    let until_ready = socket.until("READY=1", Duration::from_secs(30));
    // The API answers once systemd is told the daemon is ready (Type=notify's promise: READY=1
    // comes when its listener is bound, so a client's connection waits at most for serve()).
    let (code, body) = http("GET", &format!("{}/healthz", d.url), None, None);
    assert_eq!(code, 200, "/healthz after READY=1: {body}");
    let ready = until_ready.last().expect("READY=1");
    let status = ready.lines.iter().find(|l| l.starts_with("STATUS=")).expect("a STATUS= line with READY=1");
    assert!(status.contains(&d.url) && status.contains("1 GPU"), "{status}");

    // WATCHDOG_USEC=1s: pings keep coming (about every 0.5 s; how often is the daemon's
    // business, not this test's: a deadline, not a rate, on a loaded machine).
    let mut window = Vec::new();
    for n in 1..=3 {
        let seen = socket.until("WATCHDOG=1", Duration::from_secs(30));
        assert!(seen.last().is_some_and(|p| p.has("WATCHDOG=1")), "WATCHDOG=1 number {n}: {seen:?}");
        window.extend(seen);
    }

    signal::term(&d.child);
    let stopping = socket.until("STOPPING=1", Duration::from_secs(30));
    let last = stopping.last().expect("STOPPING=1");
    assert!(last.lines.iter().any(|l| l.starts_with("STATUS=stopping")), "{last:?}");
    let exit = d.child.wait().expect("wait");
    assert!(exit.success(), "the daemon exits cleanly on SIGTERM: {exit}");
    // Nothing after STOPPING=1 (no late ping a manager would take for a live service).
    let after = socket.during(Duration::from_secs(1));
    assert!(after.is_empty(), "after STOPPING=1: {after:?}");

    // NotifyAccess=main: systemd drops what another process sends; everything came from
    // the daemon itself.
    let all = until_ready.iter().chain(&window).chain(&stopping);
    for n in all {
        assert_eq!(n.pid, main_pid, "sent by pid {}, not the daemon's {main_pid}: {:?}", n.pid, n.lines);
    }
}

#[test]
fn a_watchdog_meant_for_another_pid_is_not_fed() {
    let dir = tempfile::tempdir().expect("tmp");
    let socket = NotifySocket::bind(&dir.path().join("notify"));
    // PID 1: systemd's WATCHDOG_PID names the main process; here it is someone else's.
    let d = start(&dir.path().join("notify"), 1_000_000, Some(1));
    socket.until("READY=1", Duration::from_secs(30));
    let window = socket.during(Duration::from_secs(3));
    assert!(!window.iter().any(|n| n.has("WATCHDOG=1")), "pinged another process's watchdog: {window:?}");
    drop(d);
}
