//! The shipped systemd unit (`packaging/notebookosd.service`) sandboxes the daemon and,
//! through it, every kernel: its exposure score stays low, and the daemon still does its
//! whole job (eBPF observer, per-kernel memory cgroups, kernels that start and answer)
//! with only the unit's capability bounding set, `NoNewPrivileges` and `UMask`.
//!
//! systemd cannot run here (no systemd as PID 1), so the second test applies what of the
//! unit the kernel enforces on its own: the bounding set and no_new_privs with `setpriv`,
//! the umask with the shell. Mount and device restrictions need systemd itself.

mod required;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nbos_test_support::{http, start_daemon, TOKEN};
use notebookosd::config::ObserverMode;

const UNIT: &str = include_str!("../../packaging/notebookosd.service");
/// `systemd-analyze security` exposure (0 safest, 10 least safe) the unit must stay under.
const MAX_EXPOSURE: f64 = 5.0;

fn setting(key: &str) -> Option<&'static str> {
    UNIT.lines().find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

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

/// `CapabilityBoundingSet=CAP_BPF CAP_X …` as setpriv's `-all,+bpf,+x,…`.
fn setpriv_bounding_set() -> String {
    let caps = setting("CapabilityBoundingSet").expect("the unit sets CapabilityBoundingSet");
    let mut arg = "-all".to_owned();
    for cap in caps.split_whitespace() {
        arg.push_str(",+");
        arg.push_str(&cap.trim_start_matches("CAP_").to_lowercase());
    }
    arg
}

/// The unit's bounding set as a mask (bit numbers from `setpriv --list-caps`, which lists
/// the capabilities in their kernel order).
fn unit_capability_mask() -> u64 {
    let o = Command::new("setpriv").arg("--list-caps").output().expect("setpriv --list-caps");
    let names: Vec<String> = String::from_utf8_lossy(&o.stdout).lines().map(str::to_owned).collect();
    let caps = setting("CapabilityBoundingSet").expect("the unit sets CapabilityBoundingSet");
    caps.split_whitespace().fold(0, |mask, cap| {
        let name = cap.trim_start_matches("CAP_").to_lowercase();
        let bit = names.iter().position(|n| *n == name).unwrap_or_else(|| panic!("unknown capability {cap}"));
        mask | 1 << bit
    })
}

/// The capability bounding set of `pid` (`CapBnd` in /proc/PID/status).
fn bounding_set_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let hex = status.lines().find_map(|l| l.strip_prefix("CapBnd:")).expect("CapBnd").trim();
    u64::from_str_radix(hex, 16).expect("hex")
}

#[test]
fn the_daemon_does_its_job_with_only_the_units_capabilities() {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        required::cannot_run("the_daemon_does_its_job_with_only_the_units_capabilities", "needs root (eBPF, cgroups)");
        return;
    }
    if Command::new("setpriv").arg("--version").output().is_err() {
        required::cannot_run(
            "the_daemon_does_its_job_with_only_the_units_capabilities",
            "setpriv is missing (util-linux)",
        );
        return;
    }
    assert_eq!(setting("NoNewPrivileges"), Some("yes"));
    let umask = setting("UMask").expect("the unit sets UMask");
    let bounding = setpriv_bounding_set();
    let shell = format!("umask {umask} && exec \"$0\" \"$@\"");
    let wrapper =
        ["setpriv", "--no-new-privs", "--inh-caps=-all", "--bounding-set", &bounding, "--", "sh", "-c", &shell];
    // The eBPF observer is required (the daemon refuses to start without it) and kernels
    // get memory cgroups: the privileged parts of the daemon's job.
    let d = start_daemon(&wrapper, Stdio::inherit(), |c| {
        c.fake_gpus(1).observer(ObserverMode::Ebpf).config.kernel.memory_limit_mib = 2048;
    });
    // What the unit grants, less what this machine withholds from its own processes.
    let expected = unit_capability_mask() & bounding_set_of(std::process::id());
    assert_eq!(bounding_set_of(d.child.id()), expected, "the daemon runs with the unit's bounding set");
    let (status, body) =
        http("POST", &format!("{}/api/kernels", d.url), Some(TOKEN), Some(r#"{"name":"notebookos-python-1gpu"}"#));
    assert_eq!(status, 201, "{body}");
    let kernel: serde_json::Value = serde_json::from_str(&body).expect("model");
    let id = kernel["id"].as_str().expect("id").to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    let pid = loop {
        let (_, body) = http("GET", &format!("{}/api/kernels/{id}", d.url), Some(TOKEN), None);
        let m: serde_json::Value = serde_json::from_str(&body).expect("model");
        if m["execution_state"] == "idle" {
            break m["pids"][0].as_u64().and_then(|p| u32::try_from(p).ok()).expect("pid");
        }
        assert!(Instant::now() < deadline, "the kernel did not become idle: {m}");
        std::thread::sleep(Duration::from_millis(50));
    };
    // Kernels run inside the same sandbox: never more capabilities than the unit allows.
    assert_eq!(bounding_set_of(pid), expected);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    assert!(status.lines().any(|l| l.starts_with("NoNewPrivs:") && l.ends_with('1')), "{status}");
    let (status, _) = http("DELETE", &format!("{}/api/kernels/{id}", d.url), Some(TOKEN), None);
    assert_eq!(status, 204);
}
