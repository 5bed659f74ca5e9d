//! End to end: programs using the CUDA driver API through the shim (`libcuda.so.1`
//! in a private directory), the daemon's lease server, GPU control, and the fake-cuda
//! TEST DOUBLE as the driver (shared capacity ledger, real checkpoint semantics).
//!
//! With `NBOS_TEST_CUDA_DRIVER=/path/to/libcuda.so.1` (tests/gpu/run.sh on a GPU host)
//! the same tests run against the real driver and the host's GPUs (NVML inventory);
//! checks only the test double can answer (its capacity ledger, fork) are skipped there, and so
//! are the checks that need two GPUs on a 1-GPU host: each skip goes through
//! `required::cannot_run`, which prints why, or fails under `NBOS_REQUIRE_PRIVILEGED=1`.

mod required;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use nbos_lease_proto::{read_message, write_message, Message};
use notebookosd::gpu::checkpoint::DriverCheckpoint;
use notebookosd::gpu::control::GpuControl;
use notebookosd::gpu::inventory::fake_gpu_uuid;
use notebookosd::gpu::metrics::EvictionLabels;
use notebookosd::gpu::process_memory::ProcessGpuMemory;
use notebookosd::gpu::GpuInfo;
use notebookosd::lease::metrics::{LeaseMetrics, RefusedLabels};
use notebookosd::lease::table::Policy;
use notebookosd::lease::{LeaseServer, LeaseServerConfig, LeaseState, ProcessStatus, RegisteredProcess};

const WAIT: Duration = Duration::from_secs(30);
/// A GPU UUID no driver lists (neither the test double's nor a real GPU's).
const UNLISTED_UUID: &str = "GPU-0badc0de-0000-4000-8000-00000000dead";
/// How long a test program may run in all.
const EXIT_WAIT: Duration = Duration::from_secs(120);

/// Where cargo put the dev-dependency cdylibs: next to this test binary.
fn built(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let p = exe.parent().expect("deps dir").join(name);
    assert!(p.exists(), "{} not built (dev-dependency of notebookosd)", p.display());
    p
}

fn programs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../cuda-shim/tests/programs")
}

/// The real driver to test against instead of the test double, if any.
fn real_driver() -> Option<PathBuf> {
    std::env::var_os("NBOS_TEST_CUDA_DRIVER").map(PathBuf::from)
}

struct Host {
    real: bool,
    dir: tempfile::TempDir,
    shim_dir: PathBuf,
    client: PathBuf,
    fake: PathBuf,
    gpus: u32,
    gpu_mib: u64,
    server: LeaseServer,
    metrics: LeaseMetrics,
    /// The fake-cuda capacity ledgers of this host's processes.
    state_dir: PathBuf,
}

/// The fake-cuda state directory this test process's own copy of the test double
/// (loaded as NVML) reads: the driver reads `FAKE_CUDA_STATE_DIR` once per process, so
/// it is set before any host loads the library. Only the host that counts bytes through
/// NVML puts its processes' ledgers there; the others keep theirs private.
fn nvml_state_dir() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir").keep();
        // SAFETY: set once, before this process loads the test double (every host calls this first).
        unsafe { std::env::set_var("FAKE_CUDA_STATE_DIR", &dir) };
        dir
    })
}

/// The value of counter `name` in the Prometheus text of `metrics`.
fn counter_value(metrics: &LeaseMetrics, name: &str) -> u64 {
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in the metrics text:\n{text}"))
}

struct Proc {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Proc {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Next line starting with `prefix` (earlier other lines are kept in `seen`).
    fn expect(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return l,
                Ok(l) => self.seen.push(l),
                Err(_) => panic!("no line starting with {prefix:?}; saw {:?}", self.seen),
            }
        }
    }

    fn has_printed(&mut self, prefix: &str) -> bool {
        while let Ok(l) = self.lines.try_recv() {
            self.seen.push(l);
        }
        self.seen.iter().any(|l| l.starts_with(prefix))
    }

    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").expect("write stdin");
    }

    /// Waits for the process to exit (a hang fails the test instead of hanging it).
    fn wait(mut self) -> (i32, Vec<String>) {
        let deadline = Instant::now() + EXIT_WAIT;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                while let Ok(l) = self.lines.try_recv() {
                    self.seen.push(l);
                }
                panic!("process {} did not exit within {EXIT_WAIT:?}; output {:?}", self.child.id(), self.seen);
            }
            // Collect output meanwhile; this also paces the polling.
            if let Ok(l) = self.lines.recv_timeout(Duration::from_millis(20)) {
                self.seen.push(l);
            }
        };
        self.seen.extend(self.lines.iter());
        (status.code().unwrap_or(-1), self.seen)
    }
}

impl Host {
    fn start(gpus: u32, gpu_mib: u64, idle_grace: Duration) -> Self {
        Self::start_limited(gpus, gpu_mib, idle_grace, 0)
    }

