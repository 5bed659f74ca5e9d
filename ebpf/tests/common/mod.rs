//! Shared by the observer's integration tests: building the C test programs, driving a
//! workload process, and the privileged-test rule.

#![allow(dead_code, reason = "each test binary uses a different part of this module")]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The C test program, compiled once per test binary.
pub struct CPrograms {
    /// `workload`: calls driver entry points on command.
    pub workload: PathBuf,
}

fn cc(args: &[&str], out: &Path) {
    // Build into a unique name and rename, so parallel test binaries never see a half-written file.
    let tmp = out.with_extension(format!("tmp{}", std::process::id()));
    let status = Command::new("cc").args(args).arg("-o").arg(&tmp).status().expect("running cc (apt-get install gcc)");
    assert!(status.success(), "cc {args:?} failed");
    std::fs::rename(&tmp, out).unwrap();
}

/// Compiles `tests/c/workload.c` into `$CARGO_TARGET_TMPDIR/nbos-ebpf-c`.
pub fn c_programs() -> &'static CPrograms {
    static PROGRAMS: OnceLock<CPrograms> = OnceLock::new();
    PROGRAMS.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("nbos-ebpf-c");
        std::fs::create_dir_all(&dir).unwrap();
        let workload = dir.join("workload");
        let work_src = src.join("workload.c");
        cc(&["-O2", "-Wall", "-Werror", work_src.to_str().unwrap(), "-ldl"], &workload);
        CPrograms { workload }
    })
}

/// The driver library the acceptance tests call through: `tests/fake-cuda`'s
/// `libfake_cuda.so` (built as a dev-dependency, found next to the test binary), or the path
/// in `NBOS_FAKE_CUDA`. It is copied to a private file first: a uprobe belongs to an inode, and
/// a rebuild of the shared target directory during the run must not swap the file under us.
pub fn driver_library() -> PathBuf {
    static COPY: OnceLock<PathBuf> = OnceLock::new();
    COPY.get_or_init(|| {
        let original = match std::env::var_os("NBOS_FAKE_CUDA") {
            Some(p) => PathBuf::from(p),
            None => {
                let exe = std::env::current_exe().unwrap();
                let deps = exe.parent().unwrap();
                [deps.join("libfake_cuda.so"), deps.parent().unwrap().join("libfake_cuda.so")]
                    .into_iter()
                    .find(|p| p.exists())
                    .unwrap_or_else(|| {
                        panic!("libfake_cuda.so not found near {} (cargo build -p fake-cuda)", deps.display())
                    })
            }
        };
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("nbos-ebpf-c");
        std::fs::create_dir_all(&dir).unwrap();
        // Remove the copies of earlier runs whose process is gone.
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix("libfake_cuda-").and_then(|r| r.strip_suffix(".so")) {
                if !Path::new("/proc").join(pid).exists() {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        let copy = dir.join(format!("libfake_cuda-{}.so", std::process::id()));
        std::fs::copy(&original, &copy).unwrap_or_else(|e| panic!("copying {}: {e}", original.display()));
        copy
    })
    .clone()
}

/// Environment for tests/fake-cuda: its capacity ledgers in this test run's scratch directory.
pub fn fake_cuda_state_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("nbos-ebpf-fake-cuda-state");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A running `workload` process.
pub struct Workload {
    pub child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Workload {
    /// Starts the workload on `lib` and waits for it to be ready.
    pub fn start(lib: &Path) -> Self {
        Self::start_with_env(lib, &[])
    }

    /// Starts the workload on `lib` with `env` added (e.g. the shim's `LD_PRELOAD`, with
    /// `lib = "libcuda.so.1"`) and waits for it to be ready.
    pub fn start_with_env(lib: &Path, env: &[(std::ffi::OsString, std::ffi::OsString)]) -> Self {
        let mut child = Command::new(&c_programs().workload)
            .arg(lib)
            .env("FAKE_CUDA_STATE_DIR", fake_cuda_state_dir())
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut w = Self { child, stdin, stdout };
        assert_eq!(w.line(), "ready");
        w
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim_end().to_owned()
    }

    /// Sends one command and waits for it to finish.
    pub fn run(&mut self, cmd: &str) {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        assert_eq!(self.line(), "ok", "workload command {cmd:?}");
    }

    /// Asks the workload to exit and reaps it.
    pub fn exit(mut self) {
        writeln!(self.stdin, "exit").unwrap();
        self.stdin.flush().unwrap();
        assert!(self.child.wait().unwrap().success());
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `NBOS_REQUIRE_PRIVILEGED=1` is set (CI): then privileged tests must not skip.
pub fn privileged_required() -> bool {
    std::env::var("NBOS_REQUIRE_PRIVILEGED").as_deref() == Ok("1")
}

/// Skips (returns `None` after printing why) or fails when eBPF cannot be used here.
pub fn ebpf_observer(test: &str, config: nbos_ebpf::ObserverConfig) -> Option<nbos_ebpf::Observer> {
    let config = nbos_ebpf::ObserverConfig { mode: nbos_ebpf::ModeRequest::Ebpf, ..config };
    match nbos_ebpf::Observer::start(config) {
        Ok(o) => Some(o),
        Err(e) if privileged_required() => panic!("{test}: eBPF observer must load (NBOS_REQUIRE_PRIVILEGED=1): {e}"),
        Err(e) => {
            eprintln!("skipping {test}: eBPF observer cannot load here ({e}); needs root with CAP_BPF/CAP_PERFMON");
            None
        }
    }
}

/// `libnbos_cuda_shim.so` (cuda-shim is a dev-dependency), next to the test binary.
pub fn shim_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [deps.join("libnbos_cuda_shim.so"), deps.parent().unwrap().join("libnbos_cuda_shim.so")]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!("libnbos_cuda_shim.so not found near {} (cargo build -p nbos-cuda-shim)", deps.display())
        })
}

/// Polls `f` until it returns `Some`, or panics after `deadline`.
pub fn wait_for<T>(what: &str, deadline: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < deadline, "timed out after {deadline:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}
