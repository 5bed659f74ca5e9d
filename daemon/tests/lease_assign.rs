//! End to end: the scheduler's GPU assignment ([`LeaseServer::assign`]) decides which
//! GPUs a kernel process is granted, through the shim (`libcuda.so.1`), the lease
//! server, GPU control and the fake-cuda TEST DOUBLE as the driver.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use notebookosd::gpu::checkpoint::DriverCheckpoint;
use notebookosd::gpu::control::GpuControl;
use notebookosd::gpu::inventory::fake_gpu_uuid;
use notebookosd::gpu::GpuInfo;
use notebookosd::lease::metrics::LeaseMetrics;
use notebookosd::lease::table::Policy;
use notebookosd::lease::{KernelProcess, LeaseServer, LeaseServerConfig, LeaseState, ProcessStatus};

const WAIT: Duration = Duration::from_secs(30);

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

struct Host {
    dir: tempfile::TempDir,
    shim_dir: PathBuf,
    client: PathBuf,
    fake: PathBuf,
    server: LeaseServer,
}

struct Proc {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Proc {
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

    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").expect("write stdin");
    }

    fn wait(mut self) -> i32 {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.code().unwrap_or(-1);
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("process {} did not exit; output {:?}", self.child.id(), self.seen);
            }
            if let Ok(l) = self.lines.recv_timeout(Duration::from_millis(20)) {
                self.seen.push(l);
            }
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Host {
    fn start(gpus: u32) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let shim_dir = dir.path().join("shim");
        std::fs::create_dir(&shim_dir).expect("mkdir");
        std::fs::copy(built("libnbos_cuda_shim.so"), shim_dir.join("libcuda.so.1")).expect("copy shim");
        let fake = built("libfake_cuda.so");
        let client = dir.path().join("driver_client");
        let out = Command::new("cc")
            .args(["-O1", "-Wall", "-o"])
            .arg(&client)
            .arg(programs().join("driver_client.c"))
            .arg("-ldl")
            .output()
            .expect("run cc");
        assert!(out.status.success(), "cc failed: {}", String::from_utf8_lossy(&out.stderr));
        let inventory: Vec<GpuInfo> = (0..gpus)
            .map(|index| GpuInfo {
                index,
                uuid: fake_gpu_uuid(index),
                name: "fake".into(),
                memory_mib: 64,
                simulated: true,
            })
            .collect();
        let metrics = LeaseMetrics::default();
        let api = DriverCheckpoint::load(&fake).expect("fake-cuda checkpoint API");
        let control = GpuControl::new(Some(Box::new(api)), metrics.clone());
        let cfg = LeaseServerConfig {
            socket: dir.path().join("lease.sock"),
            // Idle detection off for the test's length: only explicit revokes move GPUs.
            policy: Policy { idle_grace: Duration::from_secs(600), idle_release: Duration::from_secs(600) },
            activity_interval: Duration::from_millis(20),
            memory_limit_bytes: 0,
        };
        let server = LeaseServer::start(cfg, inventory, control, metrics).expect("lease server");
        Self { dir, shim_dir, client, fake, server }
    }

    fn spawn(&self, args: &[&str], kernel: &str) -> Proc {
        let mut c = Command::new("sh");
        c.arg("-c").arg("read go && exec \"$0\" \"$@\"").arg(&self.client).args(args);
        c.env("LD_LIBRARY_PATH", &self.shim_dir)
            .env("LD_PRELOAD", self.shim_dir.join("libcuda.so.1"))
            .env("NBOS_CUDA_DRIVER", &self.fake)
            .env("NBOS_LEASE_SOCKET", self.server.socket())
            .env("NBOS_KERNEL_ID", kernel)
            .env("FAKE_CUDA_STATE_DIR", self.dir.path().join("fake-state"))
            .env("FAKE_CUDA_GPUS", "2")
            .env("FAKE_CUDA_GPU_MEMORY_MIB", "64")
            .env("NBOS_TEST_PTX", programs().join("kernels.ptx"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = c.spawn().expect("spawn");
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
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        self.server.register_process(KernelProcess {
            kernel_id: kernel.into(),
            replica: 0,
            pid: child.id(),
            uid,
            gpus: 1,
        });
        writeln!(stdin, "go").expect("release the process");
        Proc { child, stdin, lines, seen: Vec::new() }
    }

    fn wait_state(&self, pid: u32, want: LeaseState) -> ProcessStatus {
        let ok = self.server.wait_until(WAIT, |s| s.iter().any(|p| p.pid == pid && p.state == want));
        let status = self.server.status();
        assert!(ok, "pid {pid} never reached {want:?}: {status:?}");
        status.into_iter().find(|p| p.pid == pid).expect("present")
    }
}

#[test]
fn a_kernel_is_granted_the_gpu_the_scheduler_assigned_not_the_first_free_one() {
    let host = Host::start(2);
    let reports = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(u32, u64)>::new()));
    let sink = reports.clone();
    host.server.set_activity_hook(std::sync::Arc::new(move |pid, calls| {
        sink.lock().expect("reports").push((pid, calls));
    }));
    host.server.assign("k-one", vec![1]);
    let mut p = host.spawn(&["phases", "1024"], "k-one");
    p.expect("READY");
    let pid = p.child.id();
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
    assert_eq!(p.wait(), 0);
}

#[test]
fn a_kernel_waits_for_its_assigned_gpu_while_another_gpu_is_free() {
    let host = Host::start(2);
    host.server.assign("k-a", vec![1]);
    let mut a = host.spawn(&["phases", "1024"], "k-a");
    a.expect("READY");
    let pa = a.child.id();
    assert_eq!(host.wait_state(pa, LeaseState::Bound).gpus, vec![1]);

    // The scheduler moves GPU 1 to kernel b: revoke a, assign b.
    host.server.revoke(pa);
    host.wait_state(pa, LeaseState::Unbound);
    host.server.assign("k-b", vec![1]);
    let mut b = host.spawn(&["phases", "1024"], "k-b");
    b.expect("READY");
    let pb = b.child.id();
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
    assert_eq!(b.wait(), 0);
    let after = a.expect("AFTER");
    assert!(after.split_whitespace().nth(3) == Some("7168.0"), "y = 1 + 3 * 2 over 1024 floats: {after}");
    assert_eq!(host.wait_state(pa, LeaseState::Bound).gpus, vec![1]);
    a.send("bye");
    assert_eq!(a.wait(), 0);
}
