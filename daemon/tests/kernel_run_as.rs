//! `kernel.run_as = "owner"` (docs/users.md, "Kernels run as their users", docs/prewarm.md): each kernel runs as
//! the system account of its owner, from the pre-warm pool or a new Python. What a user
//! checks: `/proc/<pid>/status` (uids, gids, groups, capabilities) and, from the kernel
//! itself, `os.getresuid()`, `HOME`, the working directory; what a refused create says.
//!
//! Owners come from authentication (another part): until the HTTP API sets them, these
//! tests create kernels through the library (`Kernels::create(.., owner)`, what the
//! gateway's create handler calls), with two test accounts made here (`useradd`, reused);
//! only the refusal of a kernel without an owner goes through a real daemon's HTTP API.
//! Needs root and the `notebookos-kernel` account; fails instead of skipping when
//! `NBOS_REQUIRE_PRIVILEGED=1`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use notebookosd::config::{KernelConfig, RunAs};
use notebookosd::kernel::binding::{Binder, LogOnlyLeases};
use notebookosd::kernel::identity::KernelUsers;
use notebookosd::kernel::registry::CreateError;
use notebookosd::kernel::sandbox::{self, Sandbox};
use notebookosd::kernel::{Kernels, LocalKernel};
use notebookosd::metrics::{Metrics, PrewarmRejectLabels, PrewarmTakeLabels, StateLabels};

mod required;
use nbos_test_support::{http, start_daemon, TOKEN};

/// The two owners' accounts (made once, kept: tests of other runs reuse them).
const OWNER_A: &str = "nbos-runas-a";
const OWNER_B: &str = "nbos-runas-b";
/// A supplementary group of A's, to check the kernel has its owner's groups.
const GROUP_A: &str = "nbos-runas-ga";

/// Why this host cannot run these tests, if it cannot.
fn cannot_run() -> Option<String> {
    // SAFETY: geteuid(2) has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (only a root daemon runs kernels as their owners)".to_owned());
    }
    if Command::new("id").arg("notebookos-kernel").output().map(|o| !o.status.success()).unwrap_or(true) {
        return Some("no notebookos-kernel account: run scripts/install-deps.sh".to_owned());
    }
    if let Err(e) = ensure_accounts() {
        return Some(format!("cannot create the test accounts: {e}"));
    }
    None
}

/// Skips (or fails under NBOS_REQUIRE_PRIVILEGED=1) where the host cannot run `test`.
fn skip(test: &str) -> bool {
    match cannot_run() {
        Some(why) => {
            required::cannot_run(test, &why);
            true
        }
        None => false,
    }
}

/// Makes the test accounts unless they exist: A (with a supplementary group) and B, each
/// with a home of its own, regular accounts (uid >= 1000, kernel.owner_uid_min's default):
/// one an older version made below it is made again.
fn ensure_accounts() -> Result<(), String> {
    static ONCE: Mutex<bool> = Mutex::new(false);
    let mut done = ONCE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if *done {
        return Ok(());
    }
    let run = |cmd: &mut Command| -> Result<(), String> {
        let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr)))
        }
    };
    let exists =
        |db: &str, name: &str| Command::new("getent").args([db, name]).output().is_ok_and(|o| o.status.success());
    if !exists("group", GROUP_A) {
        run(Command::new("groupadd").arg("--system").arg(GROUP_A))?;
    }
    for (name, groups) in [(OWNER_A, Some(GROUP_A)), (OWNER_B, None)] {
        if exists("passwd", name) && account(name).0 < 1000 {
            run(Command::new("userdel").args(["--remove", name]))?;
        }
        if !exists("passwd", name) {
            let mut cmd = Command::new("useradd");
            cmd.args(["--create-home", "--shell", "/usr/sbin/nologin"]);
            if let Some(g) = groups {
                cmd.args(["--groups", g]);
            }
            run(cmd.arg(name))?;
        }
    }
    *done = true;
    Ok(())
}

