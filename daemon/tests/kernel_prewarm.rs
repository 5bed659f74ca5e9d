//! Pre-warmed kernels (docs/prewarm.md): the daemon keeps Python processes with ipykernel
//! imported, and a new kernel takes one over. What an operator and a user can check: the
//! pool's processes in `ps` (`.prewarm.py`), `notebookos_prewarm_*` on /metrics, the new
//! kernel's pid being one of them, and, from a cell, that the kernel is exactly what a
//! newly started one would be (its environment, account, directory, cgroup, namespace).

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nbos_test_support::{http, run_cell, start_daemon, Daemon, TOKEN};

const NOTEBOOKOSD: &str = env!("CARGO_BIN_EXE_notebookosd");

/// How long a pool may take to fill (Pythons importing ipykernel beside other tests).
const FILL: Duration = Duration::from_secs(90);

/// Pids of processes started from the pool's launcher of the daemon whose kernels
/// directory is `kernels_dir`: pool processes, and the kernels that took one over.
fn launcher_pids(kernels_dir: &str) -> BTreeSet<u32> {
    let launcher = format!("{kernels_dir}/.prewarm.py");
    let Ok(entries) = std::fs::read_dir("/proc") else { return BTreeSet::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmd).split('\0').any(|a| a == launcher)
        })
        .collect()
}

/// The pool's processes: launcher processes not yet dumpable (their `/proc` entries are
/// files are root's), which a kernel is again once it took one over.
fn pool_pids(kernels_dir: &str) -> BTreeSet<u32> {
    use std::os::unix::fs::MetadataExt;
    launcher_pids(kernels_dir)
        .into_iter()
        .filter(|pid| std::fs::metadata(format!("/proc/{pid}/status")).is_ok_and(|m| m.uid() == 0))
        .collect()
}

