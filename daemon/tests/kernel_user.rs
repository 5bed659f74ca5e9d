//! Kernels are never root: a root daemon (default config) runs each kernel as
//! `kernel.user`, or with `kernel.uid_range` as a uid of its own, with `no_new_privs`,
//! inside a pids cgroup joined before exec, in a private directory it owns. What a user
//! (or an attacker in a cell) can observe: `/proc/<pid>/status` and `/proc/<pid>/cgroup`,
//! `ps`, file modes, what a cell's `os.getuid()`, `open()` and `os.fork()` get. Needs
//! root, the `notebookos-kernel` account (scripts/install-deps.sh) and a pids cgroup
//! hierarchy; fails instead of skipping when `NBOS_REQUIRE_PRIVILEGED=1`.

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod required;
use nbos_test_support::{http, start_daemon, wait_until, Daemon, DaemonConfig, TOKEN};

const NOTEBOOKOSD: &str = env!("CARGO_BIN_EXE_notebookosd");

/// The first uid of the range the isolation test hands out (no account has it).
const RANGE_FIRST: u32 = 2_000_000;

/// Why this host cannot run these tests, if it cannot.
fn cannot_run() -> Option<String> {
    // SAFETY: geteuid(2) has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (a root daemon is what drops kernels to another uid)".to_owned());
    }
    if account("-u").is_none() {
        return Some("no notebookos-kernel account: run scripts/install-deps.sh".to_owned());
    }
    let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").unwrap_or_default();
    if !Path::new("/sys/fs/cgroup/pids/cgroup.procs").exists() && !v2.split_whitespace().any(|c| c == "pids") {
        return Some("no pids cgroup hierarchy (v1 or v2) on this host".to_owned());
    }
    None
}

/// `id <flag> notebookos-kernel` (`-u`: uid, `-g`: primary gid).
fn account(flag: &str) -> Option<u32> {
    let o = Command::new("id").arg(flag).arg("notebookos-kernel").output().ok()?;
    String::from_utf8_lossy(&o.stdout).trim().parse().ok()
}

fn start(extra_kernel_toml: &str) -> Daemon {
    start_daemon(&[], Stdio::inherit(), |c| {
        c.fake_gpus(0).overlay(&format!("[kernel]\n{extra_kernel_toml}")).expect("[kernel] keys");
    })
}

/// Creates a kernel; returns its id and pid.
fn create_kernel(d: &Daemon) -> (String, u32) {
    let (code, body) = http("POST", &format!("{}/api/kernels", d.url), Some(TOKEN), Some(r#"{"name":"python3"}"#));
    assert_eq!(code, 201, "{body}");
    let model: serde_json::Value = serde_json::from_str(&body).expect("json");
    let id = model["id"].as_str().expect("id").to_owned();
    let pid = model["pids"][0].as_u64().and_then(|p| u32::try_from(p).ok()).expect("pid");
    (id, pid)
}

/// The values of a `/proc/<pid>/status` line, e.g. `Uid:` -> its four ids.
fn status(pid: u32, key: &str) -> Vec<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let line = text.lines().find(|l| l.starts_with(&format!("{key}:"))).unwrap_or_else(|| panic!("no {key} in {text}"));
    line[key.len() + 1..].split_whitespace().map(str::to_owned).collect()
}

/// The kernel's pids cgroup directory, from `/proc/<pid>/cgroup` (v1 `pids` line, else v2).
fn pids_cgroup_of(pid: u32) -> PathBuf {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("/proc/<pid>/cgroup");
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        if controllers.split(',').any(|c| c == "pids") {
            return Path::new("/sys/fs/cgroup/pids").join(path.trim_start_matches('/'));
        }
        if controllers.is_empty() && path.contains("notebookos-kernels") {
            return Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
        }
    }
    panic!("no pids cgroup for pid {pid} in:\n{text}");
}

/// The connection file the kernel was started with (`-f` on its command line; a new
/// Python's, as with `kernel.uid_range`, which has no pre-warm pool).
fn connection_file_of(pid: u32) -> PathBuf {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline");
    let args: Vec<String> = raw.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    let i = args.iter().position(|a| a == "-f").expect("-f");
    PathBuf::from(&args[i + 1])
}

