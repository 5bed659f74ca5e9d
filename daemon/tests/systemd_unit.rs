//! The shipped systemd unit (`packaging/notebookosd.service`) sandboxes the daemon and,
//! through it, every kernel: its exposure score stays low, and the daemon still does its
//! whole job (eBPF observer, per-kernel memory cgroups, a kernel that starts and runs a
//! cell) inside every sandbox directive the unit ships.
//!
//! systemd cannot run here (no systemd as PID 1), so the second test applies the unit the
//! way systemd does (`nbos_test_support::unit_sandbox`: mount namespace, devices cgroup,
//! capabilities, seccomp filters from `systemd-analyze syscall-filter`), and fails if the
//! unit gains a directive that module neither applies nor lists as not applicable here.

mod required;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use nbos_test_support::unit_sandbox::{self, Directories, Service, UnitSandbox};
use nbos_test_support::{http, start_daemon_in, wait_for, Daemon, TOKEN};
use notebookosd::config::ObserverMode;

const UNIT: &str = include_str!("../../packaging/notebookosd.service");
/// `systemd-analyze security` exposure (0 safest, 10 least safe) the unit must stay under.
const MAX_EXPOSURE: f64 = 5.0;

#[test]
fn the_units_exposure_is_at_most_5() {
    if Command::new("systemd-analyze").arg("--version").output().is_err() {
        required::cannot_run(
            "the_units_exposure_is_at_most_5",
            "systemd-analyze is not installed (Debian package systemd)",
        );
        return;
    }
    let o = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", concat!(env!("CARGO_MANIFEST_DIR"), "/../packaging/notebookosd.service")])
        .output()
        .expect("systemd-analyze");
    let out = String::from_utf8_lossy(&o.stdout);
    let line =
        out.lines().find(|l| l.contains("Overall exposure level")).unwrap_or_else(|| panic!("no score in: {out}"));
    let score: f64 = line
        .split(':')
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unreadable score: {line}"));
    assert!(score <= MAX_EXPOSURE, "exposure {score} > {MAX_EXPOSURE}:\n{out}");
}

/// The capability bounding set of `pid` (`CapBnd` in /proc/PID/status).
fn bounding_set_of(pid: u32) -> u64 {
    u64::from_str_radix(&status(pid, "CapBnd"), 16).expect("hex")
}

/// One `/proc/PID/status` value.
fn status(pid: u32, key: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let prefix = format!("{key}:");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {key}: in {text}"))
        .trim()
        .to_owned()
}

/// The mount options (`rw`/`ro`, …) of the mount at `point` as process `pid` sees it.
fn mount_options(pid: u32, point: &Path) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("mountinfo");
    // Field 5 is the mount point, 6 its options; the last mount at a point is the visible one.
    text.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(4) == Some(&point.to_str()?)).then(|| f.get(5).map(|o| (*o).to_owned())).flatten()
    })
}

#[test]
fn every_key_of_the_unit_is_applied_or_named_as_not_applicable() {
    let unknown = unit_sandbox::unknown_keys(&Service::parse(UNIT));
    assert!(unknown.is_empty(), "teach tests/support/src/unit_sandbox these directives: {unknown:?}");
    // The filter the unit means: a deny list, mount(2) taken out of @mount again.
    if Command::new("systemd-analyze").arg("--version").output().is_err() {
        required::cannot_run(
            "every_key_of_the_unit_is_applied_or_named_as_not_applicable (its SystemCallFilter= half)",
            "systemd-analyze is not installed (Debian package systemd)",
        );
    } else {
        let service = Service::parse(UNIT);
        let (deny, set) = unit_sandbox::syscall_filter_set(service.all("SystemCallFilter")).expect("the unit's groups");
        assert!(deny, "a deny list");
        for denied in ["umount2", "pivot_root", "init_module", "reboot", "settimeofday", "swapon"] {
            assert!(set.contains(denied), "{denied} is denied: {set:?}");
        }
        assert!(!set.contains("mount"), "mount(2) stays allowed for kernels' namespaces");
    }
}

/// Why this host cannot run the sandboxed daemon, if it cannot.
fn cannot_run_sandboxed() -> Option<&'static str> {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (mount namespace, devices cgroup, eBPF)");
    }
    if Command::new("systemd-analyze").arg("--version").output().is_err() {
        return Some("systemd-analyze is not installed (Debian package systemd)");
    }
    if !Path::new("/sys/fs/cgroup/devices/devices.allow").exists() {
        return Some("no cgroup v1 devices controller at /sys/fs/cgroup/devices (DevicePolicy=)");
    }
    if Command::new("id").arg("notebookos-kernel").output().map(|o| !o.status.success()).unwrap_or(true) {
        return Some("no notebookos-kernel account: run scripts/install-deps.sh");
    }
    None
}

