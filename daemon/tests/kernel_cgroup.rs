//! `kernel.memory_limit_mib` puts each kernel's process tree in a memory cgroup (v2 or
//! v1): a real daemon, a real ipykernel, the host's real cgroup filesystem. Needs root
//! and a memory hierarchy; fails instead of skipping when `NBOS_REQUIRE_PRIVILEGED=1`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

const LIMIT_MIB: u64 = 1024;

mod required;
use nbos_test_support::{http, start_daemon, Daemon, TOKEN};

/// Why this host cannot run the test, if it cannot.
fn cannot_run() -> Option<String> {
    // SAFETY: geteuid(2) has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root to create cgroups".to_owned());
    }
    let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").unwrap_or_default();
    let v1 = Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists();
    if !v1 && !v2.split_whitespace().any(|c| c == "memory") {
        return Some("no cgroup memory hierarchy (v1 or v2) on this host".to_owned());
    }
    None
}

fn start() -> Daemon {
    start_daemon(&[], Stdio::inherit(), |c| {
        c.fake_gpus(0).config.kernel.memory_limit_mib = LIMIT_MIB;
    })
}

/// The kernel's memory cgroup directory and limit file, from `/proc/<pid>/cgroup`.
fn memory_cgroup_of(pid: u64) -> (String, PathBuf, &'static str) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("/proc/<pid>/cgroup");
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        if controllers.split(',').any(|c| c == "memory") {
            let dir = Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
            return (path.to_owned(), dir, "memory.limit_in_bytes");
        }
        if controllers.is_empty() && path.contains("notebookos-kernels") {
            let dir = Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
            return (path.to_owned(), dir, "memory.max");
        }
    }
    panic!("no memory cgroup for pid {pid} in:\n{text}");
}

#[test]
fn kernel_process_tree_runs_in_a_memory_cgroup_removed_on_delete() {
    if let Some(why) = cannot_run() {
        required::cannot_run("kernel_cgroup", &why);
        return;
    }
    let d = start();
    let (code, body) = http("POST", &format!("{}/api/kernels", d.url), Some(TOKEN), Some(r#"{"name":"python3"}"#));
    assert_eq!(code, 201, "{body}");
    let model: serde_json::Value = serde_json::from_str(&body).expect("json");
    let id = model["id"].as_str().expect("id").to_owned();
    let pid = model["pids"][0].as_u64().expect("pid");

    let (path, dir, limit_file) = memory_cgroup_of(pid);
    assert!(
        // `<kernel id>.<host tag>`: hosts on one machine keep their replicas apart.
        path.contains(&format!("/notebookos/{id}.")) || path.contains(&format!("/notebookos-kernels/{id}.")),
        "kernel pid {pid} is in memory cgroup {path}, not the kernel's"
    );
    let limit = std::fs::read_to_string(dir.join(limit_file)).expect("limit file");
    assert_eq!(limit.trim(), (LIMIT_MIB * 1024 * 1024).to_string(), "{}", dir.join(limit_file).display());
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).expect("cgroup.procs");
    assert!(procs.lines().any(|l| l.trim() == pid.to_string()), "pid {pid} not in {procs}");

    assert_eq!(http("DELETE", &format!("{}/api/kernels/{id}", d.url), Some(TOKEN), None).0, 204);
    let deadline = Instant::now() + Duration::from_secs(10);
    while dir.exists() {
        assert!(Instant::now() < deadline, "cgroup {} still there after DELETE", dir.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}
