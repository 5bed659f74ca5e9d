//! What a hostile kernel, or a crashed daemon, leaves behind on a host (issue 29's low
//! findings): a `kernel.uid_range` kernel's set-user-ID files in the daemon's own `run/counters`
//! and `run/fake-cuda` directories are gone once its uid is cleaned, and the kernel cgroups of
//! a daemon killed with SIGKILL are removed by the next daemon at start. What a user would
//! check: `ls -l` of those directories, `/proc/<pid>/cgroup` and the cgroup directory. Needs
//! root and a pids cgroup hierarchy; fails instead of skipping when `NBOS_REQUIRE_PRIVILEGED=1`.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

mod required;
use nbos_test_support::daemon::{base_config, kernel_traversable_tempdir, wait_for_endpoint};
use nbos_test_support::{http, run_cell, wait_until, TOKEN};

const NOTEBOOKOSD: &str = env!("CARGO_BIN_EXE_notebookosd");

/// A uid range no other test uses (`kernel_user.rs` has 2_000_000..).
const RANGE_FIRST: u32 = 2_100_000;

/// Why this host cannot run these tests, if it cannot.
fn cannot_run() -> Option<String> {
    // SAFETY: geteuid(2) has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (a root daemon runs kernels as other uids, in cgroups)".to_owned());
    }
    let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").unwrap_or_default();
    if !Path::new("/sys/fs/cgroup/pids/cgroup.procs").exists() && !v2.split_whitespace().any(|c| c == "pids") {
        return Some("no pids cgroup hierarchy (v1 or v2) on this host".to_owned());
    }
    None
}

/// A host's directory and config, which several daemons in turn can run on.
struct Host {
    dir: tempfile::TempDir,
    config: PathBuf,
}

/// A running daemon: SIGKILLed (the crash) or SIGTERMed on drop, then reaped.
struct Running {
    child: Child,
    url: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap_or(i32::MAX)),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

impl Host {
    /// A host whose config is the test daemon's base with `overlay` (TOML sections) over it.
    fn new(overlay: &str) -> Self {
        let dir = kernel_traversable_tempdir();
        let mut c = base_config(dir.path());
        c.overlay(overlay).expect("overlay");
        let config = c.write(&dir.path().join("c.toml")).expect("config");
        Self { dir, config }
    }

    fn run_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    fn start(&self) -> Running {
        // A previous daemon's endpoint file would name its dead port.
        let _ = std::fs::remove_file(self.run_dir().join("endpoint.json"));
        let child = Command::new(NOTEBOOKOSD)
            .arg("--config")
            .arg(&self.config)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn notebookosd");
        let mut running = Running { child, url: String::new() };
        running.url = wait_for_endpoint(&self.run_dir());
        running
    }
}

/// Creates a kernel of kernelspec `name`; returns its id and pid.
fn create_kernel(url: &str, name: &str) -> (String, u32) {
    let (code, body) =
        http("POST", &format!("{url}/api/kernels"), Some(TOKEN), Some(&format!(r#"{{"name":"{name}"}}"#)));
    assert_eq!(code, 201, "{body}");
    let model: serde_json::Value = serde_json::from_str(&body).expect("json");
    let id = model["id"].as_str().expect("id").to_owned();
    let pid = model["pids"][0].as_u64().and_then(|p| u32::try_from(p).ok()).expect("pid");
    (id, pid)
}

/// The kernel cgroup directories of `pid` (v1 hierarchies and v2), from `/proc/<pid>/cgroup`:
/// those named after a kernel (under `notebookos/` or `notebookos-kernels/`).
fn kernel_cgroups_of(pid: u32) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("/proc/<pid>/cgroup");
    let mut dirs = Vec::new();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        if !(path.contains("/notebookos/") || path.contains("/notebookos-kernels/")) {
            continue;
        }
        let mount = match controllers {
            "" => {
                if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
                    PathBuf::from("/sys/fs/cgroup")
                } else {
                    PathBuf::from("/sys/fs/cgroup/unified")
                }
            }
            c => PathBuf::from("/sys/fs/cgroup").join(c.split(',').next().unwrap_or(c)),
        };
        dirs.push(mount.join(path.trim_start_matches('/')));
    }
    dirs
}