/// A root process's look at the sandbox (argv: a twin of /dev/null, one of /dev/kmsg, the
/// state directory): each directive a root process would otherwise get past.
const ROOT_PROBE: &str = r#"
import ctypes, errno, json, os, socket, sys
null_twin, kmsg_twin, state = sys.argv[1:4]
libc = ctypes.CDLL(None, use_errno=True)
def err(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def call(name, *args):
    def f():
        if getattr(libc, name)(*args) == -1:
            raise OSError(ctypes.get_errno(), name)
    return f
def setuid_file():
    p = os.path.join(state, "setuid-probe")
    open(p, "w").close()
    try:
        os.chmod(p, 0o4755)
    finally:
        os.unlink(p)
# Harmless should a directive not hold: the same host name, a file removed at once, the
# state directory (no mount point) to unmount.
def write_usr():
    open("/usr/nbos-unit-probe", "w").close()
    os.unlink("/usr/nbos-unit-probe")
def kmsg_bytes():
    try:
        with open("/dev/kmsg", "rb", buffering=0) as f:
            os.set_blocking(f.fileno(), False)
            return len(f.read(8192) or b"")
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps({
    "allowed_device": err(lambda: os.close(os.open(null_twin, os.O_WRONLY))),
    "other_device": err(lambda: os.close(os.open(kmsg_twin, os.O_WRONLY))),
    "write_usr": err(write_usr),
    "write_state": err(lambda: (open(os.path.join(state, "probe"), "w").close(), os.unlink(os.path.join(state, "probe")))),
    "setuid_file": err(setuid_file),
    "net_namespace": err(call("unshare", 0x40000000)),
    "mount_namespace": err(call("unshare", 0x00020000)),
    "sethostname": err(lambda: socket.sethostname(socket.gethostname())),
    "chroot": err(lambda: os.chroot("/")),
    "umount": err(call("umount2", state.encode(), 0)),
    "personality": err(call("personality", 0x0008)),
    "home": sorted(os.listdir("/root")),
    "kmsg_bytes": kmsg_bytes(),
}))
"#;

/// A cell that looks at its own sandbox: what a notebook user would try.
const PROBE: &str = r#"
import ctypes, errno, json, os, socket
def err(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
libc = ctypes.CDLL(None, use_errno=True)
def unshare_user():
    if libc.unshare(0x10000000) != 0:
        raise OSError(ctypes.get_errno(), "unshare")
root = [l.split()[5] for l in open("/proc/self/mountinfo") if l.split()[4] == "/"][-1]
print(json.dumps({
    "packet_socket": err(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW)),
    "unix_socket": err(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()),
    "user_namespace": err(unshare_user),
    "root_mount": root,
    "home": sorted(os.listdir("/home")) if os.access("/home", os.R_OK) else "unreadable",
    "tmp_writable": err(lambda: open("/tmp/nbos-probe", "w").close()),
    "seccomp": [l.split()[1] for l in open("/proc/self/status") if l.startswith("Seccomp:")][0],
    "sum": sum(range(10)),
}))
"#;

/// A sandbox for a probe or the daemon in a fresh directory (not under /tmp, which
/// PrivateTmp= hides; 0711 so kernels reach their directories).
fn sandbox_in(tag: &str) -> (tempfile::TempDir, Directories, std::path::PathBuf, Arc<UnitSandbox>, String) {
    let dir = tempfile::Builder::new().prefix("unit-sandbox").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tmp");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).expect("chmod");
    let dirs = Directories { state: dir.path().join("state"), runtime: dir.path().join("run") };
    let scratch = dir.path().join("systemd");
    std::fs::create_dir(&scratch).expect("scratch");
    let name = format!("nbos-unit-sandbox-{}-{tag}", std::process::id());
    let sandbox = Arc::new(UnitSandbox::plan(UNIT, &dirs, &scratch, &name).expect("the unit's sandbox"));
    (dir, dirs, scratch, sandbox, name)
}

/// `mknod path c major:minor`.
fn char_device(path: &Path, major: u32, minor: u32) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: mknod(2) with a live NUL-terminated path.
    let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(major, minor)) };
    assert_eq!(rc, 0, "mknod {}: {}", path.display(), std::io::Error::last_os_error());
}