/// An account's uid, primary gid and home (`getent passwd`).
fn account(name: &str) -> (u32, u32, PathBuf) {
    let out = Command::new("getent").args(["passwd", name]).output().expect("getent");
    let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let f: Vec<&str> = line.split(':').collect();
    (f[2].parse().expect("uid"), f[3].parse().expect("gid"), PathBuf::from(f[5]))
}

/// A group's gid (`getent group`).
fn gid_of(group: &str) -> u32 {
    let out = Command::new("getent").args(["group", group]).output().expect("getent");
    String::from_utf8_lossy(&out.stdout).split(':').nth(2).and_then(|g| g.trim().parse().ok()).expect("gid")
}

/// The host's kernel confinement, as a root daemon configures it (the home quota off: no
/// loop devices needed; the PID namespace's init stays a fork of this test process).
fn configure_sandbox() {
    sandbox::configure(Sandbox {
        open_files_max: Some(65_536),
        nproc_max: Some(32_768),
        shm_bytes: Some(256 << 20),
        home_quota_bytes: None,
        limit_address_space: false,
        pid_namespace: notebookosd::sys::pid_namespace::supported(),
    });
}

/// One host's kernels with `run_as = "owner"` and a pool of at most `prewarm_max`.
struct Host {
    kernels: Kernels,
    metrics: Arc<Metrics>,
    _dir: tempfile::TempDir,
}

fn host(prewarm_max: u32) -> Host {
    host_with(prewarm_max, KernelConfig { run_as: RunAs::Owner, ..KernelConfig::default() }, Vec::new())
}

/// [`host`] with `cfg`'s accounts (`cfg.run_as` is "owner") and the kernels' extra `env`.
fn host_with(prewarm_max: u32, cfg: KernelConfig, env: Vec<(String, String)>) -> Host {
    configure_sandbox();
    let dir = tempfile::tempdir().expect("tmp");
    // The kernels' uids pass through it to their own directories (as node/kernels_dir.rs).
    set_mode(dir.path(), 0o711);
    let kernels_dir = dir.path().join("kernels");
    std::fs::create_dir(&kernels_dir).expect("kernels dir");
    set_mode(&kernels_dir, 0o711);
    let users = KernelUsers::from_config(&cfg, true).expect("run_as = owner with notebookos-kernel");
    let metrics = Arc::new(Metrics::new());
    let binder = Binder::new(0, Duration::from_secs(60), 1.0, Arc::new(LogOnlyLeases), metrics.clone());
    let kernels = Kernels::new(nbos_test_support::bins::python(), kernels_dir, env, metrics.clone(), binder, 0)
        .with_accounts(users, None, 0)
        .with_prewarm(prewarm_max.min(1), prewarm_max)
        .expect("pool");
    Host { kernels, metrics, _dir: dir }
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

impl Host {
    fn takes(&self, result: &str) -> u64 {
        self.metrics.prewarm_takes_total.get_or_create(&PrewarmTakeLabels { result: result.into() }).get()
    }

    fn rejected(&self, reason: &str) -> u64 {
        self.metrics.prewarm_rejected_total.get_or_create(&PrewarmRejectLabels { reason: reason.into() }).get()
    }

    /// Waits until the pool has a ready process; returns the pids of pool processes.
    async fn wait_for_ready_pool(&self) -> Vec<u32> {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let ready = self.metrics.prewarm_pool_processes.get_or_create(&StateLabels { state: "ready".into() }).get();
            if ready >= 1 {
                return pool_pids(&self._dir.path().join("kernels"));
            }
            assert!(Instant::now() < deadline, "the pool never had a ready process");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Processes running the pre-warm launcher of `kernels_dir` whose `/proc` is still root's
/// (not dumpable: not yet a kernel).
fn pool_pids(kernels_dir: &Path) -> Vec<u32> {
    use std::os::unix::fs::MetadataExt;
    let launcher = kernels_dir.join(".prewarm.py").display().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmd).split('\0').any(|a| a == launcher)
                && std::fs::metadata(format!("/proc/{pid}/status")).is_ok_and(|m| m.uid() == 0)
        })
        .collect()
}