    fn start_limited(gpus: u32, gpu_mib: u64, idle_grace: Duration, memory_limit_bytes: u64) -> Self {
        Self::start_full(gpus, gpu_mib, idle_grace, memory_limit_bytes, false, false)
    }

    /// A host whose inventory names, as GPU 0, a UUID the driver does not list.
    fn start_with_unlisted_gpu(gpus: u32, gpu_mib: u64) -> Self {
        Self::start_full(gpus, gpu_mib, Duration::from_secs(60), 0, false, true)
    }

    /// A host whose GPU control counts evicted/restored bytes through NVML: the test
    /// double's NVML subset (or, on a GPU host, the system's NVML).
    fn start_counting_bytes(gpus: u32, gpu_mib: u64, idle_grace: Duration) -> Self {
        Self::start_full(gpus, gpu_mib, idle_grace, 0, true, false)
    }

    fn start_full(
        gpus: u32,
        gpu_mib: u64,
        idle_grace: Duration,
        memory_limit_bytes: u64,
        nvml_bytes: bool,
        unlisted_gpu0: bool,
    ) -> Self {
        let shared_state = nvml_state_dir();
        let dir = tempfile::tempdir().expect("tempdir");
        let shim_dir = dir.path().join("shim");
        std::fs::create_dir(&shim_dir).expect("mkdir");
        // The daemon's layout: the shim is `<private dir>/libcuda.so.1`.
        std::fs::copy(built("libnbos_cuda_shim.so"), shim_dir.join("libcuda.so.1")).expect("copy shim");
        let real = real_driver();
        let fake = real.clone().unwrap_or_else(|| built("libfake_cuda.so"));
        let client = dir.path().join("driver_client");
        let out = Command::new("cc")
            .args(["-O1", "-Wall", "-pthread", "-o"])
            .arg(&client)
            .arg(programs().join("driver_client.c"))
            .arg("-ldl")
            .output()
            .expect("run cc");
        assert!(out.status.success(), "cc failed: {}", String::from_utf8_lossy(&out.stderr));
        let inventory: Vec<GpuInfo> = if real.is_some() {
            // NBOS_TEST_NVML_LIBRARY lets this real-driver mode itself be rehearsed with the
            // test double (which carries an NVML subset) on a machine without a GPU.
            let nvml = std::env::var_os("NBOS_TEST_NVML_LIBRARY").map(PathBuf::from);
            notebookosd::gpu::inventory::nvml_inventory(nvml.as_deref()).expect("NVML on a GPU host").gpus
        } else {
            (0..gpus)
                .map(|index| GpuInfo {
                    index,
                    uuid: fake_gpu_uuid(index),
                    name: "fake".into(),
                    memory_mib: gpu_mib,
                    simulated: true,
                })
                .collect()
        };
        let mut inventory = inventory;
        if unlisted_gpu0 {
            if let Some(g) = inventory.first_mut() {
                g.uuid = UNLISTED_UUID.to_owned();
            }
        }
        let gpus = inventory.len() as u32;
        let metrics = LeaseMetrics::default();
        let api = DriverCheckpoint::load(&fake).expect("fake-cuda checkpoint API");
        let mut control = GpuControl::new(Some(Box::new(api)), metrics.clone());
        let state_dir = if nvml_bytes {
            // With the real driver, GpuControl already uses the system's NVML, unless a
            // rehearsal names the test double's (NBOS_TEST_NVML_LIBRARY).
            let nvml = match (&real, std::env::var_os("NBOS_TEST_NVML_LIBRARY")) {
                (None, _) => Some(fake.clone()),
                (Some(_), lib) => lib.map(PathBuf::from),
            };
            if let Some(lib) = nvml {
                control = control.with_process_memory(ProcessGpuMemory::open(Some(&lib)).expect("NVML library"));
            }
            shared_state.to_owned()
        } else {
            dir.path().join("fake-state")
        };
        let cfg = LeaseServerConfig {
            socket: dir.path().join("lease.sock"),
            policy: Policy { idle_grace, idle_release: Duration::from_secs(600) },
            activity_interval: Duration::from_millis(20),
            memory_limit_bytes,
            // The shim learns the driver from the registration reply, not its environment.
            driver_path: fake.clone(),
        };
        let server = LeaseServer::start(cfg, inventory, control, metrics.clone()).expect("lease server");
        Self { real: real.is_some(), dir, shim_dir, client, fake, gpus, gpu_mib, server, metrics, state_dir }
    }