/// Runs `code` in the kernel: the execute_result's text, or `ename: evalue` of an error
/// (without double quotes).
async fn run_cell(url: &str, kernel: &str, code: &str) -> String {
    nbos_test_support::run_cell(url, TOKEN, kernel, code).await.value().replace('"', "")
}

fn delete(d: &Daemon, id: &str) {
    assert_eq!(http("DELETE", &format!("{}/api/kernels/{id}", d.url), Some(TOKEN), None).0, 204);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_of_a_root_daemon_runs_unprivileged_in_its_pids_cgroup_with_private_files() {
    if let Some(why) = cannot_run() {
        required::cannot_run("kernel_user", &why);
        return;
    }
    let (uid, gid) = (account("-u").expect("uid"), account("-g").expect("gid"));
    let d = start("");
    let (id, pid) = tokio::task::block_in_place(|| create_kernel(&d));

    // The process: the kernel account in all four ids, no groups, no_new_privs.
    assert_eq!(status(pid, "Uid"), vec![uid.to_string(); 4], "kernel pid {pid}");
    assert_eq!(status(pid, "Gid"), vec![gid.to_string(); 4], "kernel pid {pid}");
    assert!(status(pid, "Groups").is_empty(), "supplementary groups: {:?}", status(pid, "Groups"));
    assert_eq!(status(pid, "NoNewPrivs"), vec!["1"]);

    // In its own pids cgroup, limited to kernel.pids_max's default.
    let cg = pids_cgroup_of(pid);
    let name = cg.file_name().and_then(|n| n.to_str()).expect("cgroup name");
    assert!(name.starts_with(&format!("{id}.")), "{cg:?}");
    assert!(cg.parent().is_some_and(|p| p.ends_with("notebookos") || p.ends_with("notebookos-kernels")), "{cg:?}");
    assert_eq!(std::fs::read_to_string(cg.join("pids.max")).expect("pids.max").trim(), "4096");
    let procs = std::fs::read_to_string(cg.join("cgroup.procs")).expect("cgroup.procs");
    assert!(procs.lines().any(|l| l.trim() == pid.to_string()), "pid {pid} not in {procs}");

    // Its files: the directory and the connection file are the kernel's, private.
    // As the kernel itself knows it (a pre-warmed kernel's command line does not name it).
    let asked = run_cell(&d.url, &id, "from ipykernel.connect import get_connection_file; get_connection_file()").await;
    let conn = PathBuf::from(asked.trim_matches('\''));
    let dir = conn.parent().expect("dir").to_owned();
    let (cm, dm) = (std::fs::metadata(&conn).expect("conn"), std::fs::metadata(&dir).expect("dir"));
    assert_eq!((cm.uid(), cm.mode() & 0o777), (uid, 0o600), "{}", conn.display());
    assert_eq!((dm.uid(), dm.mode() & 0o777), (uid, 0o700), "{}", dir.display());

    // What the cell sees: its uid, and HOME/USER of its own account, not root's.
    let cell = "import os; ' '.join(map(str, (os.getuid(), os.getgid(), os.environ['HOME'], os.environ['USER'])))";
    let seen = run_cell(&d.url, &id, cell).await;
    assert_eq!(seen, format!("'{uid} {gid} {}/home notebookos-kernel'", dir.display()));

    // `ps`: no ipykernel of this daemon (started afresh or pre-warmed) runs as root.
    let ps = Command::new("ps").args(["-eo", "user:32,args"]).output().expect("ps");
    let ours: Vec<String> = String::from_utf8_lossy(&ps.stdout)
        .lines()
        .filter(|l| {
            (l.contains("ipykernel_launcher") || l.contains(".prewarm.py"))
                && l.contains(&dir.parent().expect("kernels").display().to_string())
        })
        .map(str::to_owned)
        .collect();
    assert!(!ours.is_empty(), "ps does not show the kernel");
    assert!(ours.iter().all(|l| !l.starts_with("root ")), "{ours:?}");

    tokio::task::block_in_place(|| delete(&d, &id));
    let deadline = Instant::now() + Duration::from_secs(10);
    while cg.exists() {
        assert!(Instant::now() < deadline, "pids cgroup {} still there after DELETE", cg.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pids of `pid`'s children (`/proc/<pid>/task/<pid>/children`).
fn children_of(pid: u32) -> Vec<u32> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    text.split_whitespace().filter_map(|c| c.parse().ok()).collect()
}

/// A cell that leaves an orphan: a child that forks a grandchild and exits at once; the
/// grandchild exits once it has been reparented to the namespace's init (or after 10 s).
const ORPHAN: &str = r#"import os, time
child = os.fork()
if child == 0:
    if os.fork() == 0:
        end = time.monotonic() + 10
        while os.getppid() != 1 and time.monotonic() < end:
            time.sleep(0.01)
        os._exit(0)
    os._exit(0)
os.waitpid(child, 0)
'orphaned'"#;

/// Issue 29: kernels of the shared `kernel.user` could signal each other and the pre-warm
/// pool. Each kernel process now runs in a PID namespace of its own: a cell sees itself as
/// pid 2 under an init (pid 1) it cannot signal, a neighbour kernel's pid as `ps` on the
/// host shows it names nothing there, `/proc` (and so psutil) shows the kernel's own
/// processes with the pids `os.getpid()` gives, the daemon still knows (API) and signals
/// the host pid, and an orphan the kernel leaves is reaped instead of staying a zombie.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kernel_has_a_pid_namespace_of_its_own_and_cannot_signal_its_neighbour() {
    if let Some(why) = cannot_run() {
        required::cannot_run("kernel_user", &why);
        return;
    }
    let d = start("prewarm_max = 0\n");
    let (a, a_pid) = tokio::task::block_in_place(|| create_kernel(&d));
    let (b, b_pid) = tokio::task::block_in_place(|| create_kernel(&d));
    // The API's pids are the host's; inside, the kernel is pid 2.
    assert_eq!(status(b_pid, "NSpid"), vec![b_pid.to_string(), "2".to_owned()], "kernel pid {b_pid}");
    // The root processes that hold its namespace: its init (pid 1 inside) and the daemon's
    // child above it (`nbos-kernel-init supervise`, outside), by their host pids.
    let init = status(a_pid, "PPid")[0].parse::<u32>().expect("init pid");
    let supervisor = status(init, "PPid")[0].parse::<u32>().expect("supervisor pid");
    let cell = format!(
        "import os, signal\ndef hit(p):\n    try:\n        os.kill(p, signal.SIGKILL)\n        return 'killed'\n    \
         except ProcessLookupError:\n        return 'unreachable'\n    except PermissionError:\n        return 'refused'\n\
         (os.getpid(), os.getppid(), hit({b_pid}), hit({}), hit({supervisor}), hit(1))",
        d.child.id()
    );
    assert_eq!(run_cell(&d.url, &a, &cell).await, "(2, 1, 'unreachable', 'unreachable', 'unreachable', 'refused')");
    let view = format!(
        "import os, psutil\nme = psutil.Process()\n(me.pid, me.name().startswith('python'), sorted(psutil.pids()), \
         os.path.exists('/proc/{b_pid}'), os.readlink('/proc/self'))"
    );
    assert_eq!(run_cell(&d.url, &a, &view).await, "(2, True, [1, 2], False, '2')");
    assert_eq!(run_cell(&d.url, &b, "6 * 7").await, "42", "the neighbour was hurt");
    // The orphan's zombie is reaped by the namespace's init: it ends with the kernel as its
    // only child.
    assert_eq!(run_cell(&d.url, &a, ORPHAN).await, "'orphaned'");
    wait_until(&format!("init {init} keeps only the kernel {a_pid} as its child"), Duration::from_secs(10), || {
        children_of(init) == vec![a_pid]
    });
    for id in [&a, &b] {
        tokio::task::block_in_place(|| delete(&d, id));
    }
}

/// A daemon killed outright (SIGKILL: no shutdown, no cleanup) leaves no kernel running:
/// the daemon's child that holds the kernel's PID namespace sees its parent gone within a
/// second and ends the namespace (what ipykernel's parent poller did before kernels had
/// one, and it cannot see its parent from inside).
#[test]
fn a_kernel_ends_within_seconds_when_its_daemon_is_killed() {
    if let Some(why) = cannot_run() {
        required::cannot_run("kernel_user", &why);
        return;
    }
    let mut d = start("prewarm_max = 0\n");
    let (_id, pid) = create_kernel(&d);
    let running = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
            .is_some_and(|zombie| !zombie)
    };
    assert!(running(pid), "kernel {pid} does not run");
    d.child.kill().expect("SIGKILL the daemon");
    d.child.wait().expect("reap the daemon");
    wait_until(&format!("kernel {pid} ends after its daemon was killed"), Duration::from_secs(10), || !running(pid));
}

/// GPU cells of two kernels in PID namespaces of their own (both pid 2 inside) on one fake
/// GPU: each shim registers as its own process (the daemon knows it by its host pid and
/// tells the shim so), so both cells get the GPU in turn and compute, and each kernel's
/// counters file is named by its host pid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_kernels_in_pid_namespaces_of_their_own_take_turns_on_one_gpu() {
    if let Some(why) = cannot_run() {
        required::cannot_run("kernel_user", &why);
        return;
    }
    let d = start_daemon(&[], Stdio::inherit(), |c| {
        c.fake_gpus(1).idle_release(Duration::from_secs(1)).config.kernel.prewarm_max = 0;
    });
    let body = r#"{"name":"notebookos-python-1gpu"}"#;
    let mut kernels = Vec::new();
    for _ in 0..2 {
        let (code, text) = http("POST", &format!("{}/api/kernels", d.url), Some(TOKEN), Some(body));
        assert_eq!(code, 201, "{text}");
        let model: serde_json::Value = serde_json::from_str(&text).expect("json");
        let pid = model["pids"][0].as_u64().and_then(|p| u32::try_from(p).ok()).expect("pid");
        kernels.push((model["id"].as_str().expect("id").to_owned(), pid));
    }
    let cell =
        "from nbos_kernel import gpu\nimport os\n(os.getpid(), gpu.open_device().buffer(1024, 2.0).to_host()[0])";
    for (id, _) in &kernels {
        assert_eq!(run_cell(&d.url, id, cell).await, "(2, 2.0)", "kernel {id}");
    }
    let (_, status) = http("GET", &format!("{}/api/v1/status", d.url), Some(TOKEN), None);
    let status: serde_json::Value = serde_json::from_str(&status).expect("status json");
    // The test daemon's runtime directory is `run` beside its state directory.
    let state_dir = PathBuf::from(status["state_dir"].as_str().expect("state_dir"));
    let counters = state_dir.parent().expect("parent").join("run/counters");
    for (id, pid) in &kernels {
        assert!(counters.join(pid.to_string()).exists(), "no counters file for kernel {id} (host pid {pid})");
    }
    assert!(!counters.join("2").exists(), "a counters file is named by a pid inside a namespace");
    for (id, _) in &kernels {
        tokio::task::block_in_place(|| delete(&d, id));
    }
}