#[test]
fn a_root_process_inside_the_units_sandbox_is_held_by_each_directive() {
    if let Some(why) = cannot_run_sandboxed() {
        required::cannot_run("a_root_process_inside_the_units_sandbox_is_held_by_each_directive", why);
        return;
    }
    let (_dir, dirs, scratch, sandbox, _) = sandbox_in("probe");
    // Twins of /dev/null (allowed) and /dev/kmsg (not; opened write-only it asks for no
    // capability), outside /dev: only the devices cgroup tells them apart.
    let (null_twin, kmsg_twin) = (scratch.join("null-twin"), scratch.join("kmsg-twin"));
    char_device(&null_twin, 1, 3);
    char_device(&kmsg_twin, 1, 11);
    let mut command = Command::new(nbos_test_support::bins::python());
    command.arg("-c").arg(ROOT_PROBE).arg(&null_twin).arg(&kmsg_twin).arg(&dirs.state);
    sandbox.wrap(&mut command);
    let out = command.output().expect("the probe");
    assert!(out.status.success(), "probe: {}", String::from_utf8_lossy(&out.stderr));
    let probe: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    eprintln!("a root process inside: {probe}");
    let expect = [
        ("allowed_device", "ok", "DeviceAllow=/DevicePolicy=closed lets /dev/null's numbers through"),
        ("other_device", "EPERM", "DevicePolicy=closed"),
        ("write_usr", "EROFS", "ProtectSystem=strict"),
        ("write_state", "ok", "StateDirectory= is writable"),
        ("setuid_file", "EPERM", "RestrictSUIDSGID=yes"),
        ("net_namespace", "EPERM", "RestrictNamespaces=~net"),
        ("mount_namespace", "ok", "mount namespaces stay allowed (one per kernel)"),
        ("sethostname", "EPERM", "ProtectHostname=yes"),
        ("chroot", "EPERM", "SystemCallFilter=~@mount"),
        ("umount", "EPERM", "SystemCallFilter=~@mount"),
        ("personality", "EPERM", "LockPersonality=yes"),
    ];
    for (key, want, why) in expect {
        assert_eq!(probe[key], want, "{why}: {probe}");
    }
    assert_eq!(probe["home"], serde_json::json!([]), "ProtectHome=yes: /root is empty: {probe}");
    // An inaccessible node over it: no kernel log record comes out (0 bytes or an error).
    assert!(probe["kmsg_bytes"] == 0 || probe["kmsg_bytes"].is_string(), "ProtectKernelLogs=yes: {probe}");
    drop(sandbox);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_runs_a_kernel_and_a_cell_under_every_directive_of_the_unit() {
    if let Some(why) = cannot_run_sandboxed() {
        required::cannot_run("the_daemon_runs_a_kernel_and_a_cell_under_every_directive_of_the_unit", why);
        return;
    }
    let (dir, dirs, scratch, sandbox, name) = sandbox_in("daemon");
    eprintln!("devices allowed: {:?}; absent on this host: {:?}", sandbox.device_rules(), sandbox.absent);
    eprintln!("where this host differs: {:?}", sandbox.notes);
    assert!(sandbox.device_rules().iter().any(|r| r.starts_with("b 7:*")), "block-loop is allowed");

    // The daemon's log, for what it says it could not do inside the sandbox.
    let log_path = scratch.join("daemon.log");
    let log = std::fs::File::create(&log_path).expect("log");
    let d: Daemon = tokio::task::block_in_place(|| {
        start_daemon_in(
            dir,
            &[],
            Stdio::from(log),
            |c| {
                c.fake_gpus(1).observer(ObserverMode::Ebpf).config.kernel.memory_limit_mib = 2048;
            },
            |cmd| sandbox.wrap(cmd),
        )
    });
    let pid = d.child.id();

    // What an operator sees of the daemon: the unit's bounding set, no_new_privs, one
    // seccomp filter per system-call directive, the devices cgroup, its own namespaces,
    // a read-only root with its state directory writable, the unit's limits.
    let expected = sandbox.bounding_set & bounding_set_of(std::process::id());
    assert_eq!(bounding_set_of(pid), expected, "the daemon runs with the unit's bounding set");
    assert_eq!(status(pid, "NoNewPrivs"), "1");
    assert_eq!(status(pid, "Seccomp"), "2", "seccomp filter mode");
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
    assert!(cgroups.lines().any(|l| l.contains(":devices:/") && l.ends_with(&name)), "{cgroups}");
    for ns in ["mnt", "uts"] {
        let theirs = std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).expect("ns");
        let ours = std::fs::read_link(format!("/proc/self/ns/{ns}")).expect("ns");
        assert_ne!(theirs, ours, "the daemon has a {ns} namespace of its own");
    }
    let ro = |p: &Path| mount_options(pid, p).unwrap_or_default();
    assert!(ro(Path::new("/")).starts_with("ro"), "ProtectSystem=strict: / is {}", ro(Path::new("/")));
    assert!(ro(&dirs.state).starts_with("rw"), "the state directory is {}", ro(&dirs.state));
    assert!(ro(Path::new("/sys/fs/cgroup")).starts_with("rw"), "ReadWritePaths=/sys/fs/cgroup");
    assert!(ro(Path::new("/proc/sys")).starts_with("ro"), "ProtectKernelTunables=");
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let nofile = sandbox.nofile.expect("the unit sets LimitNOFILE").to_string();
    assert!(limits.lines().any(|l| l.starts_with("Max open files") && l.contains(&nofile)), "{limits}");

    // A kernel and a cell, inside the same sandbox.
    let (code, body) = tokio::task::block_in_place(|| {
        http("POST", &format!("{}/api/kernels", d.url), Some(TOKEN), Some(r#"{"name":"notebookos-python-1gpu"}"#))
    });
    assert_eq!(code, 201, "{body}");
    let kernel: serde_json::Value = serde_json::from_str(&body).expect("model");
    let id = kernel["id"].as_str().expect("id").to_owned();
    let kernel_pid = tokio::task::block_in_place(|| {
        wait_for(Duration::from_secs(60), "the kernel to become idle", || {
            let (_, body) = http("GET", &format!("{}/api/kernels/{id}", d.url), Some(TOKEN), None);
            let m: serde_json::Value = serde_json::from_str(&body).ok()?;
            (m["execution_state"] == "idle").then(|| m["pids"][0].as_u64().and_then(|p| u32::try_from(p).ok()))?
        })
    });
    assert_eq!(bounding_set_of(kernel_pid), expected, "the kernel inherits the bounding set");
    let out = nbos_test_support::run_cell(&d.url, TOKEN, &id, PROBE).await;
    assert_eq!(out.status, "ok", "{out:?}");
    let probe: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    eprintln!("inside the kernel: {probe}");
    assert_eq!(probe["sum"], 45, "the cell ran: {probe}");
    assert_eq!(probe["packet_socket"], "EAFNOSUPPORT", "RestrictAddressFamilies=: {probe}");
    assert_eq!(probe["unix_socket"], "ok", "{probe}");
    assert_eq!(probe["user_namespace"], "EPERM", "RestrictNamespaces=~user: {probe}");
    assert!(probe["root_mount"].as_str().is_some_and(|o| o.starts_with("ro")), "ProtectSystem=strict: {probe}");
    assert!(probe["home"] == serde_json::json!([]) || probe["home"] == "unreadable", "ProtectHome=yes: {probe}");
    assert_eq!(probe["tmp_writable"], "ok", "PrivateTmp= gives a writable /tmp: {probe}");
    assert_eq!(probe["seccomp"], "2", "{probe}");
    // PrivateTmp=: the kernel's /tmp file is in the service's private /tmp, not the host's.
    assert!(!Path::new("/tmp/nbos-probe").exists(), "the cell's /tmp file is on the host's /tmp");

    // A kernel start that fell back from the pre-warm pool is a directive the daemon
    // cannot live with (CAP_SYS_CHROOT, which setns(2) into the pool process's mount
    // namespace needs, was missing from the bounding set).
    let log = std::fs::read_to_string(&log_path).expect("log");
    let fallbacks: Vec<&str> = log.lines().filter(|l| l.contains("could not hand the kernel")).collect();
    assert!(fallbacks.is_empty(), "the pre-warm hand-over failed in the sandbox: {fallbacks:?}");

    let (code, _) =
        tokio::task::block_in_place(|| http("DELETE", &format!("{}/api/kernels/{id}", d.url), Some(TOKEN), None));
    assert_eq!(code, 204);
    // The daemon stops (SIGTERM, reaped) before its devices cgroup is removed.
    tokio::task::block_in_place(|| drop(d));
    drop(sandbox);
}
