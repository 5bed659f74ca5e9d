//! The GPU device guard (`bpf/device_guard.bpf.c`) as a kernel process meets it: device
//! nodes made with mknod (no GPU or NVIDIA driver needed), opened by a process inside a
//! cgroup the program is attached to. A minor the cgroup may not use fails with `EPERM`
//! (the cgroup refused it); an allowed one gets past the cgroup and fails with `ENXIO` (no
//! driver behind the major here). Run as root; with NBOS_REQUIRE_PRIVILEGED=1 it fails
//! instead of skipping.

#[path = "support/cgroup_child.rs"]
mod cgroup_child;
mod common;

use cgroup_child::{errnos_in_cgroup, mknod};
use std::path::{Path, PathBuf};

use nbos_ebpf::{DeviceGuard, NVIDIACTL_MINOR, NVIDIA_MAJOR};

fn cannot_run(test: &str, why: &str) {
    assert!(!common::privileged_required(), "{test}: NBOS_REQUIRE_PRIVILEGED=1 but it cannot run: {why}");
    eprintln!("skipped {test}: {why}");
}

/// The cgroup v2 mount: `/sys/fs/cgroup/unified` on a hybrid host, else `/sys/fs/cgroup`.
fn cgroup2_root() -> Option<PathBuf> {
    ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.join("cgroup.procs").exists() && p.join("cgroup.subtree_control").exists())
}

/// The char major of `name` in /proc/devices, if its driver is loaded.
fn proc_devices_major(name: &str) -> Option<u32> {
    let text = std::fs::read_to_string("/proc/devices").ok()?;
    text.lines()
        .take_while(|l| !l.starts_with("Block devices"))
        .find_map(|l| l.split_once(' ').filter(|(_, n)| n.trim() == name).and_then(|(m, _)| m.trim().parse().ok()))
}

/// A char major with no driver on this host (so an open that passes the cgroup gets `ENXIO`).
fn unused_major() -> u32 {
    let text = std::fs::read_to_string("/proc/devices").expect("/proc/devices");
    let used: Vec<u32> = text.lines().filter_map(|l| l.split_whitespace().next()?.parse().ok()).collect();
    (230..255).rev().find(|m| !used.contains(m)).expect("a free char major")
}

/// A cgroup removed when dropped (after its processes are gone: the forked children exit).
struct TestCgroup(PathBuf);

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn only_leased_gpu_minors_open_and_other_devices_are_untouched() {
    const TEST: &str = "only_leased_gpu_minors_open_and_other_devices_are_untouched";
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return cannot_run(TEST, "needs root (mknod, cgroup, BPF)");
    }
    let Some(root) = cgroup2_root() else { return cannot_run(TEST, "no cgroup v2 mount") };
    let mut guard = match DeviceGuard::load(16) {
        Ok(g) => g,
        Err(e) => return cannot_run(TEST, &e.to_string()),
    };
    let cg = TestCgroup(root.join(format!("nbos-device-guard-test-{}", std::process::id())));
    std::fs::create_dir_all(&cg.0).expect("create test cgroup");
    let procs = cg.0.join("cgroup.procs");

    let dir = tempfile::tempdir().expect("tempdir");
    let gpu0 = dir.path().join("nvidia0");
    let gpu1 = dir.path().join("nvidia1");
    let ctl = dir.path().join("nvidiactl");
    let uvm = dir.path().join("nvidia-uvm");
    mknod(&gpu0, NVIDIA_MAJOR, 0);
    mknod(&gpu1, NVIDIA_MAJOR, 1);
    mknod(&ctl, NVIDIA_MAJOR, NVIDIACTL_MINOR);
    // The real nvidia-uvm major where the driver is loaded, else a major no driver has.
    mknod(&uvm, proc_devices_major("nvidia-uvm").unwrap_or_else(unused_major), 0);
    let null = Path::new("/dev/null");
    let all: [&Path; 5] = [&gpu0, &gpu1, &ctl, &uvm, null];
    let driver_answer = |path: &Path| if path == null { 0 } else { libc::ENXIO };

    // Before the guard: every node gets past the cgroup (no driver: ENXIO).
    let before = errnos_in_cgroup(&procs, &all);
    assert_eq!(before, all.iter().map(|p| driver_answer(p)).collect::<Vec<_>>(), "without the guard");

    let id = guard.attach(&cg.0).expect("attach");
    assert_eq!(guard.allowed(id).expect("entry"), Vec::<u32>::new());
    let denied_before = guard.denials().expect("denials");

    // No lease: both GPUs refused by the cgroup; nvidiactl, uvm and /dev/null untouched.
    let no_lease = errnos_in_cgroup(&procs, &all);
    assert_eq!(no_lease, vec![libc::EPERM, libc::EPERM, libc::ENXIO, driver_answer(&uvm), 0], "no lease");

    // A lease on GPU 0: minor 0 gets past the cgroup, minor 1 does not.
    guard.allow(id, &[0]).expect("allow 0");
    let leased = errnos_in_cgroup(&procs, &all);
    assert_eq!(leased, vec![libc::ENXIO, libc::EPERM, libc::ENXIO, driver_answer(&uvm), 0], "lease on GPU 0");

    // Revoked: minor 0 is refused again.
    guard.allow(id, &[]).expect("revoke");
    let revoked = errnos_in_cgroup(&procs, &[&gpu0, &ctl, null]);
    assert_eq!(revoked, vec![libc::EPERM, libc::ENXIO, 0], "after revoke");

    // Each refusal was counted (2 + 1 + 1).
    assert_eq!(guard.denials().expect("denials") - denied_before, 4);

    // Processes outside the cgroup are not affected at all, even while it is attached.
    let outside = std::fs::OpenOptions::new().read(true).write(true).open(&gpu1).expect_err("no driver");
    assert_eq!(outside.raw_os_error(), Some(libc::ENXIO), "outside the kernel's cgroup");

    guard.detach(id).expect("detach");
    assert_eq!(errnos_in_cgroup(&procs, &[&gpu1]), vec![libc::ENXIO], "detached");
}

#[test]
fn allow_on_an_unattached_cgroup_and_bad_minors_are_refused() {
    const TEST: &str = "allow_on_an_unattached_cgroup_and_bad_minors_are_refused";
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return cannot_run(TEST, "needs root (BPF)");
    }
    let mut guard = match DeviceGuard::load(16) {
        Ok(g) => g,
        Err(e) => return cannot_run(TEST, &e.to_string()),
    };
    let e = guard.allow(nbos_ebpf::CgroupId(12345), &[0]).expect_err("not attached");
    assert!(e.to_string().contains("not attached to cgroup id 12345"), "{e}");
    let Some(root) = cgroup2_root() else { return cannot_run(TEST, "no cgroup v2 mount") };
    let cg = TestCgroup(root.join(format!("nbos-device-guard-bad-{}", std::process::id())));
    std::fs::create_dir_all(&cg.0).expect("create test cgroup");
    let id = guard.attach(&cg.0).expect("attach");
    let e = guard.allow(id, &[300]).expect_err("out of range");
    assert!(e.to_string().contains("minor 300 is out of range"), "{e}");
    let e = guard.attach(Path::new("/nonexistent/cgroup")).expect_err("no such cgroup");
    assert!(e.to_string().contains("/nonexistent/cgroup"), "{e}");
    guard.detach(id).expect("detach");
}