/// Forks children that sleep until too many: how many, and what the failing fork raised.
const FORK_PAST_THE_LIMIT: &str = r#"import os, errno, time
kids, err = [], None
try:
    for _ in range(200):
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        kids.append(pid)
except OSError as e:
    err = (type(e).__name__, errno.errorcode.get(e.errno))
for k in kids:
    os.kill(k, 9)
    os.waitpid(k, 0)
(len(kids) < 200, err)"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_past_pids_max_fails_with_eagain_and_the_kernel_lives_on() {
    if let Some(why) = cannot_run() {
        required::cannot_run("kernel_user", &why);
        return;
    }
    let d = start("pids_max = 48\n");
    let (id, pid) = tokio::task::block_in_place(|| create_kernel(&d));
    let cg = pids_cgroup_of(pid);
    assert_eq!(std::fs::read_to_string(cg.join("pids.max")).expect("pids.max").trim(), "48");
    let out = run_cell(&d.url, &id, FORK_PAST_THE_LIMIT).await;
    assert_eq!(out, "(True, ('BlockingIOError', 'EAGAIN'))");
    // The cgroup counted the refusals (pids.events: `max N`).
    let events = std::fs::read_to_string(cg.join("pids.events")).expect("pids.events");
    let refused: u64 = events.lines().find_map(|l| l.strip_prefix("max ")).and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(refused >= 1, "pids.events: {events}");
    // The kernel itself survived and still runs cells.
    assert_eq!(run_cell(&d.url, &id, "6 * 7").await, "42");
    tokio::task::block_in_place(|| delete(&d, &id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernels_with_uids_of_their_own_cannot_read_each_others_connection_files() {
    if let Some(why) = cannot_run() {
        required::cannot_run("kernel_user", &why);
        return;
    }
    // What an earlier run (a crash) left under a range uid: a process and a file. The
    // daemon kills and removes them at start, before it hands that uid out.
    let stale_uid = RANGE_FIRST + 5;
    let stale_file = format!("/tmp/nbos-stale-{}", uuid::Uuid::new_v4().simple());
    std::fs::write(&stale_file, "old").expect("stale file");
    std::os::unix::fs::chown(&stale_file, Some(stale_uid), Some(stale_uid)).expect("chown");
    let mut stale = Command::new("sleep").arg("300").uid(stale_uid).gid(stale_uid).spawn().expect("stale process");
    // The host's /dev/shm (shm_size_mib = 0): what a uid leaves there is cleaned too.
    let d = start(&format!("uid_range = [{RANGE_FIRST}, {}]\nshm_size_mib = 0\n", RANGE_FIRST + 9));
    let deadline = Instant::now() + Duration::from_secs(20);
    while (stale.try_wait().expect("wait").is_none() || Path::new(&stale_file).exists()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(stale.try_wait().expect("wait").is_some(), "the stale process of a range uid still runs");
    assert!(!Path::new(&stale_file).exists(), "the stale file of a range uid is still there");
    let (a, pid_a) = tokio::task::block_in_place(|| create_kernel(&d));
    let (b, pid_b) = tokio::task::block_in_place(|| create_kernel(&d));
    // Lowest free first, gid = uid.
    assert_eq!(status(pid_a, "Uid")[0], RANGE_FIRST.to_string());
    assert_eq!(status(pid_a, "Gid")[0], RANGE_FIRST.to_string());
    assert_eq!(status(pid_b, "Uid")[0], (RANGE_FIRST + 1).to_string());
    assert_eq!(status(pid_b, "Gid")[0], (RANGE_FIRST + 1).to_string());
    let (conn_a, conn_b) = (connection_file_of(pid_a), connection_file_of(pid_b));
    assert_eq!(std::fs::metadata(&conn_b).expect("b").uid(), RANGE_FIRST + 1);

    // The attack: kernel A reads kernel B's connection file (its HMAC key) and directory.
    let read = |p: &Path| format!("len(open({:?}).read()) > 0", p.display().to_string());
    let stolen = run_cell(&d.url, &a, &read(&conn_b)).await;
    assert!(stolen.starts_with("PermissionError: [Errno 13] Permission denied"), "{stolen}");
    let listed = run_cell(&d.url, &a, &format!("import os; os.listdir({:?})", conn_b.parent().expect("dir"))).await;
    assert!(listed.starts_with("PermissionError"), "{listed}");
    // Its own is readable.
    assert_eq!(run_cell(&d.url, &a, &read(&conn_a)).await, "True");

    // The attack on a reused uid: B leaves files in the shared temporary directories and a
    // SysV shared memory segment, hoping the next kernel with its uid reads them (or that
    // they outlive it). Deleting B removes them, as systemd's RemoveIPC does.
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let leftovers =
        [format!("/tmp/nbos-left-{tag}"), format!("/dev/shm/nbos-left-{tag}"), format!("/tmp/nbos-dir-{tag}")];
    let plant = format!(
        "import os, ctypes\nopen({f0:?}, 'w').write('secret'); open({f1:?}, 'w').write('secret')\n\
         os.mkdir({d:?}); open({d:?} + '/inner', 'w').write('secret')\n\
         libc = ctypes.CDLL(None, use_errno=True)\nshmid = libc.shmget(0, 4096, 0o1600)\nshmid",
        f0 = leftovers[0],
        f1 = leftovers[1],
        d = leftovers[2],
    );
    let shmid: i32 = run_cell(&d.url, &b, &plant).await.trim().parse().expect("a segment id");
    assert!(shmid >= 0, "shmget failed in the kernel");
    let segments = || std::fs::read_to_string("/proc/sysvipc/shm").expect("sysvipc");
    let has_segment =
        |text: &str| text.lines().skip(1).any(|l| l.split_whitespace().nth(1) == Some(&shmid.to_string()));
    assert!(has_segment(&segments()), "the segment exists while B lives");
    for p in &leftovers {
        assert_eq!(std::fs::symlink_metadata(p).expect("planted").uid(), RANGE_FIRST + 1);
    }
    // B also shares a sticky directory, where A keeps a private directory: B's cleanup runs
    // as B's uid, which cannot enter A's directory, so A's file outlives it (as root, a
    // recursive delete of B's directory would have taken it).
    let shared = format!("/tmp/nbos-shared-{tag}");
    run_cell(&d.url, &b, &format!("import os; os.mkdir({shared:?}); os.chmod({shared:?}, 0o1777)")).await;
    let kept = format!("{shared}/a-dir/file");
    run_cell(
        &d.url,
        &a,
        &format!("import os; os.mkdir({shared:?} + '/a-dir', 0o700); open({kept:?}, 'w').write('mine')"),
    )
    .await;
    assert_eq!(std::fs::metadata(&kept).expect("A's file").uid(), RANGE_FIRST);
    tokio::task::block_in_place(|| delete(&d, &b));
    // Removed by a thread of the daemon's, just after the delete.
    let deadline = Instant::now() + Duration::from_secs(20);
    while (leftovers.iter().any(|p| std::fs::symlink_metadata(p).is_ok()) || has_segment(&segments()))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    for p in &leftovers {
        assert!(std::fs::symlink_metadata(p).is_err(), "{p} outlived the kernel whose uid owned it");
    }
    assert!(!has_segment(&segments()), "B's shared memory segment outlived it");
    assert_eq!(std::fs::read_to_string(&kept).expect("A's file survives B's cleanup"), "mine");
    std::fs::remove_dir_all(&shared).expect("remove the shared directory");

    // A uid that still has a live process (here one started as it by hand) is not handed
    // out, and a given-back uid is the last to be taken again (next fit): C gets neither.
    let squatter = Command::new("sleep")
        .arg("120")
        .uid(RANGE_FIRST + 2)
        .gid(RANGE_FIRST + 2)
        .spawn()
        .expect("a process as the next uid");
    let (c, pid_c) = tokio::task::block_in_place(|| create_kernel(&d));
    assert_eq!(status(pid_c, "Uid")[0], (RANGE_FIRST + 3).to_string());
    let mut squatter = squatter;
    let _ = squatter.kill();
    let _ = squatter.wait();
    tokio::task::block_in_place(|| {
        delete(&d, &a);
        delete(&d, &c);
    });
}

#[test]
fn a_root_daemon_refuses_a_kernel_account_that_is_root_or_missing() {
    if let Some(why) = cannot_run() {
        required::cannot_run("kernel_user", &why);
        return;
    }
    let dir = nbos_test_support::daemon::kernel_traversable_tempdir();
    for (kernel_toml, says) in [
        ("user = \"root\"\n", "kernel.user`: must name an unprivileged account"),
        ("group = \"root\"\n", "kernel.group`: must name an unprivileged group"),
        ("uid_range = [0, 10]\n", "must not include uid 0 (root)"),
        (
            "user = \"nbos-no-such-user\"\n",
            "useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin nbos-no-such-user",
        ),
    ] {
        let mut c = DaemonConfig::new(dir.path());
        c.fake_gpus(0).config.http.allow_unauthenticated_loopback = true;
        c.overlay(&format!("[kernel]\n{kernel_toml}")).expect("[kernel] keys");
        let cfg = c.write(&dir.path().join("c.toml")).expect("config");
        let out = Command::new(NOTEBOOKOSD).arg("--config").arg(&cfg).output().expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{kernel_toml}: started");
        assert!(err.contains(says), "{kernel_toml}: {err}");
    }
}