    fn command(&self, program: &Path, args: &[&str], kernel: &str) -> Command {
        // `read` holds the process until the test registered its pid; `exec` keeps the pid.
        let mut c = Command::new("sh");
        c.arg("-c").arg("read go && exec \"$0\" \"$@\"").arg(program).args(args);
        c.env("LD_LIBRARY_PATH", &self.shim_dir)
            .env("LD_PRELOAD", self.shim_dir.join("libcuda.so.1"))
            .env("NBOS_LEASE_SOCKET", self.server.socket())
            .env("NBOS_KERNEL_ID", kernel)
            .env("FAKE_CUDA_STATE_DIR", &self.state_dir)
            .env("FAKE_CUDA_GPUS", self.gpus.to_string())
            .env("FAKE_CUDA_GPU_MEMORY_MIB", self.gpu_mib.to_string())
            .env("NBOS_TEST_PTX", programs().join("kernels.ptx"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        c
    }

    /// Starts `program args` as the kernel process of `kernel` (registered unless `register` is false).
    fn spawn_program(&self, program: &Path, args: &[&str], kernel: &str, gpus: u32, register: bool) -> Proc {
        self.spawn_full(program, args, kernel, gpus, register, &[])
    }

    fn spawn_program_env(&self, program: &Path, args: &[&str], kernel: &str, gpus: u32, env: &[(&str, &str)]) -> Proc {
        self.spawn_full(program, args, kernel, gpus, true, env)
    }

    fn spawn_full(
        &self,
        program: &Path,
        args: &[&str],
        kernel: &str,
        gpus: u32,
        register: bool,
        env: &[(&str, &str)],
    ) -> Proc {
        let mut cmd = self.command(program, args, kernel);
        cmd.envs(env.iter().copied());
        let mut child = cmd.spawn().expect("spawn");
        let mut stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    return;
                }
            }
        });
        if register {
            // SAFETY: getuid cannot fail.
            let uid = unsafe { libc::getuid() };
            self.server.register_process(RegisteredProcess {
                kernel_id: kernel.into(),
                replica: 0,
                pid: child.id(),
                uid,
                gpus,
            });
        }
        writeln!(stdin, "go").expect("release the process");
        Proc { child, stdin, lines, seen: Vec::new() }
    }

    fn spawn(&self, args: &[&str], kernel: &str, gpus: u32) -> Proc {
        self.spawn_program(&self.client, args, kernel, gpus, true)
    }

    fn wait_state(&self, pid: u32, want: LeaseState) -> ProcessStatus {
        let ok = self.server.wait_until(WAIT, |s| s.iter().any(|p| p.pid == pid && p.state == want));
        let status = self.server.status();
        assert!(ok, "pid {pid} never reached {want:?}: {status:?}");
        status.into_iter().find(|p| p.pid == pid).expect("present")
    }

    /// Bytes `pid` holds on fake GPU `gpu` (the test double's capacity ledger).
    fn ledger_bytes(&self, gpu: u32, pid: u32) -> u64 {
        let path = self.state_dir.join(format!("{}.ledger", fake_gpu_uuid(gpu)));
        let text = std::fs::read_to_string(path).unwrap_or_default();
        text.lines()
            .filter_map(|l| l.split_once(' '))
            .filter(|(p, _)| p.parse::<u32>().ok() == Some(pid))
            .filter_map(|(_, b)| b.parse::<u64>().ok())
            .sum()
    }
}

#[test]
fn c_program_sees_the_virtual_device_count_gets_errors_for_null_outputs_and_computes() {
    let host = Host::start(2, 64, Duration::from_secs(60));
    let p = host.spawn(&["basic"], "k-basic", 1);
    let (code, lines) = p.wait();
    assert_eq!(code, 0, "{lines:?}");
    assert!(lines.contains(&"COUNT 1".to_owned()), "2 GPUs on the host, 1 leased: {lines:?}");
    let nulls = lines.iter().find(|l| l.starts_with("NULLS")).expect("NULLS line");
    assert!(nulls.split_whitespace().skip(1).all(|c| c != "0"), "NULL outputs must fail: {nulls}");
    assert!(lines.contains(&"SUM 6144.0".to_owned()), "{lines:?}");
}

#[test]
fn memory_info_and_allocations_are_clamped_to_the_hosts_limit() {
    // 10 KiB: the 16 KiB buffer of `basic` does not fit.
    let host = Host::start_limited(1, 64, Duration::from_secs(60), 10 * 1024);
    let p = host.spawn(&["basic"], "k-small", 1);
    let (code, lines) = p.wait();
    assert_ne!(code, 0, "{lines:?}");
    assert!(lines.contains(&"MEMINFO 10240 10240".to_owned()), "{lines:?}");
    let failed = lines.iter().find(|l| l.starts_with("FAILED")).expect("the allocation fails");
    assert!(failed.contains("pAlloc(&x, 4096 * 4) = 2"), "CUDA_ERROR_OUT_OF_MEMORY: {failed}");
}

