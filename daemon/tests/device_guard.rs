//! `gpu.device_guard = "ebpf"` through the lease server: a kernel's processes may open the
//! device file of a GPU while the kernel holds a lease on it, and not before or after. The
//! GPU device files are made with mknod (no GPU needed): a refused open fails with `EPERM`
//! (the kernel's cgroup), an allowed one gets past the cgroup and fails with `ENXIO` (no
//! driver behind major 195 here). Root only; under NBOS_REQUIRE_PRIVILEGED=1 it must run.

mod required;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use nbos_lease_proto::{read_message, write_message, Message};
use notebookosd::gpu::control::GpuControl;
use notebookosd::gpu::GpuInfo;
use notebookosd::kernel::device_cgroup::{self, DeviceCgroups, DeviceGuardMetrics, UpdateLabels};
use notebookosd::lease::metrics::LeaseMetrics;
use notebookosd::lease::table::Policy;
use notebookosd::lease::{KernelProcess, LeaseServer, LeaseServerConfig, LeaseState};

const KERNEL: &str = "3e5b7a10-2c4d-4e6f-8a9b-0c1d2e3f4a5b";
const WAIT: Duration = Duration::from_secs(10);

fn mknod(path: &Path, minor: u32) {
    let c = CString::new(path.as_os_str().as_bytes()).expect("path");
    // SAFETY: mknod reads the NUL-terminated path and integers only.
    let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(195, minor)) };
    assert_eq!(rc, 0, "mknod {}: {}", path.display(), std::io::Error::last_os_error());
}

