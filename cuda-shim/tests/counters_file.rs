//! The shim's per-process counters file, read back with the observer's own reader
//! (`nbos_ebpf::shim_counters`): exact counts of what a program did through the shim,
//! a forked child counted in its own file, and no file (but working calls) when the
//! daemon configured no directory. The driver is the fake-cuda TEST DOUBLE.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nbos_ebpf::shim_counters;

fn built(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let p = exe.parent().expect("deps dir").join(name);
    assert!(p.exists(), "{} not built", p.display());
    p
}

struct Setup {
    dir: tempfile::TempDir,
    shim_dir: PathBuf,
    client: PathBuf,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let shim_dir = dir.path().join("shim");
    std::fs::create_dir(&shim_dir).expect("mkdir");
    std::fs::copy(built("libnbos_cuda_shim.so"), shim_dir.join("libcuda.so.1")).expect("copy");
    let client = dir.path().join("counters_client");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/counters_client.c");
    let out = Command::new("cc").args(["-O1", "-o"]).arg(&client).arg(src).arg("-ldl").output().expect("cc");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    Setup { dir, shim_dir, client }
}

/// Runs the client through the shim (no lease host), counting into `counters` if given.
fn run(s: &Setup, counters: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd = Command::new(&s.client);
    cmd.args(args)
        .env("LD_LIBRARY_PATH", &s.shim_dir)
        .env("NBOS_CUDA_DRIVER", built("libfake_cuda.so"))
        .env_remove("NBOS_LEASE_SOCKET")
        .env_remove("NBOS_SHIM_COUNTERS_DIR")
        .env("FAKE_CUDA_STATE_DIR", s.dir.path().join("fake-state"))
        .env("FAKE_CUDA_GPUS", "1");
    if let Some(dir) = counters {
        cmd.env("NBOS_SHIM_COUNTERS_DIR", dir);
    }
    let out = cmd.output().expect("run client");
    assert!(
        out.status.success(),
        "client failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The pid the client printed after `tag`.
fn pid_after(out: &Output, tag: &str) -> u32 {
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(tag)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {tag} line in {stdout}"))
}

#[test]
fn the_counters_file_holds_exact_launch_copy_and_sync_counts() {
    let s = setup();
    let counters = s.dir.path().join("counters");
    std::fs::create_dir(&counters).expect("mkdir");
    let (n, m, b, k) = (1000u64, 37u64, 4096u64, 11u64);
    let out = run(&s, Some(&counters), &[&n.to_string(), &m.to_string(), &b.to_string(), &k.to_string()]);
    let pid = pid_after(&out, "PID ");
    let c = shim_counters::read(&counters, pid).expect("a version-1 counters file for the client's pid");
    assert_eq!((c.launches, c.copies, c.copy_bytes, c.syncs), (n, m, m * b, k), "{c:?}");
    assert_eq!((c.memsets, c.memset_bytes), (0, 0), "{c:?}");
    assert_eq!(shim_counters::list(&counters), vec![pid]);
    let len = std::fs::metadata(shim_counters::path_for(&counters, pid)).expect("stat").len();
    assert_eq!(len, shim_counters::FILE_SIZE as u64);
}

#[test]
fn a_forked_child_counts_in_its_own_file_not_its_parents() {
    let s = setup();
    let counters = s.dir.path().join("counters");
    std::fs::create_dir(&counters).expect("mkdir");
    let out = run(&s, Some(&counters), &["20", "3", "512", "2", "7"]);
    let (parent, child) = (pid_after(&out, "PID "), pid_after(&out, "CHILD "));
    assert_ne!(parent, child);
    let p = shim_counters::read(&counters, parent).expect("parent's counters");
    assert_eq!((p.launches, p.copies, p.copy_bytes, p.syncs), (20, 3, 1536, 2), "parent: {p:?}");
    let c = shim_counters::read(&counters, child).expect("child's counters");
    assert_eq!((c.launches, c.copies, c.copy_bytes, c.syncs), (7, 0, 0, 1), "child: {c:?}");
    let mut pids = shim_counters::list(&counters);
    pids.sort_unstable();
    let mut want = vec![parent, child];
    want.sort_unstable();
    assert_eq!(pids, want);
}

#[test]
fn without_a_counters_dir_no_file_is_made_and_calls_work() {
    let s = setup();
    let before: Vec<_> = std::fs::read_dir(s.dir.path()).expect("ls").map(|e| e.expect("entry").file_name()).collect();
    let out = run(&s, None, &["5", "2", "64", "1"]);
    pid_after(&out, "PID ");
    let after: Vec<_> = std::fs::read_dir(s.dir.path()).expect("ls").map(|e| e.expect("entry").file_name()).collect();
    let new: Vec<_> = after.iter().filter(|n| !before.contains(n) && n.to_str() != Some("fake-state")).collect();
    assert!(new.is_empty(), "unexpected files: {new:?}");
}

#[test]
fn an_unusable_counters_dir_is_reported_once_and_calls_still_work() {
    let s = setup();
    let missing = s.dir.path().join("no-such-dir");
    let out = run(&s, Some(&missing), &["5", "2", "64", "1", "1"]);
    pid_after(&out, "PID ");
    pid_after(&out, "CHILD ");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let parent_lines = stderr.lines().filter(|l| l.contains("counters file")).count();
    // Once per process: the parent, and the forked child, which tries its own file.
    assert_eq!(parent_lines, 2, "{stderr}");
    assert!(stderr.contains("no-such-dir"), "the message names the path: {stderr}");
    assert!(!missing.exists());
}