#[test]
fn every_device_allocation_entry_point_is_held_to_the_hosts_limit() {
    // 8 MiB on a 64 MiB GPU: what fails below fails because of the limit, not the GPU.
    // Sizes are multiples of 2 MiB, so cuMemCreate's granularity holds on a real GPU too.
    const LIMIT: u64 = 8 << 20;
    let host = Host::start_limited(1, 64, Duration::from_secs(60), LIMIT);
    let p = host.spawn(&["limits", &LIMIT.to_string()], "k-limits", 1);
    let (code, lines) = p.wait();
    assert_eq!(code, 0, "{lines:?}");
    assert!(lines.contains(&format!("MEMINFO {LIMIT} {LIMIT}")), "cuMemGetInfo reports the lease's view: {lines:?}");
    assert!(lines.contains(&format!("TOTALMEM {LIMIT}")), "so does cuDeviceTotalMem: {lines:?}");
    let entry_points = [
        "cuMemAlloc",
        "cuMemAllocPitch",
        "cuMemAllocManaged",
        "cuMemAllocAsync",
        "cuMemAllocAsync_ptsz",
        "cuMemAllocFromPoolAsync",
        "cuMemAllocFromPoolAsync_ptsz",
        "cuMemCreate",
    ];
    for name in entry_points {
        let prefix = format!("LIMIT {name} ");
        let line = lines.iter().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("no {prefix}: {lines:?}"));
        // over= half= laid= free= rest= freed= free=
        let v: Vec<i64> = line
            .split_whitespace()
            .skip(2)
            .map(|kv| kv.split_once('=').and_then(|(_, n)| n.parse().ok()).expect("key=number"))
            .collect();
        let [over, half, laid, free_after_half, rest, freed, free_after_free] = v[..] else { panic!("{line}") };
        let limit = LIMIT as i64;
        assert_eq!(over, 2, "over the limit: CUDA_ERROR_OUT_OF_MEMORY: {line}");
        assert_eq!(half, 0, "half the limit fits: {line}");
        assert_eq!(free_after_half, limit - laid, "cuMemGetInfo counts it: {line}");
        assert_eq!(rest, 2, "more than what is left: CUDA_ERROR_OUT_OF_MEMORY: {line}");
        assert_eq!(freed, 0, "{line}");
        assert_eq!(free_after_free, limit, "the free gives it back: {line}");
    }
    let pitched = lines.iter().find(|l| l.starts_with("PITCHED")).expect("PITCHED line");
    assert!(
        pitched.starts_with("PITCHED 2 pitch=") && pitched.ends_with(&format!(" free={LIMIT}")),
        "rows padded past the limit are refused and nothing stays counted: {pitched}"
    );
}

#[test]
fn a_granted_gpu_the_driver_does_not_list_fails_the_call_and_the_host_counts_it() {
    // GPU 0 of the host's inventory is a UUID the driver does not have, and the kernel is
    // assigned it: the context it asks for must fail, not land on the driver's GPU 0.
    let host = Host::start_with_unlisted_gpu(2, 64);
    host.server.assign("k-unlisted", vec![0]);
    let p = host.spawn(&["basic"], "k-unlisted", 1);
    let (code, lines) = p.wait();
    assert_ne!(code, 0, "{lines:?}");
    assert!(lines.contains(&"COUNT 1".to_owned()), "{lines:?}");
    let failed = lines.iter().find(|l| l.starts_with("FAILED")).expect("a failed call");
    assert!(failed.contains("pRetain(&ctx, dev) = 101"), "CUDA_ERROR_INVALID_DEVICE: {failed}");
    assert!(!lines.iter().any(|l| l.starts_with("SUM")), "computed on a GPU it was not granted: {lines:?}");
    // The shim told the host; its report is handled after the process may have exited.
    let deadline = Instant::now() + WAIT;
    while host.metrics.gpus_not_visible.get() == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(host.metrics.gpus_not_visible.get(), 1);
    assert_eq!(counter_value(&host.metrics, "notebookos_lease_gpus_not_visible_total"), 1);
}

#[test]
fn python_ctypes_program_through_get_proc_address_v2_sees_the_virtual_device_count() {
    let host = Host::start(3, 64, Duration::from_secs(60));
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    let python = if venv.exists() { venv } else { PathBuf::from("python3") };
    let script = programs().join("driver_client.py");
    let p = host.spawn_program(&python, &[script.to_str().expect("utf-8 path")], "k-py", 2, true);
    let (code, lines) = p.wait();
    assert_eq!(code, 0, "{lines:?}");
    let want = format!("PY COUNT {} SUM 500.0", host.gpus.min(2));
    assert!(lines.contains(&want), "{lines:?}");
}

#[test]
fn a_gated_call_blocks_without_a_lease_and_proceeds_when_granted() {
    let host = Host::start(1, 64, Duration::from_secs(60));
    host.server.set_paused(true);
    let mut p = host.spawn(&["basic"], "k-block", 1);
    assert_eq!(p.expect("COUNT"), "COUNT 1");
    host.wait_state(p.pid(), LeaseState::Requested);
    assert!(!p.has_printed("SUM"), "computed without a lease: {:?}", p.seen);
    host.server.set_paused(false);
    assert_eq!(p.expect("SUM"), "SUM 6144.0");
    let (code, lines) = p.wait();
    assert_eq!(code, 0, "{lines:?}");
    assert_eq!(host.metrics.grants.get(), 1);
}

