//! `gpu.device_guard = "ebpf"` through the lease server: a kernel's processes may open the
//! device file of a GPU while the kernel holds a lease on it, and not before or after. The
//! GPU device files are made with mknod (no GPU needed): a refused open fails with `EPERM`
//! (the kernel's cgroup), an allowed one gets past the cgroup and fails with `ENXIO` (no
//! driver behind major 195 here). Root only; under NBOS_REQUIRE_PRIVILEGED=1 it must run.

#[path = "../../ebpf/tests/support/cgroup_child.rs"]
mod cgroup_child;
mod required;

use cgroup_child::{errnos_in_cgroup, mknod};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use nbos_ebpf::NVIDIA_MAJOR;
use nbos_lease_proto::{read_message, write_message, Message};
use notebookosd::gpu::control::GpuControl;
use notebookosd::gpu::GpuInfo;
use notebookosd::kernel::device_cgroup::{self, DeviceCgroups, DeviceGuardMetrics, UpdateLabels};
use notebookosd::lease::metrics::LeaseMetrics;
use notebookosd::lease::table::Policy;
use notebookosd::lease::{KernelProcess, LeaseServer, LeaseServerConfig, LeaseState};

const KERNEL: &str = "3e5b7a10-2c4d-4e6f-8a9b-0c1d2e3f4a5b";
const WAIT: Duration = Duration::from_secs(10);

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
    mknod(&gpu0, NVIDIA_MAJOR, 0);
    mknod(&gpu1, NVIDIA_MAJOR, 1);
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