/// Opens each of `paths` from a child process that first joins the cgroup of `procs`, as a
/// kernel process does; 0 for an open that succeeded, else its errno.
fn errnos_in_cgroup(procs: &Path, paths: &[&Path]) -> Vec<i32> {
    let procs = CString::new(procs.as_os_str().as_bytes()).expect("procs");
    let paths: Vec<CString> = paths.iter().map(|p| CString::new(p.as_os_str().as_bytes()).expect("path")).collect();
    let mut fds = [0i32; 2];
    // SAFETY: pipe writes two fds into our array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child only makes async-signal-safe calls (open, write, close, _exit) on
    // memory prepared before the fork.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: see above.
        unsafe {
            libc::close(fds[0]);
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
            if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                libc::_exit(2);
            }
            libc::close(fd);
            for p in &paths {
                let fd = libc::open(p.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
                let errno = if fd >= 0 {
                    libc::close(fd);
                    0
                } else {
                    *libc::__errno_location()
                };
                libc::write(fds[1], (&raw const errno).cast(), 4);
            }
            libc::_exit(0);
        }
    }
    // SAFETY: our copy of the write end.
    unsafe { libc::close(fds[1]) };
    let mut bytes = Vec::new();
    let mut buf = [0u8; 64];
    loop {
        // SAFETY: read into a local buffer from our read end.
        let n = unsafe { libc::read(fds[0], buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        bytes.extend_from_slice(&buf[..n as usize]);
    }
    let mut status = 0;
    // SAFETY: our own child and fd.
    unsafe {
        libc::waitpid(pid, &mut status, 0);
        libc::close(fds[0]);
    }
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child could not join the cgroup: {status}");
    bytes.chunks_exact(4).map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn gpu(index: u32) -> GpuInfo {
    GpuInfo {
        index,
        uuid: notebookosd::gpu::inventory::fake_gpu_uuid(index),
        name: "fake".into(),
        memory_mib: 1024,
        simulated: true,
    }
}

#[test]
fn a_kernel_opens_its_leased_gpu_only_while_the_lease_is_held() {
    const TEST: &str = "a_kernel_opens_its_leased_gpu_only_while_the_lease_is_held";
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return required::cannot_run(TEST, "needs root (mknod, cgroup, BPF)");
    }
    let Some(mount) = device_cgroup::cgroup2_mount(Path::new("/sys/fs/cgroup")) else {
        return required::cannot_run(TEST, "no cgroup v2 mount");
    };
    let guard_metrics = DeviceGuardMetrics::default();
    let dc = match DeviceCgroups::load(&mount, vec![0, 1], guard_metrics.clone()) {
        Ok(dc) => Arc::new(dc),
        Err(e) => return required::cannot_run(TEST, &e.to_string()),
    };
    let procs = dc.prepare(KERNEL, None).expect("kernel cgroup");

    let dir = tempfile::tempdir().expect("tempdir");
    let metrics = LeaseMetrics::default();
    let cfg = LeaseServerConfig {
        socket: dir.path().join("lease.sock"),
        policy: Policy { idle_grace: Duration::from_secs(60), idle_release: Duration::from_secs(600) },
        activity_interval: Duration::from_millis(0),
        memory_limit_bytes: 0,
        driver_path: dir.path().join("libcuda.so.1"),
    };
    let server = LeaseServer::start(cfg, vec![gpu(0), gpu(1)], GpuControl::new(None, metrics.clone()), metrics)
        .expect("lease server");
    let hook_target = dc.clone();
    server.set_device_hook(Arc::new(move |kernel, gpus| hook_target.set_gpus(kernel, gpus)));

    let nodes = tempfile::tempdir().expect("tempdir");
    let (gpu0, gpu1) = (nodes.path().join("nvidia0"), nodes.path().join("nvidia1"));
    mknod(&gpu0, 0);
    mknod(&gpu1, 1);
    let null = Path::new("/dev/null");
    let all: [&Path; 3] = [&gpu0, &gpu1, null];

    // No lease yet: neither GPU opens.
    assert_eq!(errnos_in_cgroup(&procs, &all), vec![libc::EPERM, libc::EPERM, 0], "before any lease");

    // This test process stands in for the kernel's shim; the scheduler assigned it GPU 0.
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let me = std::process::id();
    server.register_process(KernelProcess { kernel_id: KERNEL.into(), replica: 0, pid: me, uid, gpus: 1 });
    server.assign(KERNEL, vec![0]);
    let mut s = UnixStream::connect(server.socket()).expect("connect");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    write_message(&mut s, &Message::Register { kernel_id: KERNEL.into(), replica: 0, pid: me }).expect("send");
    assert!(matches!(read_message(&mut s), Ok(Message::Registered { device_count: 1, .. })));
    write_message(&mut s, &Message::Request { gpus: 1 }).expect("send");
    let lease = match read_message(&mut s).expect("grant") {
        Message::Grant { lease, .. } => lease,
        other => panic!("expected a grant, got {other:?}"),
    };

    // While the lease is held: GPU 0 gets past the cgroup (no driver: ENXIO), GPU 1 does not.
    assert_eq!(errnos_in_cgroup(&procs, &all), vec![libc::ENXIO, libc::EPERM, 0], "lease on GPU 0");

    // Revoked and released: GPU 0 is refused again.
    server.revoke(me);
    assert!(matches!(read_message(&mut s), Ok(Message::Revoke { .. })));
    write_message(&mut s, &Message::Released { lease }).expect("send");
    assert!(server.wait_until(WAIT, |st| st.iter().any(|p| p.pid == me && p.state == LeaseState::Unbound)));
    assert_eq!(errnos_in_cgroup(&procs, &all), vec![libc::EPERM, libc::EPERM, 0], "after the release");

    let updates = |c: &str| guard_metrics.updates.get_or_create(&UpdateLabels { change: c.into() }).get();
    assert_eq!((updates("grant"), updates("release"), updates("failed")), (1, 1, 0));
    dc.refresh_metrics();
    assert!(guard_metrics.denials.get() >= 5, "denials counted: {}", guard_metrics.denials.get());
    drop(s);
    dc.remove(KERNEL);
    assert!(!procs.exists(), "the kernel's cgroup is removed with it");
}