#[test]
fn threads_racing_without_a_lease_share_one_request_and_all_proceed() {
    let host = Host::start(1, 64, Duration::from_secs(60));
    let mut p = host.spawn(&["threads", "8"], "k-threads", 1);
    p.expect("LOADED");
    let pid = p.pid();
    host.wait_state(pid, LeaseState::Bound);
    host.server.revoke(pid);
    host.wait_state(pid, LeaseState::Unbound);
    host.server.set_paused(true);
    p.send("go");
    host.wait_state(pid, LeaseState::Requested);
    assert!(!p.has_printed("THREAD"), "computed without a lease: {:?}", p.seen);
    host.server.set_paused(false);
    let mut sums: Vec<String> = (0..8).map(|_| p.expect("THREAD")).collect();
    sums.sort();
    let want: Vec<String> = (0..8).map(|i| format!("THREAD {i} {:.1}", f64::from((i + 1) * 256))).collect();
    assert_eq!(sums, want);
    assert_eq!(p.expect("JOINED"), "JOINED 8");
    let (code, lines) = p.wait();
    assert_eq!(code, 0, "{lines:?}");
    assert_eq!(host.metrics.grants.get(), 2, "one grant at start, one for all eight threads");
}

#[test]
fn revoke_checkpoint_and_restore_onto_another_gpu_keeps_data_pointers_and_kernels() {
    let host = Host::start_counting_bytes(2, 64, Duration::from_secs(60));
    let evicted_before = counter_value(&host.metrics, "notebookos_gpu_evicted_bytes_total");
    let restored_before = counter_value(&host.metrics, "notebookos_gpu_restored_bytes_total");
    let mut p = host.spawn(&["phases", "4096"], "k-move", 1);
    let ready = p.expect("READY");
    let f: Vec<&str> = ready.split_whitespace().collect();
    assert_eq!(f[3], "4096.0");
    let pid = p.pid();
    assert_eq!(host.wait_state(pid, LeaseState::Bound).gpus, vec![0]);
    if !host.real {
        assert!(host.ledger_bytes(0, pid) >= 2 * 4096 * 4);
    }

    host.server.revoke(pid);
    host.wait_state(pid, LeaseState::Unbound);
    if !host.real {
        assert_eq!(host.ledger_bytes(0, pid), 0, "checkpoint must free the GPU's capacity");
    }
    // The process allocated x and y, 4096 f32 each: at least that moved to host memory.
    let allocated = 2 * 4096 * 4;
    let evicted = counter_value(&host.metrics, "notebookos_gpu_evicted_bytes_total") - evicted_before;
    assert!(evicted >= allocated, "evicted {evicted} bytes, allocated {allocated}");
    // Restore onto another GPU when the host has two (always, with the test double).
    let target = if host.gpus >= 2 { 1 } else { 0 };
    if target != 0 {
        host.server.set_cordoned(0, true);
    }
    p.send("go");

    let after = p.expect("AFTER");
    let a: Vec<&str> = after.split_whitespace().collect();
    assert_eq!((a[1], a[2]), (f[1], f[2]), "device pointers survive the move");
    // y = 1 + 3 * 2 = 7 everywhere; x untouched; the process still sees virtual device 0.
    assert_eq!(&a[3..], ["28672.0", "8192.0", "7.0", "0"], "{after}");
    assert_eq!(host.wait_state(pid, LeaseState::Bound).gpus, vec![target]);
    if !host.real {
        assert!(host.ledger_bytes(1, pid) >= 2 * 4096 * 4, "restored onto GPU 1");
    }
    let restored = counter_value(&host.metrics, "notebookos_gpu_restored_bytes_total") - restored_before;
    assert_eq!(restored, evicted, "what was evicted is what was restored");
    p.send("bye");
    let (code, lines) = p.wait();
    assert_eq!(code, 0, "{lines:?}");
    let evictions = host.metrics.eviction.evictions.get_or_create(&EvictionLabels { mode: "checkpoint".into() }).get();
    assert_eq!(evictions, 1);
}

#[test]
fn two_processes_oversubscribing_one_gpu_take_turns_without_corruption() {
    // 48 MiB GPU; each process needs 32 MiB: they cannot both be resident.
    let host = Host::start(1, 48, Duration::from_millis(100));
    // On a real host with several GPUs, make it one.
    for gpu in 1..host.gpus as usize {
        host.server.set_cordoned(gpu, true);
    }
    let a = host.spawn(&["turns", "1", "3", "32"], "k-a", 1);
    let b = host.spawn(&["turns", "100", "3", "32"], "k-b", 1);
    let (ca, la) = a.wait();
    let (cb, lb) = b.wait();
    assert_eq!((ca, cb), (0, 0), "a: {la:?}\nb: {lb:?}");
    assert!(la.contains(&"DONE 0".to_owned()) && lb.contains(&"DONE 0".to_owned()));
    let evictions = host.metrics.eviction.evictions.get_or_create(&EvictionLabels { mode: "checkpoint".into() }).get();
    assert!(evictions >= 1, "the GPU must have changed hands through a checkpoint: {evictions}");
}

