//! The node's GPU wiring as an operator sees it: with GPUs the daemon serves the
//! lease socket and exports the observer's mode; a missing shim library is a
//! clear start-up error that names the setting.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nbos_test_support::DaemonConfig;

const NOTEBOOKOSD: &str = env!("CARGO_BIN_EXE_notebookosd");

/// A token-less loopback host with one simulated GPU; `overlay` (TOML sections) over that.
fn config(dir: &Path, overlay: &str) -> std::path::PathBuf {
    let mut c = DaemonConfig::new(dir);
    c.name("t").fake_gpus(1).config.http.allow_unauthenticated_loopback = true;
    c.overlay(overlay).expect("overlay");
    c.write(&dir.join("notebookosd.toml")).expect("write config")
}

/// A daemon child, killed on drop.
struct Daemon {
    child: Child,
    url: String,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(cfg: &Path) -> Daemon {
    let mut child = Command::new(NOTEBOOKOSD)
        .arg("--config")
        .arg(cfg)
        .env("NBOS_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn notebookosd");
    let out = child.stdout.take().expect("stdout");
    let mut daemon = Daemon { child, url: String::new() };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx.recv_timeout(left).unwrap_or_else(|_| panic!("notebookosd did not print its URL within 30 s"));
        if let Some(rest) = line.split("listening on ").nth(1) {
            daemon.url = rest.trim().to_owned();
            return daemon;
        }
    }
}

#[test]
fn with_gpus_the_node_serves_leases_and_exports_the_observer_mode() {
    let dir = kernel_tempdir();
    let cfg = config(dir.path(), "[observer]\nmode = \"procfs\"\n");
    let d = start(&cfg);
    let run = dir.path().join("run");
    assert!(run.join("lease.sock").exists(), "no lease socket in {}", run.display());
    assert!(run.join("cuda/libcuda.so.1").is_file(), "the shim was not put in the kernels' private dir");
    let metrics = ureq::get(&format!("{}/metrics", d.url)).call().expect("metrics").into_string().expect("body");
    assert!(metrics.contains("notebookos_observer_mode{mode=\"procfs\"} 1"), "{metrics}");
    assert!(metrics.contains("notebookos_lease_acquire_seconds_count 0"), "{metrics}");
    let leases: serde_json::Value =
        ureq::get(&format!("{}/api/v1/leases", d.url)).call().expect("leases").into_json().expect("json");
    assert_eq!(leases, serde_json::json!([]));
}

#[test]
fn a_missing_shim_library_is_a_start_error_naming_the_setting() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path(), "[gpu]\nshim_library = \"/nonexistent/libnbos_cuda_shim.so\"\n");
    let out = Command::new(NOTEBOOKOSD).arg("--config").arg(&cfg).env("NBOS_LOG", "warn").output().expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("gpu.shim_library = /nonexistent/libnbos_cuda_shim.so: no such file"), "{err}");
    // Nothing was left listening.
    assert!(!dir.path().join("run/lease.sock").exists());
}

/// A temporary directory a root daemon's kernels can pass through (0711: enter, not
/// list): they run as another uid (kernel.user) and refuse to start under a 0700 one.
#[allow(dead_code)]
fn kernel_tempdir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).expect("chmod 0711");
    dir
}
