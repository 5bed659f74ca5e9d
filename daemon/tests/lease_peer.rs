//! The lease server's peer check against pid reuse: a process that got the pid of a kernel
//! process that exited is not that kernel, though `SO_PEERCRED` gives the same pid. The test
//! makes the kernel's pid be reused (root: `/proc/sys/kernel/ns_last_pid`), has the new process
//! register as the kernel, and checks it is refused with a clear reason and counted, and that
//! a live kernel process still registers.

mod required;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use nbos_lease_proto::{decode, encode, read_message, write_message, Message};
use notebookosd::gpu::control::GpuControl;
use notebookosd::lease::metrics::{LeaseMetrics, RefusedLabels};
use notebookosd::lease::table::Policy;
use notebookosd::lease::{LeaseServer, LeaseServerConfig, RegisteredProcess};

const DEAD_KERNEL: &str = "0b9c6f1e-6d0e-4c52-9a43-3f1f2c4d5e6f";
const LIVE_KERNEL: &str = "5d2a8c3b-1e4f-4a6b-8c7d-9e0f1a2b3c4d";
const WAIT: Duration = Duration::from_secs(10);

fn server(dir: &Path, metrics: &LeaseMetrics) -> LeaseServer {
    let cfg = LeaseServerConfig {
        socket: dir.join("lease.sock"),
        policy: Policy { idle_grace: Duration::from_secs(60), idle_release: Duration::from_secs(600) },
        activity_interval: Duration::from_millis(100),
        memory_limit_bytes: 0,
        driver_path: dir.join("libcuda.so.1"),
    };
    LeaseServer::start(cfg, Vec::new(), GpuControl::new(None, metrics.clone()), metrics.clone()).expect("lease server")
}

fn kernel(id: &str, pid: u32) -> RegisteredProcess {
    // SAFETY: getuid cannot fail.
    RegisteredProcess { kernel_id: id.into(), replica: 0, pid, uid: unsafe { libc::getuid() }, gpus: 0 }
}

/// Forks a child that gets pid `pid` (the next pid is set through `ns_last_pid`; retried while
/// other processes take it first), registers on `socket` as kernel `kernel_id` with its own
/// pid, and hands back the server's reply. `Err` when the pid could not be had.
fn register_from_reused_pid(socket: &Path, pid: u32, kernel_id: &str) -> Result<Message, String> {
    let mut frame = Vec::new();
    encode(&Message::Register { kernel_id: kernel_id.into(), replica: 0, pid }, &mut frame);
    let path = CString::new(socket.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: a zeroed sockaddr_un is valid; the path fits (a temp dir path, checked below).
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_bytes_with_nul();
    if bytes.len() > addr.sun_path.len() {
        return Err("socket path too long".into());
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    for _ in 0..200 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string())
            .map_err(|e| format!("cannot set /proc/sys/kernel/ns_last_pid: {e}"))?;
        let mut fds = [0i32; 2];
        // SAFETY: pipe writes two fds into our array.
        if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
            return Err(std::io::Error::last_os_error().to_string());
        }
        // SAFETY: the child makes only async-signal-safe syscalls on memory prepared before
        // the fork (frame, addr, a stack buffer) and leaves with _exit.
        let child = unsafe { libc::fork() };
        if child == 0 {
            // SAFETY: see above.
            unsafe {
                libc::close(fds[0]);
                if libc::getpid() as u32 != pid {
                    libc::_exit(9);
                }
                let s = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
                if s < 0 || libc::connect(s, (&raw const addr).cast(), len) != 0 {
                    libc::_exit(2);
                }
                libc::write(s, frame.as_ptr().cast(), frame.len());
                // One read: the reply is one frame in one write, and an accepted connection
                // (the bug this test looks for) stays open, so reading to EOF would hang.
                let mut buf = [0u8; 1024];
                let n = libc::read(s, buf.as_mut_ptr().cast(), buf.len());
                if n > 0 {
                    libc::write(fds[1], buf.as_ptr().cast(), n as usize);
                }
                libc::_exit(0);
            }
        }
        // SAFETY: closing our copy of the write end.
        unsafe { libc::close(fds[1]) };
        let mut reply = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            // SAFETY: read into a local buffer from our read end.
            let n = unsafe { libc::read(fds[0], buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                break;
            }
            reply.extend_from_slice(&buf[..n as usize]);
        }
        let mut status = 0;
        // SAFETY: our own child; our own fd.
        unsafe {
            libc::waitpid(child, &mut status, 0);
            libc::close(fds[0]);
        }
        match libc::WEXITSTATUS(status) {
            9 => continue, // another process took the pid first
            0 => {
                return decode(&reply)
                    .map_err(|e| e.to_string())?
                    .map(|(m, _)| m)
                    .ok_or_else(|| format!("no complete reply: {reply:?}"))
            }
            other => return Err(format!("the child could not connect (exit {other})")),
        }
    }
    Err("the pid was always taken by another process first".into())
}

#[test]
fn a_process_that_reuses_an_exited_kernels_pid_is_refused_and_a_live_kernel_still_registers() {
    const TEST: &str = "a_process_that_reuses_an_exited_kernels_pid_is_refused_and_a_live_kernel_still_registers";
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return required::cannot_run(TEST, "needs root to choose the next pid (/proc/sys/kernel/ns_last_pid)");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics = LeaseMetrics::default();
    let server = server(dir.path(), &metrics);

    // A kernel process registers, then exits (and is reaped): its pid is free for reuse.
    let mut dead = std::process::Command::new("sleep").arg("30").spawn().expect("spawn sleep");
    let pid = dead.id();
    server.register_process(kernel(DEAD_KERNEL, pid));
    dead.kill().expect("kill");
    dead.wait().expect("reap");

    let reply = match register_from_reused_pid(server.socket(), pid, DEAD_KERNEL) {
        Ok(m) => m,
        Err(why) => return required::cannot_run(TEST, &why),
    };
    match reply {
        Message::Refused { reason } => {
            assert!(
                reason.contains(&format!("pid {pid} was kernel {DEAD_KERNEL}'s process, which exited"))
                    && reason.contains("reused"),
                "{reason}"
            );
        }
        other => panic!("a process with a reused pid was accepted: {other:?}"),
    }
    let refused = |r: &str| metrics.refused.get_or_create(&RefusedLabels { reason: r.into() }).get();
    assert_eq!(refused("pid_reused"), 1);

    // The legitimate path: a live, registered kernel process registers.
    server.register_process(kernel(LIVE_KERNEL, std::process::id()));
    let mut s = std::os::unix::net::UnixStream::connect(server.socket()).expect("connect");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    write_message(&mut s, &Message::Register { kernel_id: LIVE_KERNEL.into(), replica: 0, pid: std::process::id() })
        .expect("send");
    match read_message(&mut s).expect("reply") {
        Message::Registered { driver_path, .. } => {
            assert_eq!(Path::new(&driver_path), dir.path().join("libcuda.so.1"), "the reply names the driver");
        }
        other => panic!("a live kernel process was not registered: {other:?}"),
    }
    assert_eq!(refused("pid_reused"), 1);
    assert_eq!(refused("unregistered"), 0);
}