#[test]
fn a_process_not_registered_with_the_host_is_refused() {
    let host = Host::start(1, 64, Duration::from_secs(60));
    let p = host.spawn_program(&host.client.clone(), &["basic"], "k-stranger", 1, false);
    let (code, lines) = p.wait();
    assert_ne!(code, 0, "{lines:?}");
    // Refused, it is not told where the driver is: not even cuInit resolves (cuGetProcAddress
    // finds no driver behind the shim).
    assert!(lines.iter().any(|l| l.starts_with("RESOLVE_FAILED cuInit")), "{lines:?}");
    assert!(!lines.iter().any(|l| l.starts_with("SUM")), "{lines:?}");

    // And on the wire: this test process is not a kernel process either.
    let mut s = UnixStream::connect(host.server.socket()).expect("connect");
    let reg = Message::Register { kernel_id: "k-stranger".into(), replica: 0, pid: std::process::id() };
    write_message(&mut s, &reg).expect("send");
    match read_message(&mut s).expect("reply") {
        Message::Refused { reason } => assert!(reason.contains("not a kernel process"), "{reason}"),
        other => panic!("expected Refused, got {other:?}"),
    }
    let refused = host.metrics.refused.get_or_create(&RefusedLabels { reason: "unregistered".into() }).get();
    assert_eq!(refused, 2);
}