/// The value of one series on /metrics (0 when absent).
fn metric(d: &Daemon, series: &str) -> f64 {
    let (_, text) = http("GET", &format!("{}/metrics", d.url), None, None);
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Waits until `n` pool processes are ready; returns their pids.
fn wait_for_ready_pool(d: &Daemon, kernels_dir: &str, n: usize) -> BTreeSet<u32> {
    let deadline = Instant::now() + FILL;
    loop {
        let ready = metric(d, r#"notebookos_prewarm_pool_processes{state="ready"}"#);
        let warming = metric(d, r#"notebookos_prewarm_pool_processes{state="warming"}"#);
        let pids = pool_pids(kernels_dir);
        if ready == n as f64 && warming == 0.0 && pids.len() == n {
            return pids;
        }
        assert!(Instant::now() < deadline, "pool not refilled to {n}: ready {ready}, warming {warming}, pids {pids:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn start(prewarm: &str) -> (Daemon, String) {
    let d = start_daemon(&[], Stdio::inherit(), |c| {
        c.fake_gpus(1).overlay(&format!("[kernel]\n{prewarm}")).expect("[kernel] keys");
    });
    let (_, status) = http("GET", &format!("{}/api/v1/status", d.url), Some(TOKEN), None);
    let status: serde_json::Value = serde_json::from_str(&status).expect("status json");
    let state_dir = status["state_dir"].as_str().expect("state_dir").to_owned();
    // Kernels' directories are on disk, in the state directory.
    let kernels_dir = std::path::Path::new(&state_dir).join("kernels");
    (d, kernels_dir.display().to_string())
}

fn create_kernel(d: &Daemon, body: &serde_json::Value) -> (String, u32) {
    let (code, text) = http("POST", &format!("{}/api/kernels", d.url), Some(TOKEN), Some(&body.to_string()));
    assert_eq!(code, 201, "{text}");
    let model: serde_json::Value = serde_json::from_str(&text).expect("json");
    let pid = model["pids"][0].as_u64().and_then(|p| u32::try_from(p).ok()).expect("pid");
    (model["id"].as_str().expect("id").to_owned(), pid)
}

/// A cell's view of its own kernel, as JSON.
const SELF_PORTRAIT: &str = r#"import json, os, sys, ctypes
from ipykernel.connect import get_connection_file
json.dumps({
    "uid": os.getuid(), "cwd": os.getcwd(), "home": os.environ.get("HOME"),
    "project": os.environ.get("KERNEL_PROJECT"), "kernel_id": os.environ.get("NOTEBOOKOS_KERNEL_ID"),
    "connection_file": get_connection_file(), "argv0": sys.argv[0],
    "cgroup": open("/proc/self/cgroup").read(),
    "cuInit": ctypes.CDLL("libcuda.so.1").cuInit(0),
})"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_kernels_take_over_pre_warmed_processes_which_are_refilled() {
    // SAFETY: geteuid(2) has no arguments and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let (d, kernels_dir) = tokio::task::block_in_place(|| start("prewarm_min = 2\nprewarm_max = 2\n"));
    let url = d.url.clone();
    let before = tokio::task::block_in_place(|| wait_for_ready_pool(&d, &kernels_dir, 2));

    // A GPU kernel with a client variable: it is one of the pool's processes.
    let body = serde_json::json!({ "name": "notebookos-python-1gpu", "env": { "KERNEL_PROJECT": "vision" } });
    let (id, pid) = tokio::task::block_in_place(|| create_kernel(&d, &body));
    assert!(before.contains(&pid), "kernel pid {pid} is not one of the pool's {before:?}");
    assert_eq!(tokio::task::block_in_place(|| metric(&d, r#"notebookos_prewarm_takes_total{result="hit"}"#)), 1.0);

    // From inside, it is the kernel a new Python would have been.
    let portrait = run_cell(&url, TOKEN, &id, SELF_PORTRAIT).await.value();
    let p: serde_json::Value =
        serde_json::from_str(portrait.trim_matches('\'')).unwrap_or_else(|e| panic!("{e}: {portrait}"));
    let own_dir = format!("{kernels_dir}/{id}");
    // Its home (under the home quota when root) is its working directory.
    assert_eq!(p["cwd"], format!("{own_dir}/home").as_str(), "{p}");
    assert_eq!(p["connection_file"], format!("{own_dir}/connection-0.json").as_str(), "{p}");
    assert_eq!(p["project"], "vision", "the client's KERNEL_* did not arrive: {p}");
    assert_eq!(p["kernel_id"], id.as_str(), "{p}");
    assert_eq!(p["argv0"], "ipykernel_launcher", "{p}");
    assert_eq!(p["cuInit"], 0, "the CUDA shim did not serve the pre-warmed kernel: {p}");
    if root {
        assert_ne!(p["uid"], 0, "a pre-warmed kernel runs as root: {p}");
        assert_eq!(p["home"], format!("{own_dir}/home").as_str(), "{p}");
        // In the kernel's own cgroup (pids, memory, as a new kernel joins before exec).
        assert!(p["cgroup"].as_str().is_some_and(|c| c.contains(&id)), "not in the kernel's cgroups: {p}");
    }
    // The attack: a kernel of the same account writes its own kernel to a pool process
    // (its control socket) or reads what it was started with. Both are refused: the pool
    // process is not dumpable, and in the kernel's PID namespace its /proc has no such pid.
    if root {
        let target =
            *tokio::task::block_in_place(|| wait_for_ready_pool(&d, &kernels_dir, 2)).iter().next().expect("pid");
        for path in [format!("/proc/{target}/fd/0"), format!("/proc/{target}/environ")] {
            let tried = run_cell(&url, TOKEN, &id, &format!("open({path:?}, 'rb').read(1)")).await.value();
            assert!(
                tried.contains("PermissionError") || tried.contains("FileNotFoundError"),
                "a kernel opened {path}: {tried}"
            );
        }
    }
    assert_eq!(run_cell(&url, TOKEN, &id, "x = 20\nx + 22").await.value(), "42", "the namespace");
    assert_eq!(run_cell(&url, TOKEN, &id, "x").await.value(), "20");

    // The pool is refilled with a new process, and a dead idle one is replaced.
    let refilled = tokio::task::block_in_place(|| wait_for_ready_pool(&d, &kernels_dir, 2));
    assert!(!refilled.contains(&pid), "the taken process is still counted in the pool");
    let victim = *refilled.iter().next().expect("a pool pid");
    // SAFETY: kill(2) on a pid of a pool process this test's daemon started.
    unsafe { libc::kill(i32::try_from(victim).expect("pid"), libc::SIGKILL) };
    let replaced = tokio::task::block_in_place(|| wait_for_ready_pool(&d, &kernels_dir, 2));
    assert!(!replaced.contains(&victim), "the killed process {victim} is still in the pool");

    // A second kernel takes another one; deleting kernels and stopping the daemon leaves
    // no pool process behind.
    let (id2, pid2) = tokio::task::block_in_place(|| create_kernel(&d, &serde_json::json!({ "name": "python3" })));
    assert!(replaced.contains(&pid2), "kernel pid {pid2} is not one of the pool's {replaced:?}");
    assert_eq!(run_cell(&url, TOKEN, &id2, "1 + 1").await.value(), "2");
    for k in [&id, &id2] {
        assert_eq!(http("DELETE", &format!("{url}/api/kernels/{k}"), Some(TOKEN), None).0, 204);
    }
    drop(d);
    let deadline = Instant::now() + Duration::from_secs(15);
    while !launcher_pids(&kernels_dir).is_empty() {
        assert!(
            Instant::now() < deadline,
            "pre-warmed processes outlived the daemon: {:?}",
            launcher_pids(&kernels_dir)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_daemon_without_a_pool_starts_kernels_afresh() {
    let (d, kernels_dir) = start("prewarm_max = 0\n");
    let (id, _) = create_kernel(&d, &serde_json::json!({ "name": "python3" }));
    assert!(launcher_pids(&kernels_dir).is_empty(), "prewarm_max = 0 started pool processes");
    assert_eq!(metric(&d, r#"notebookos_prewarm_takes_total{result="hit"}"#), 0.0);
    assert_eq!(http("DELETE", &format!("{}/api/kernels/{id}", d.url), Some(TOKEN), None).0, 204);
}

#[test]
fn a_pool_bigger_than_its_cap_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("tmp");
    let config = dir.path().join("c.toml");
    std::fs::write(&config, "[kernel]\nprewarm_min = 4\nprewarm_max = 2\n").expect("write");
    let out = std::process::Command::new(NOTEBOOKOSD)
        .args(["--check-config", "--config"])
        .arg(&config)
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("kernel.prewarm_min"), "{err}");
}

/// The state letter of `/proc/<pid>/stat` (`None`: gone).
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

/// Waits until none of `pids` is a live process (killed and reaped, or a zombie).
fn wait_gone(pids: &BTreeSet<u32>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Some(p) = pids.iter().find(|p| proc_state(**p).is_some_and(|s| s != 'Z')) {
        assert!(Instant::now() < deadline, "stopped pool process {p} is still there ({:?})", proc_state(*p));
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Issue 29: a pool process stopped with SIGSTOP (here by root, as if the pool guard were
/// bypassed) was still handed over as ready, and the kernel start failed after 30 s. Now a
/// stopped process is killed (at the hand-over's check, or by the refill), counted on
/// `notebookos_prewarm_rejected_total{reason="stopped"}`, and the kernel starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_pool_process_is_not_handed_over_and_the_kernel_starts() {
    let (d, kernels_dir) = tokio::task::block_in_place(|| start("prewarm_min = 2\nprewarm_max = 2\n"));
    let url = d.url.clone();
    let stopped = tokio::task::block_in_place(|| wait_for_ready_pool(&d, &kernels_dir, 2));
    for pid in &stopped {
        // SAFETY: kill(2) on a pool process of this test's daemon.
        assert_eq!(unsafe { libc::kill(i32::try_from(*pid).expect("pid"), libc::SIGSTOP) }, 0);
    }
    let (id, pid) = tokio::task::block_in_place(|| create_kernel(&d, &serde_json::json!({ "name": "python3" })));
    assert!(!stopped.contains(&pid), "the stopped pool process {pid} was handed the kernel");
    assert_eq!(run_cell(&url, TOKEN, &id, "6 * 7").await.value(), "42");
    let rejected = tokio::task::block_in_place(|| metric(&d, r#"notebookos_prewarm_rejected_total{reason="stopped"}"#));
    assert!(rejected >= 1.0, "no stopped pool process was counted as rejected");
    // Every stopped one is killed, and the pool is whole again.
    tokio::task::block_in_place(|| wait_gone(&stopped));
    let refilled = tokio::task::block_in_place(|| wait_for_ready_pool(&d, &kernels_dir, 2));
    assert!(refilled.is_disjoint(&stopped), "{refilled:?} still holds a stopped process of {stopped:?}");
    assert_eq!(http("DELETE", &format!("{url}/api/kernels/{id}"), Some(TOKEN), None).0, 204);
}

/// Issue 29, as a hostile kernel does it: a cell of a kernel of the shared `kernel.user`
/// sends SIGSTOP to every pool process (pids as `ps` shows them). Each kernel runs in a PID
/// namespace of its own (`kernel.pid_namespace`, on by default for a root daemon), where
/// those pids name nothing: every signal fails with ESRCH, the pool stays whole, and the
/// next kernel takes a pool process over. (Where the host refuses PID namespaces, which
/// NBOS_REQUIRE_PRIVILEGED=1 does not accept, the pool guard or the hand-over check is left:
/// the next kernel still starts.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_that_stops_the_pool_cannot_stop_the_next_kernel_start() {
    const TEST: &str = "a_kernel_that_stops_the_pool_cannot_stop_the_next_kernel_start";
    // SAFETY: geteuid(2) has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var("NBOS_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
            "{TEST}: NBOS_REQUIRE_PRIVILEGED=1 but not root (the kernels' own account and PID namespace)"
        );
        eprintln!("skipped {TEST}: needs root (kernels as kernel.user in PID namespaces of their own)");
        return;
    }
    let (d, kernels_dir) = tokio::task::block_in_place(|| start("prewarm_min = 2\nprewarm_max = 2\n"));
    let url = d.url.clone();
    tokio::task::block_in_place(|| wait_for_ready_pool(&d, &kernels_dir, 2));
    let (attacker, _) = tokio::task::block_in_place(|| create_kernel(&d, &serde_json::json!({ "name": "python3" })));
    let pool = tokio::task::block_in_place(|| wait_for_ready_pool(&d, &kernels_dir, 2));
    let pids: Vec<u32> = pool.iter().copied().collect();
    let daemon_pid = d.child.id();
    // The pool's pids, then the daemon's, as a user would find them with `ps`.
    let cell = format!(
        "import os, signal\nr = [str(os.getpid())]\nfor p in {pids:?} + [{daemon_pid}]:\n    try:\n        \
         os.kill(p, signal.SIGSTOP)\n        r.append('stopped')\n    except PermissionError:\n        \
         r.append('refused')\n    except ProcessLookupError:\n        r.append('unreachable')\n' '.join(r)"
    );
    let outcome = run_cell(&url, TOKEN, &attacker, &cell).await.value();
    let own_namespace = outcome.starts_with("'2 ");
    if std::env::var("NBOS_REQUIRE_PRIVILEGED").as_deref() == Ok("1") {
        assert!(own_namespace, "{TEST}: the kernel is not in a PID namespace of its own: {outcome}");
    }
    assert!(pids.iter().all(|p| proc_state(*p) != Some('T')), "a pool process is stopped: {outcome}");
    let (id, pid) = tokio::task::block_in_place(|| create_kernel(&d, &serde_json::json!({ "name": "python3" })));
    assert_ne!(proc_state(pid), Some('T'), "the new kernel {pid} is a stopped process");
    assert_eq!(run_cell(&url, TOKEN, &id, "6 * 7").await.value(), "42");
    if own_namespace {
        assert_eq!(
            outcome,
            format!("'2 {}'", vec!["unreachable"; pids.len() + 1].join(" ")),
            "a kernel in its own PID namespace reached a pool process or the daemon"
        );
        assert!(pool.contains(&pid), "the next kernel ({pid}) did not take a pool process of {pool:?}");
    } else {
        eprintln!("{TEST}: this host refuses PID namespaces; the cell's signals: {outcome}");
    }
    for k in [&attacker, &id] {
        assert_eq!(http("DELETE", &format!("{url}/api/kernels/{k}"), Some(TOKEN), None).0, 204);
    }
}