/// The attack: a `uid_range` kernel copies a shell into the daemon's `counters/` and
/// `fake-cuda/` directories (writable by every kernel, sticky) and makes it set-user-ID,
/// hoping it outlives the kernel and runs as its uid for whoever gets the uid next (or for
/// any local user meanwhile). Deleting the kernel removes both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_uid_range_kernels_setuid_files_in_the_daemons_run_dirs_go_with_its_uid() {
    if let Some(why) = cannot_run() {
        required::cannot_run("hostile_leftovers", &why);
        return;
    }
    let host = Host::new(&format!(
        "[kernel]\nuid_range = [{RANGE_FIRST}, {}]\n[gpu]\ndriver = \"fake\"\nfake_gpus = 1\nfake_gpu_memory_mib = 64\n",
        RANGE_FIRST + 9
    ));
    let d = host.start();
    let (kernel, pid) = tokio::task::block_in_place(|| create_kernel(&d.url, "python3"));
    let uid = std::fs::metadata(format!("/proc/{pid}")).expect("the kernel's /proc entry").uid();
    assert!((RANGE_FIRST..=RANGE_FIRST + 9).contains(&uid), "kernel uid {uid}");
    let plant = "import os, shutil\n\
                 paths = [os.path.join(os.environ[v], 'planted-suid') for v in ('NBOS_SHIM_COUNTERS_DIR', 'FAKE_CUDA_STATE_DIR')]\n\
                 for p in paths:\n    shutil.copy('/bin/sh', p); os.chmod(p, 0o6755)\n\
                 len(paths)";
    let planted = run_cell(&d.url, TOKEN, &kernel, plant).await.value();
    assert_eq!(planted.trim(), "2", "the cell planted both files: {planted}");
    let files = [host.run_dir().join("counters/planted-suid"), host.run_dir().join("fake-cuda/planted-suid")];
    for f in &files {
        let m = std::fs::symlink_metadata(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert_eq!((m.uid(), m.mode() & 0o6000), (uid, 0o6000), "{} is the kernel's, set-id", f.display());
    }
    let (code, body) = http("DELETE", &format!("{}/api/kernels/{kernel}", d.url), Some(TOKEN), None);
    assert_eq!(code, 204, "{body}");
    // Cleaned by a thread of the daemon's, just after the delete.
    wait_until("the planted files are gone", Duration::from_secs(20), || {
        files.iter().all(|f| std::fs::symlink_metadata(f).is_err())
    });
    drop(d);
}

/// The daemon dies with SIGKILL (no chance to clean up): its kernel's cgroups stay, empty
/// once the kernel is killed. The next daemon of the same host removes them at start, and
/// kills the kernel if it still ran.
#[test]
fn kernel_cgroups_a_killed_daemon_left_are_removed_at_the_next_start() {
    if let Some(why) = cannot_run() {
        required::cannot_run("hostile_leftovers", &why);
        return;
    }
    let host = Host::new("[gpu]\ndriver = \"none\"\n");
    let mut d = host.start();
    let (_kernel, pid) = create_kernel(&d.url, "python3");
    let cgroups = kernel_cgroups_of(pid);
    assert!(
        !cgroups.is_empty(),
        "the kernel is in no kernel cgroup:\n{:?}",
        std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
    );
    d.child.kill().expect("SIGKILL the daemon");
    d.child.wait().expect("reap");
    for c in &cgroups {
        assert!(c.is_dir(), "{} should outlive the killed daemon", c.display());
    }
    let d2 = host.start();
    wait_until("the kernel of the killed daemon is gone", Duration::from_secs(10), || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| s.contains(") Z "))
    });
    for c in &cgroups {
        assert!(!c.exists(), "{} survived the next daemon's start", c.display());
    }
    drop(d2);
}