#[test]
fn a_process_whose_host_went_away_gets_an_error_code_not_a_signal() {
    // A host that dies between leases (here: a hand-written one that closes its socket).
    let host = Host::start(1, 64, Duration::from_secs(60));
    let sock = host.dir.path().join("mortal-host.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
    let sock_env = sock.to_str().expect("utf-8 path");
    let mut p =
        host.spawn_full(&host.client, &["phases", "1024"], "k-orphan", 1, false, &[("NBOS_LEASE_SOCKET", sock_env)]);
    let (mut s, _) = listener.accept().expect("accept");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    assert!(matches!(read_message(&mut s), Ok(Message::Register { .. })));
    let registered = Message::Registered {
        device_count: 1,
        activity_interval_ms: 0,
        memory_limit_bytes: 0,
        host_pid: p.pid(),
        driver_path: host.fake.display().to_string(),
    };
    write_message(&mut s, &registered).expect("send");
    assert!(matches!(read_message(&mut s), Ok(Message::Request { .. })));
    let gpu = notebookosd::lease::server::uuid_bytes(&fake_gpu_uuid(0)).expect("uuid");
    write_message(&mut s, &Message::Grant { lease: 1, gpus: vec![gpu] }).expect("send");
    p.expect("READY");
    write_message(&mut s, &Message::Revoke { lease: 1 }).expect("send");
    assert!(matches!(read_message(&mut s), Ok(Message::Released { lease: 1 })));
    drop(s);
    drop(listener);
    // The next gated call asks the vanished host for a lease.
    p.send("go");
    let (code, lines) = p.wait();
    assert_eq!(code, 1, "an error code through CHECK, not death by SIGPIPE (code -1): {lines:?}");
    let failed = lines.iter().find(|l| l.starts_with("FAILED")).expect("the call after the host left fails");
    assert!(failed.contains(" = 999 ") || failed.contains(" = 800 "), "CUDA_ERROR_UNKNOWN/NOT_PERMITTED: {failed}");
}

#[test]
fn a_registered_process_claiming_another_kernel_or_pid_is_refused() {
    let host = Host::start(1, 64, Duration::from_secs(60));
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    host.server.register_process(RegisteredProcess {
        kernel_id: "k-me".into(),
        replica: 0,
        pid: std::process::id(),
        uid,
        gpus: 1,
    });
    for (kernel, pid, want) in
        [("k-other", std::process::id(), "claims kernel"), ("k-me", std::process::id() + 1, "claims pid")]
    {
        let mut s = UnixStream::connect(host.server.socket()).expect("connect");
        write_message(&mut s, &Message::Register { kernel_id: kernel.into(), replica: 0, pid }).expect("send");
        match read_message(&mut s).expect("reply") {
            Message::Refused { reason } => assert!(reason.contains(want), "{reason}"),
            other => panic!("expected Refused, got {other:?}"),
        }
    }
    // Garbage instead of Register: refused, and the server keeps serving.
    let mut s = UnixStream::connect(host.server.socket()).expect("connect");
    s.write_all(&[0xff, 0xff, 0xff, 0x7f]).expect("send garbage");
    assert!(matches!(read_message(&mut s), Ok(Message::Refused { .. })));
    let mut s = UnixStream::connect(host.server.socket()).expect("connect");
    write_message(&mut s, &Message::Register { kernel_id: "k-me".into(), replica: 0, pid: std::process::id() })
        .expect("send");
    assert!(matches!(read_message(&mut s), Ok(Message::Registered { device_count: 1, .. })));
}

#[test]
fn a_forked_child_registers_as_a_descendant_and_computes_on_its_own_lease() {
    let host = Host::start(2, 64, Duration::from_secs(60));
    if host.real || host.gpus < 2 {
        // CUDA does not survive fork on a real driver; the child would get CUDA errors.
        required::cannot_run(
            "a_forked_child_registers_as_a_descendant_and_computes_on_its_own_lease",
            "fork semantics are checked with the fake-cuda test double (2 GPUs) only",
        );
        return;
    }
    let p = host.spawn(&["fork"], "k-fork", 1);
    let (code, lines) = p.wait();
    assert_eq!(code, 0, "{lines:?}");
    assert!(lines.contains(&"CHILD 1 7168.0".to_owned()), "{lines:?}");
    assert!(lines.contains(&"PARENT 5120.0 0".to_owned()), "{lines:?}");
}

/// On a GPU host (tests/gpu/run.sh): a PyTorch training loop under the shim is revoked
/// (checkpointed) and restored between steps, onto another GPU when there are two; its
/// loss curve must equal an undisturbed run's. Prints eviction and restore bandwidth.
/// GPU-only, so ignored by `make test`; run.sh runs it with `--include-ignored`, and there
/// a missing driver or PyTorch is a failure.
#[test]
#[ignore = "GPU-only: needs a real driver and PyTorch (tests/gpu/run.sh runs it)"]
fn pytorch_training_continues_identically_across_revoke_and_restore() {
    let driver = real_driver().expect("NBOS_TEST_CUDA_DRIVER names the real libcuda.so.1 (tests/gpu/run.sh sets it)");
    let torch = Command::new("python3").args(["-c", "import torch"]).output().expect("python3");
    assert!(torch.status.success(), "python3 cannot import torch: {}", String::from_utf8_lossy(&torch.stderr));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/gpu/train.py");
    let reference = Command::new("python3").arg(&script).env("STEPS", "6").output().expect("reference run");
    assert!(reference.status.success(), "{}", String::from_utf8_lossy(&reference.stderr));
    let steps = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with("STEP"))
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .collect()
    };
    let want = steps(&String::from_utf8_lossy(&reference.stdout));
    assert_eq!(want.len(), 6);

    let host = Host::start(2, 0, Duration::from_secs(600));
    assert_eq!(host.fake, driver);
    let script_arg = script.to_str().expect("utf-8 path");
    let env = [("STEPS", "6"), ("NBOS_STEP_SYNC", "1")];
    let mut p = host.spawn_program_env(Path::new("python3"), &[script_arg], "k-torch", 1, &env);
    let pid = p.pid();
    let mut got = Vec::new();
    let (mut evict_s, mut restore_s, mut bytes) = (Vec::new(), Vec::new(), 0u64);
    for i in 0..6 {
        let line = p.expect("STEP");
        bytes = line.split_whitespace().nth(3).and_then(|b| b.parse().ok()).unwrap_or(0);
        got.push(line.split_whitespace().take(3).collect::<Vec<_>>().join(" "));
        if i == 5 {
            break;
        }
        let t = Instant::now();
        host.server.revoke(pid);
        host.wait_state(pid, LeaseState::Unbound);
        evict_s.push(t.elapsed().as_secs_f64());
        if host.gpus >= 2 {
            // Alternate between GPU 0 and 1: cordon the one just left.
            host.server.set_cordoned(i % 2, true);
            host.server.set_cordoned((i + 1) % 2, false);
        }
        let t = Instant::now();
        p.send("go");
        host.wait_state(pid, LeaseState::Bound);
        restore_s.push(t.elapsed().as_secs_f64());
    }
    let (code, lines) = p.wait();
    assert_eq!(code, 0, "{lines:?}");
    assert_eq!(got, want, "loss curve must continue identically across revoke/restore");
    let gib = bytes as f64 / f64::from(1u32 << 30);
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    eprintln!(
        "GPU_RESULT evict_gib_s={:.2} restore_gib_s={:.2} gib={gib:.2} evictions={}",
        gib / med(&mut evict_s),
        gib / med(&mut restore_s),
        evict_s.len()
    );
}

/// Syscalls made by a process doing `n` leased launches (strace -f -c total), or None
/// without strace.
fn syscalls_for_launches(host: &Host, n: u32, kernel: &str) -> Option<u64> {
    let out = host.dir.path().join(format!("strace-{kernel}.txt"));
    let strace = Path::new("/usr/bin/strace");
    if !strace.exists() {
        return None;
    }
    let args = ["-f", "-c", "-o", out.to_str().expect("utf-8"), host.client.to_str().expect("utf-8"), "launches"];
    let n = n.to_string();
    let mut all: Vec<&str> = args.to_vec();
    all.push(&n);
    // strace is the registered kernel process; the client is its child (a descendant).
    let p = host.spawn_program(strace, &all, kernel, 1, true);
    let (code, lines) = p.wait();
    assert_eq!(code, 0, "{lines:?}");
    let text = std::fs::read_to_string(&out).expect("strace summary");
    // Last line: "100.00    0.000123           4        31         2 total"
    let total = text.lines().rev().find(|l| l.trim_end().ends_with("total")).expect("total line");
    let calls: Vec<u64> = total.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    // After the float columns: usecs/call, calls, errors.
    calls.get(1).copied()
}