/// The values of a `/proc/<pid>/status` line, e.g. `Uid` -> its four ids.
fn status(pid: u32, key: &str) -> Vec<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let line = text.lines().find_map(|l| l.strip_prefix(&format!("{key}:"))).unwrap_or_else(|| panic!("no {key}"));
    line.split_whitespace().map(str::to_owned).collect()
}

/// What the kernel says of itself, from a cell: its ids, groups, HOME, working directory,
/// capabilities (JSON).
async fn from_the_kernel(kernel: &LocalKernel) -> serde_json::Value {
    let expr = "__import__('json').dumps({'resuid': __import__('os').getresuid(), \
                'resgid': __import__('os').getresgid(), 'groups': sorted(__import__('os').getgroups()), \
                'home': __import__('os').environ.get('HOME'), 'cwd': __import__('os').getcwd(), \
                'user': __import__('os').environ.get('USER'), \
                'caps': [l.split()[1] for l in open('/proc/self/status') if l.startswith(('CapInh', 'CapPrm', 'CapEff', 'CapAmb'))]})";
    let content = kernel
        .run_internal("", &serde_json::json!({ "me": expr }), Duration::from_secs(60))
        .await
        .expect("a cell runs");
    let text = content["user_expressions"]["me"]["data"]["text/plain"].as_str().expect("text/plain").to_owned();
    // The repr of a str: JSON inside single quotes (no quote or backslash in it).
    serde_json::from_str(text.trim_matches('\'')).unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// Asserts `pid` and the kernel itself run as `owner` (its uids, gids, groups, HOME) with
/// no capability.
async fn assert_runs_as(kernel: &LocalKernel, pid: u32, owner: &str, extra_group: Option<u32>) {
    let (uid, gid, home) = account(owner);
    let (u, g) = (uid.to_string(), gid.to_string());
    assert_eq!(status(pid, "Uid"), vec![u.clone(); 4], "real, effective, saved, fs uid");
    assert_eq!(status(pid, "Gid"), vec![g.clone(); 4], "real, effective, saved, fs gid");
    let groups = status(pid, "Groups");
    assert!(groups.contains(&g), "{groups:?}");
    if let Some(extra) = extra_group {
        assert!(groups.contains(&extra.to_string()), "the owner's supplementary group: {groups:?}");
    }
    assert!(!groups.contains(&"0".to_owned()), "{groups:?}");
    for set in ["CapInh", "CapPrm", "CapEff", "CapAmb"] {
        assert_eq!(status(pid, set), vec!["0000000000000000"], "{set}");
    }
    assert_eq!(status(pid, "NoNewPrivs"), vec!["1"]);
    let me = from_the_kernel(kernel).await;
    assert_eq!(me["resuid"], serde_json::json!([uid, uid, uid]), "{me}");
    assert_eq!(me["resgid"], serde_json::json!([gid, gid, gid]), "{me}");
    assert_eq!(me["home"], serde_json::json!(home), "HOME is the owner's home: {me}");
    assert_eq!(me["cwd"], serde_json::json!(home), "no notebook_dir: the kernel runs in its owner's home: {me}");
    assert_eq!(me["user"], serde_json::json!(owner), "{me}");
    assert_eq!(me["caps"], serde_json::json!(vec!["0000000000000000"; 4]), "{me}");
}

/// The environment a client sends, claiming another account.
fn claims(account: &str) -> Vec<(String, String)> {
    vec![("KERNEL_USERNAME".to_owned(), account.to_owned())]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owners_kernel_from_the_pool_runs_as_the_owner_with_no_capabilities() {
    if skip("an_owners_kernel_from_the_pool_runs_as_the_owner_with_no_capabilities") {
        return;
    }
    let h = host(1);
    let pool = h.wait_for_ready_pool().await;
    // A waiting pool process: kernel.user's, with exactly CAP_SETUID and CAP_SETGID
    // (bounding set too), no_new_privs.
    let pool_pid = *pool.first().expect("a pool process");
    let (pool_uid, _, _) = account("notebookos-kernel");
    assert_eq!(status(pool_pid, "Uid"), vec![pool_uid.to_string(); 4]);
    for set in ["CapPrm", "CapEff", "CapAmb", "CapBnd"] {
        assert_eq!(status(pool_pid, set), vec!["00000000000000c0"], "{set} of a pool process");
    }
    assert_eq!(status(pool_pid, "CapInh"), vec!["00000000000000c0"]);
    assert_eq!(status(pool_pid, "NoNewPrivs"), vec!["1"]);

    // The client claims B; the owner is A.
    let kernel = h.kernels.create(None, None, &claims(OWNER_B), Some(&user(OWNER_A))).await.expect("A's kernel");
    let pid = kernel.pids()[0];
    assert_eq!(h.takes("hit"), 1, "the kernel came from the pool");
    assert_eq!(h.takes("failed"), 0);
    assert!(pool.contains(&pid), "the kernel's pid {pid} is the pool process's {pool:?}");
    assert_runs_as(&kernel, pid, OWNER_A, Some(gid_of(GROUP_A))).await;

    // B's kernel takes the refilled pool: another account from the same pool.
    h.wait_for_ready_pool().await;
    let b = h.kernels.create(None, None, &[], Some(&user(OWNER_B))).await.expect("B's kernel");
    assert_eq!(h.takes("hit"), 2);
    assert_runs_as(&b, b.pids()[0], OWNER_B, None).await;
    // A's kernel's directory and connection file are A's alone.
    let (a_uid, _, _) = account(OWNER_A);
    let dir = h._dir.path().join("kernels").join(&kernel.id);
    let owned = |p: &Path, mode: u32| {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(p).expect("stat");
        assert_eq!((m.uid(), m.mode() & 0o777), (a_uid, mode), "{}", p.display());
    };
    owned(&dir, 0o700);
    let connection = std::fs::read_dir(&dir)
        .expect("kernel dir")
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().starts_with("connection"))
        .expect("a connection file");
    owned(&connection.path(), 0o600);
    h.kernels.shutdown_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owners_kernel_without_the_pool_runs_as_the_owner_and_so_does_its_restart() {
    if skip("an_owners_kernel_without_the_pool_runs_as_the_owner_and_so_does_its_restart") {
        return;
    }
    let h = host(0);
    let kernel = h.kernels.create(None, None, &claims("root"), Some(&user(OWNER_A))).await.expect("A's kernel");
    assert_eq!(h.takes("hit") + h.takes("warming"), 0, "no pool");
    let first = kernel.pids()[0];
    assert_runs_as(&kernel, first, OWNER_A, Some(gid_of(GROUP_A))).await;
    // A restart starts a new Python as the same owner.
    kernel.restart().await.expect("restart");
    let pid = kernel.pids()[0];
    assert_ne!(pid, first, "a new process");
    assert_runs_as(&kernel, pid, OWNER_A, Some(gid_of(GROUP_A))).await;
    h.kernels.shutdown_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_a_missing_account_and_no_owner_are_refused_with_the_reason() {
    if skip("root_a_missing_account_and_no_owner_are_refused_with_the_reason") {
        return;
    }
    let h = host(0);
    for (owner, says) in [
        (Some("root"), "uid 0 (root)"),
        (Some("nbos-runas-no-such-account"), "has no system account"),
        (None, "has no owner"),
        (Some("notebookos-kernel"), "kernel.user"),
    ] {
        let err = h.kernels.create(None, None, &claims(OWNER_A), owner.map(user).as_ref()).await.expect_err("refused");
        assert!(matches!(err, CreateError::Owner(_)), "{owner:?}: {err}");
        let text = err.to_string();
        assert!(text.contains("kernel.run_as") && text.contains(says), "{owner:?}: {text}");
        if let Some(o) = owner {
            assert!(text.contains(&format!("{o:?}")), "names the account: {text}");
        }
        assert!(h.kernels.check_owner(owner).is_err());
    }
    assert!(h.kernels.list().await.is_empty(), "no kernel was started");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_path_a_non_root_account_can_write_leaves_owner_kernels_without_the_pool() {
    if skip("an_import_path_a_non_root_account_can_write_leaves_owner_kernels_without_the_pool") {
        return;
    }
    // A PYTHONPATH directory anyone can write: a pool process holding CAP_SETUID would
    // import from it, so the daemon starts no pool, and the kernel is a new Python.
    let open = tempfile::tempdir().expect("tmp");
    set_mode(open.path(), 0o777);
    let env = vec![("PYTHONPATH".to_owned(), open.path().display().to_string())];
    let h = host_with(1, KernelConfig { run_as: RunAs::Owner, ..KernelConfig::default() }, env);
    assert!(h.kernels.prewarm().is_none(), "no pool with a writable import path");
    let kernel = h.kernels.create(None, None, &claims(OWNER_A), Some(&user(OWNER_A))).await.expect("a new Python");
    assert_eq!(h.takes("hit") + h.takes("warming"), 0, "no pool");
    let pid = kernel.pids()[0];
    assert_runs_as(&kernel, pid, OWNER_A, Some(gid_of(GROUP_A))).await;
    h.kernels.shutdown_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_system_account_and_a_member_of_a_denied_group_are_refused_naming_the_key() {
    if skip("a_system_account_and_a_member_of_a_denied_group_are_refused_naming_the_key") {
        return;
    }
    // `daemon` (uid 1) exists on every host we run on: what a login named `daemon` claims.
    let h = host(0);
    let err = h.kernels.create(None, None, &claims("daemon"), Some(&user("daemon"))).await.expect_err("refused");
    assert!(matches!(err, CreateError::Owner(_)), "{err}");
    let text = err.to_string();
    assert!(text.contains("kernel.owner_uid_min = 1000") && text.contains("\"daemon\""), "{text}");
    assert!(h.kernels.check_owner(Some("daemon")).is_err());
    // A's supplementary group, denied: A is refused, B (not a member) is not.
    let cfg = KernelConfig {
        run_as: RunAs::Owner,
        owner_denied_groups: vec!["sudo".to_owned(), GROUP_A.to_owned()],
        ..KernelConfig::default()
    };
    let h = host_with(0, cfg, Vec::new());
    let err = h.kernels.create(None, None, &claims(OWNER_A), Some(&user(OWNER_A))).await.expect_err("refused");
    assert!(matches!(err, CreateError::Owner(_)), "{err}");
    let text = err.to_string();
    assert!(text.contains("kernel.owner_denied_groups") && text.contains(&format!("{GROUP_A:?}")), "{text}");
    assert!(h.kernels.check_owner(Some(OWNER_B)).is_ok(), "B is in no denied group");
    assert!(h.kernels.list().await.is_empty(), "no kernel was started");
}

#[tokio::test(flavor = "current_thread")]
async fn a_pool_process_that_keeps_its_capabilities_is_killed_and_the_kernel_starts_fresh() {
    if skip("a_pool_process_that_keeps_its_capabilities_is_killed_and_the_kernel_starts_fresh") {
        return;
    }
    let h = host(1);
    // Before the refill task first runs (this runtime has one thread): a launcher that
    // switches accounts but keeps its capabilities and skips its own check, as a broken or
    // subverted one would. The daemon's /proc check must catch it.
    let launcher = h._dir.path().join("kernels/.prewarm.py");
    let text = std::fs::read_to_string(&launcher).expect("launcher");
    let broken =
        text.replace("if _libc.capset(ctypes.byref(header), data) != 0:", "if False:").replace("os._exit(73)", "pass");
    assert_ne!(broken, text, "the launcher's capset and check are where this test expects them");
    std::fs::write(&launcher, broken).expect("write launcher");
    let pool = h.wait_for_ready_pool().await;
    let kernel = h.kernels.create(None, None, &[], Some(&user(OWNER_A))).await.expect("A's kernel, started afresh");
    let pid = kernel.pids()[0];
    // A start that loses a port race to a parallel test is tried again (local_kernel.rs),
    // and the retry may take the refilled pool's next process: broken the same way.
    let failed = h.takes("failed");
    assert!(failed >= 1, "the hand-over failed");
    assert_eq!(h.rejected("not_switched"), failed, "every failed hand-over was this check's");
    assert_eq!(h.takes("hit") + h.takes("warming"), failed, "no hand-over succeeded");
    assert!(!pool.contains(&pid), "a new Python, not the pool process");
    for p in &pool {
        assert!(
            std::fs::read_to_string(format!("/proc/{p}/stat")).map_or(true, |s| s.contains(") Z ")),
            "the pool process {p} was killed"
        );
    }
    assert_runs_as(&kernel, pid, OWNER_A, Some(gid_of(GROUP_A))).await;
    h.kernels.shutdown_all().await;
}

/// Through a real daemon's API: without users nobody owns a kernel, so `run_as = "owner"`
/// refuses every create with the reason, whatever account the client claims.
#[test]
fn without_users_run_as_owner_refuses_every_kernel_whatever_kernel_username_says() {
    if skip("without_users_run_as_owner_refuses_every_kernel_whatever_kernel_username_says") {
        return;
    }
    let d = start_daemon(&[], Stdio::inherit(), |c| {
        c.fake_gpus(0).overlay("[kernel]\nrun_as = \"owner\"\nprewarm_max = 0\n").expect("[kernel] keys");
    });
    let body = format!(r#"{{"name":"python3","env":{{"KERNEL_USERNAME":"{OWNER_A}"}}}}"#);
    let (code, text) = http("POST", &format!("{}/api/kernels", d.url), Some(TOKEN), Some(&body));
    assert_eq!(code, 403, "{text}");
    let msg: serde_json::Value = serde_json::from_str(&text).expect("a JSON error");
    let m = msg["message"].as_str().unwrap_or_default();
    assert!(m.contains("kernel.run_as") && m.contains("no owner"), "{text}");
    let (_, list) = http("GET", &format!("{}/api/kernels", d.url), Some(TOKEN), None);
    assert_eq!(list.trim(), "[]");
}

/// The launcher alone (as the daemon runs it, `python -s`): an order to become root, or
/// to keep root's group, ends it at once with its own status (70), before anything of the
/// order's. The daemon never sends one (it refuses root owners
/// first); this is the launcher's own guard.
#[test]
fn the_launcher_refuses_an_order_to_become_root() {
    use std::io::{BufRead, BufReader, Write};
    let launcher = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/kernel/prewarm/launcher.py");
    for switch in [
        serde_json::json!({ "uid": 0, "gid": 1000, "groups": [] }),
        serde_json::json!({ "uid": 1000, "gid": 0, "groups": [] }),
        serde_json::json!({ "uid": 1000, "gid": 1000, "groups": [0, 1000] }),
    ] {
        let dir = tempfile::tempdir().expect("tmp");
        let log = dir.path().join("kernel.log");
        let mut child = Command::new(nbos_test_support::bins::python())
            .arg("-s")
            .arg(&launcher)
            .current_dir(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        out.read_line(&mut line).expect("ready line");
        assert_eq!(line, "ready\n");
        let order = serde_json::json!({
            "argv": [], "env": {}, "cwd": "/", "log": log.display().to_string(), "switch": switch,
        });
        let mut stdin = child.stdin.take().expect("stdin");
        writeln!(stdin, "{order}").expect("order");
        drop(stdin);
        let status = child.wait().expect("wait");
        assert_eq!(status.code(), Some(70), "{switch}: refused with the launcher's status");
    }
}

/// The user `name` (no groups): the owner a create names.
fn user(name: &str) -> notebookosd::users::User {
    notebookosd::users::User { name: name.to_owned(), groups: Vec::new() }
}
