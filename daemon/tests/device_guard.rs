//! `gpu.device_guard = "ebpf"` through the lease server: a kernel's processes may open the
//! device file of a GPU while the kernel holds a lease on it, and not before or after. The
//! GPU device files are made with mknod (no GPU needed): a refused open fails with `EPERM`
//! (the kernel's cgroup), an allowed one gets past the cgroup and fails with `ENXIO` (no
//! driver behind major 195 here). Root only; under NBOS_REQUIRE_PRIVILEGED=1 it must run.

#[path = "../../ebpf/tests/support/cgroup_child.rs"]
mod cgroup_child;
mod required;

use cgroup_child::{errnos_in_cgroup, mknod};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use nbos_ebpf::NVIDIA_MAJOR;
use nbos_lease_proto::{read_message, write_message, Message};
use notebookosd::gpu::control::GpuControl;
use notebookosd::gpu::GpuInfo;
use notebookosd::kernel::device_cgroup::{self, DeviceCgroups, DeviceGuardMetrics, UpdateLabels};
use notebookosd::lease::metrics::LeaseMetrics;
use notebookosd::lease::table::Policy;
use notebookosd::lease::{LeaseServer, LeaseServerConfig, LeaseState, RegisteredProcess};

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
    server.register_process(RegisteredProcess { kernel_id: KERNEL.into(), replica: 0, pid: me, uid, gpus: 1 });
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

/// The guard against the REAL driver (tests/gpu/run.sh, as root on a GPU host). Asserted: a
/// CUDA process that initialises CUDA while its kernel holds the lease on GPU 0 uses that GPU
/// under the guard, and once the lease is gone a new open of the GPU's device file is
/// refused. Printed as one `GPU_GUARD_RESULT` line, not asserted: what the driver does when
/// it initialises CUDA before any lease and the lease comes later, and whether the files it
/// opened under a lease still work after the revoke (the guard checks open(2), not the
/// ioctls on a file already open). Those are the facts `gpu.device_guard`'s default waits on
/// (docs/security.md).
#[test]
#[ignore = "GPU-only: needs the real driver and root (tests/gpu/run.sh runs it)"]
fn the_real_driver_under_the_device_guard() {
    let driver = std::env::var_os("NBOS_TEST_CUDA_DRIVER")
        .map(PathBuf::from)
        .expect("NBOS_TEST_CUDA_DRIVER names the real libcuda.so.1 (tests/gpu/run.sh sets it)");
    // SAFETY: geteuid cannot fail.
    assert_eq!(unsafe { libc::geteuid() }, 0, "needs root (cgroup, BPF)");
    let mount = device_cgroup::cgroup2_mount(Path::new("/sys/fs/cgroup")).expect("a cgroup v2 mount");
    let gpu0 = Path::new("/dev/nvidia0");
    let rdev = std::fs::metadata(gpu0).expect("/dev/nvidia0").rdev();
    let dc = DeviceCgroups::load(&mount, vec![libc::minor(rdev)], DeviceGuardMetrics::default()).expect("guard");

    // CUDA initialised before any lease; the lease on GPU 0 comes afterwards.
    let unleased = "6a1c3f52-8d7e-4b90-a1f2-3c4d5e6f7a8b";
    let procs = dc.prepare(unleased, None).expect("kernel cgroup");
    let mut probe = Probe::start(&driver, &procs);
    let init_before_lease = probe.ask("init");
    dc.set_gpus(unleased, &[0]);
    let use_after_late_grant = probe.ask("use");
    probe.exit();
    dc.remove(unleased);

    // CUDA initialised under the lease on GPU 0; then the lease is revoked.
    let leased = "7b2d4e63-9e8f-4ca1-b2e3-4d5e6f7a8b9c";
    let procs = dc.prepare(leased, None).expect("kernel cgroup");
    dc.set_gpus(leased, &[0]);
    let mut probe = Probe::start(&driver, &procs);
    let init_under_lease = probe.ask("init");
    let use_under_lease = probe.ask("use");
    dc.set_gpus(leased, &[]);
    let use_after_revoke = probe.ask("use");
    let new_open_after_revoke = errnos_in_cgroup(&procs, &[gpu0]);
    probe.exit();
    dc.remove(leased);

    println!(
        "GPU_GUARD_RESULT {}",
        serde_json::json!({
            "init_before_lease": init_before_lease,
            "use_after_late_grant": use_after_late_grant,
            "init_under_lease": init_under_lease,
            "use_under_lease": use_under_lease,
            "use_after_revoke_with_files_open": use_after_revoke,
            "new_open_after_revoke_errno": new_open_after_revoke,
        })
    );
    assert_eq!(init_under_lease["rc"], 0, "cuInit under the lease: {init_under_lease}");
    assert!(init_under_lease["count"].as_i64() >= Some(1), "the leased GPU is listed: {init_under_lease}");
    assert_eq!(use_under_lease["rc"], 0, "the leased GPU is usable under the guard: {use_under_lease}");
    assert_eq!(new_open_after_revoke, vec![libc::EPERM], "after the revoke the device file does not open");
}

/// `tests/gpu/guard_probe.py` in a kernel's cgroup, driven one command at a time.
struct Probe {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Probe {
    /// Starts the probe and moves it into the cgroup whose `cgroup.procs` is `procs` before
    /// it loads the driver (it does so at `init`).
    fn start(driver: &Path, procs: &Path) -> Self {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/gpu/guard_probe.py");
        let python = std::env::var("NBOS_PYTHON").unwrap_or_else(|_| "python3".into());
        let mut child = Command::new(python)
            .arg(script)
            .arg(driver)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the probe");
        std::fs::write(procs, child.id().to_string()).expect("move the probe into the kernel's cgroup");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Self { child, stdin, stdout }
    }

    fn ask(&mut self, command: &str) -> serde_json::Value {
        writeln!(self.stdin, "{command}").expect("write to the probe");
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read from the probe");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("probe answered {line:?} to {command}: {e}"))
    }

    fn exit(mut self) {
        let _ = writeln!(self.stdin, "exit");
        let status = self.child.wait().expect("wait for the probe");
        assert!(status.success(), "probe exited with {status}");
    }
}