#[test]
fn leased_launches_make_no_syscalls() {
    let host = Host::start(1, 64, Duration::from_secs(60));
    if host.real {
        // A real driver may itself enter the kernel (queue full); this checks the shim only.
        required::cannot_run("leased_launches_make_no_syscalls", "measured with the fake-cuda test double only");
        return;
    }
    let Some(few) = syscalls_for_launches(&host, 100, "k-few") else {
        required::cannot_run(
            "leased_launches_make_no_syscalls",
            "/usr/bin/strace is not installed (Debian package strace)",
        );
        return;
    };
    let many = syscalls_for_launches(&host, 20_100, "k-many").expect("strace");
    // 20 000 more launches; activity reports every 20 ms may add a few syscalls, never one per call.
    eprintln!("syscalls: {few} for 100 launches, {many} for 20 100");
    assert!(many.saturating_sub(few) < 1_000, "{few} syscalls for 100 launches, {many} for 20 100");
}

// The scheduler's GPU assignment (`LeaseServer::assign`) decides which GPUs a kernel
// process is granted.

#[test]
fn a_kernel_is_granted_the_gpu_the_scheduler_assigned_not_the_first_free_one() {
    let host = Host::start(2, 64, Duration::from_secs(600));
    if host.gpus < 2 {
        required::cannot_run(
            "a_kernel_is_granted_the_gpu_the_scheduler_assigned_not_the_first_free_one",
            &format!("needs 2 GPUs, the host has {}", host.gpus),
        );
        return;
    }
    let reports = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(u32, u64)>::new()));
    let sink = reports.clone();
    host.server.set_activity_hook(std::sync::Arc::new(move |pid, calls| {
        sink.lock().expect("reports").push((pid, calls));
    }));
    host.server.assign("k-one", vec![1]);
    let mut p = host.spawn(&["phases", "1024"], "k-one", 1);
    p.expect("READY");
    let pid = p.pid();
    assert_eq!(host.wait_state(pid, LeaseState::Bound).gpus, vec![1], "GPU 0 was free, GPU 1 assigned");
    p.send("go");
    p.expect("AFTER");
    // The shim's activity reports reach the hook (the node feeds the GPU observer with it).
    let deadline = Instant::now() + WAIT;
    while !reports.lock().expect("reports").iter().any(|&(r, calls)| r == pid && calls > 0) {
        assert!(Instant::now() < deadline, "no Activity report for {pid}: {:?}", reports.lock().expect("reports"));
        std::thread::sleep(Duration::from_millis(10));
    }
    p.send("bye");
    assert_eq!(p.wait().0, 0);
}

#[test]
fn a_kernel_waits_for_its_assigned_gpu_while_another_gpu_is_free() {
    let host = Host::start(2, 64, Duration::from_secs(600));
    if host.gpus < 2 {
        required::cannot_run(
            "a_kernel_waits_for_its_assigned_gpu_while_another_gpu_is_free",
            &format!("needs 2 GPUs, the host has {}", host.gpus),
        );
        return;
    }
    host.server.assign("k-a", vec![1]);
    let mut a = host.spawn(&["phases", "1024"], "k-a", 1);
    a.expect("READY");
    let pa = a.pid();
    assert_eq!(host.wait_state(pa, LeaseState::Bound).gpus, vec![1]);

    // The scheduler moves GPU 1 to kernel b: revoke a, assign b.
    host.server.revoke(pa);
    host.wait_state(pa, LeaseState::Unbound);
    host.server.assign("k-b", vec![1]);
    let mut b = host.spawn(&["phases", "1024"], "k-b", 1);
    b.expect("READY");
    let pb = b.pid();
    assert_eq!(host.wait_state(pb, LeaseState::Bound).gpus, vec![1]);

    // a comes back still assigned GPU 1: it waits although GPU 0 is free.
    a.send("go");
    host.wait_state(pa, LeaseState::Requested);
    let status = host.server.status();
    let held: Vec<usize> = status.iter().flat_map(|p| p.gpus.clone()).collect();
    assert_eq!(held, vec![1], "only b holds a GPU; nobody fell back to GPU 0: {status:?}");

    // b finishes; a is granted GPU 1 again and its data survived the checkpoint.
    b.send("go");
    b.expect("AFTER");
    b.send("bye");
    assert_eq!(b.wait().0, 0);
    let after = a.expect("AFTER");
    assert!(after.split_whitespace().nth(3) == Some("7168.0"), "y = 1 + 3 * 2 over 1024 floats: {after}");
    assert_eq!(host.wait_state(pa, LeaseState::Bound).gpus, vec![1]);
    a.send("bye");
    assert_eq!(a.wait().0, 0);
}
