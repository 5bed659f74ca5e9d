//! The procfs fallback: chosen automatically without privileges, and answering the same API
//! from the shim's counters files, /proc sampling and exit polling.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::wait_for;
use nbos_ebpf::shim_counters::{self, ShimCountersWriter};
use nbos_ebpf::{Mode, ModeRequest, Observer, ObserverConfig};

const MIB: u64 = 1 << 20;

fn procfs_config(counters: &std::path::Path) -> ObserverConfig {
    ObserverConfig {
        mode: ModeRequest::Procfs,
        counters_dir: Some(counters.to_owned()),
        poll_interval: Duration::from_millis(10),
        ..ObserverConfig::default()
    }
}

#[test]
fn procfs_mode_answers_snapshot_idle_for_and_exits_from_shim_counters() {
    let dir = tempfile::tempdir().unwrap();
    let observer = Observer::start(procfs_config(dir.path())).unwrap();
    assert_eq!(observer.mode(), Mode::Procfs);
    let mut exits = observer.exit_events();

    // Two real processes; the first "uses the GPU" through the shim, whose side we play by
    // writing its counters file exactly as the shim does.
    let mut busy = Command::new("sleep").arg("30").spawn().unwrap();
    let mut idle = Command::new("sleep").arg("30").spawn().unwrap();
    let shim = ShimCountersWriter::create(dir.path(), busy.id()).unwrap();
    for _ in 0..1000 {
        shim.record_launch();
    }
    for _ in 0..100 {
        shim.record_copy(MIB);
    }

    let a = observer.snapshot(busy.id()).expect("activity from the counters file");
    assert_eq!((a.launches, a.copies, a.copy_bytes), (1000, 100, 100 * MIB));
    assert!(a.sources.shim_counters && !a.sources.uprobes);
    assert_eq!(a.comm, "sleep");
    assert!(a.cpu_time_ns.is_some() && a.context_switches.is_some(), "procfs fields: {a:?}");
    assert_eq!(observer.snapshot(idle.id()), None);

    let grown = wait_for("idle_for to grow past 100 ms", Duration::from_secs(5), || {
        observer.idle_for(busy.id()).filter(|d| *d >= Duration::from_millis(100))
    });
    shim.record_launch();
    let reset = observer.idle_for(busy.id()).unwrap();
    assert!(reset < grown, "reset {reset:?} grown {grown:?}");

    busy.kill().unwrap();
    busy.wait().unwrap();
    let event = wait_for("the exit event", Duration::from_secs(5), || loop {
        match exits.try_recv() {
            Ok(e) if e.pid == busy.id() => break Some(e),
            Ok(_) => continue,
            Err(_) => break None,
        }
    });
    assert_eq!(event.activity.map(|a| a.launches), Some(1001));
    assert!(!shim_counters::path_for(dir.path(), busy.id()).exists(), "counters file of the dead process removed");
    assert_eq!(observer.idle_for(busy.id()), None);
    idle.kill().unwrap();
    idle.wait().unwrap();
}

/// The counters directory is writable by every kernel: kernel A writes `counters/<pid of B>`
/// to make B look busy (or, by never counting, idle). The observer believes a counters file
/// only from one of the uids of the process it names: A's file is ignored, counted in
/// `notebookos_observer_counters_rejected_total` and removed; B's own file still counts.
/// As root the planted file is made another uid's (`nobody`); otherwise the process it names
/// is init, another uid's.
#[test]
fn a_counters_file_another_uid_wrote_for_a_process_is_ignored_counted_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let observer = Observer::start(procfs_config(dir.path())).unwrap();
    // SAFETY: geteuid(2) has no arguments and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let mut victim = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = if root { victim.id() } else { 1 };
    // Written elsewhere, then moved in whole: the observer never sees it half made.
    let staging = tempfile::tempdir().unwrap();
    let forged = ShimCountersWriter::create(staging.path(), pid).unwrap();
    for _ in 0..1000 {
        forged.record_launch();
    }
    if root {
        std::os::unix::fs::chown(forged.path(), Some(65534), Some(65534)).unwrap();
    }
    std::fs::rename(forged.path(), shim_counters::path_for(dir.path(), pid)).unwrap();

    wait_for("the forged file to be removed", Duration::from_secs(5), || {
        (!shim_counters::path_for(dir.path(), pid).exists()).then_some(())
    });
    assert_eq!(observer.metrics().counters_rejected.get(), 1);
    assert_eq!(observer.snapshot(pid), None, "the forged counts are not the victim's activity");
    assert!(observer.snapshot_all().iter().all(|a| a.pid != pid));

    if root {
        // The victim's own file (its uid, here the test's) counts as before.
        let own = ShimCountersWriter::create(dir.path(), pid).unwrap();
        own.record_launch();
        assert_eq!(observer.snapshot(pid).map(|a| a.launches), Some(1));
        assert_eq!(observer.metrics().counters_rejected.get(), 1);
    }
    victim.kill().unwrap();
    victim.wait().unwrap();
}

#[test]
fn procfs_mode_judges_a_process_without_shim_by_its_cpu_time() {
    let dir = tempfile::tempdir().unwrap();
    let observer = Observer::start(procfs_config(dir.path())).unwrap();
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    observer.watch(sleeper.id()).unwrap();
    // A sleeping process uses no CPU: its idle time grows from when it was first seen.
    let grown = wait_for("a sleeping process to look idle", Duration::from_secs(5), || {
        observer.idle_for(sleeper.id()).filter(|d| *d >= Duration::from_millis(100))
    });
    assert!(grown >= Duration::from_millis(100));
    let mut exits = observer.exit_events();
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    let event = wait_for("the watched exit", Duration::from_secs(5), || exits.try_recv().ok());
    assert_eq!(event.pid, sleeper.id());
    assert_eq!(event.activity, None);
}

#[test]
fn a_missing_or_unreadable_library_is_an_error_naming_the_path() {
    let missing = PathBuf::from("/nonexistent/nbos/libcuda.so.1");
    for mode in [ModeRequest::Auto, ModeRequest::Procfs, ModeRequest::Ebpf] {
        let config = ObserverConfig { mode, libraries: vec![missing.clone()], ..ObserverConfig::default() };
        let err = Observer::start(config).err().expect("start must fail").to_string();
        assert!(err.contains("/nonexistent/nbos/libcuda.so.1"), "{mode:?}: {err}");
    }
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("libcuda.so.1");
    std::fs::write(&garbage, b"\x7fELF but not really").unwrap();
    let config = ObserverConfig { libraries: vec![garbage.clone()], ..ObserverConfig::default() };
    let err = Observer::start(config).err().expect("start must fail").to_string();
    assert!(err.contains(&garbage.display().to_string()), "{err}");
    // A directory cannot be read as a library either.
    let config = ObserverConfig { libraries: vec![dir.path().to_owned()], ..ObserverConfig::default() };
    let err = Observer::start(config).err().expect("start must fail").to_string();
    assert!(err.contains(&dir.path().display().to_string()), "{err}");
}

/// Without privileges `mode = auto` must fall back to procfs with a clear log line, and the same
/// API answers there (`snapshot` from a shim counters file, `idle_for`). As root we drop to
/// `nobody` in a child process (the check binary); as a normal user we are already unprivileged.
#[test]
fn without_privileges_auto_mode_falls_back_to_procfs_with_a_log_line() {
    let lib = common::driver_library();
    let dir = tempfile::tempdir().unwrap();
    let mut gpu_user = Command::new("sleep").arg("30").spawn().unwrap();
    let shim = ShimCountersWriter::create(dir.path(), gpu_user.id()).unwrap();
    for _ in 0..1000 {
        shim.record_launch();
    }
    shim.record_copy(MIB);
    // `nobody` must be able to read the counters (the daemon's directory is readable the same way).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(shim.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nbos-observer-check"));
    cmd.args(["--mode", "auto", "--library"]).arg(&lib).arg("--counters-dir").arg(dir.path());
    cmd.arg("--pid").arg(gpu_user.id().to_string());
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        use std::os::unix::process::CommandExt;
        cmd.uid(65534).gid(65534);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout {stdout} stderr {stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["mode"], "procfs", "{stderr}");
    assert_eq!(v["uprobes"], 0);
    assert!(stderr.contains("falling back to procfs mode"), "{stderr}");
    assert!(stderr.contains("not permitted") && stderr.contains("CAP_BPF"), "the log says why: {stderr}");
    let snap = &v["snapshot"];
    assert_eq!((snap["launches"].as_u64(), snap["copy_bytes"].as_u64()), (Some(1000), Some(MIB)), "{v}");
    assert_eq!(snap["sources"]["shim_counters"], true, "{v}");
    assert!(snap["cpu_time_ns"].is_u64(), "procfs fields answer: {v}");
    assert!(v["idle_for_ms"].is_u64(), "{v}");
    gpu_user.kill().unwrap();
    gpu_user.wait().unwrap();
}

/// The shim's lease-protocol `Activity { calls }` reports, fed in by the lease server, make a
/// process GPU-active in any mode: idle time restarts only when the count grows.
#[test]
fn lease_protocol_activity_reports_drive_snapshot_and_idle_for() {
    let dir = tempfile::tempdir().unwrap();
    let observer = Observer::start(procfs_config(dir.path())).unwrap();
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = child.id();
    assert_eq!(observer.snapshot(pid), None);
    observer.record_shim_activity(pid, 10).unwrap();
    let a = observer.snapshot(pid).unwrap();
    assert_eq!(a.shim_calls, 10);
    assert!(a.sources.lease_reports && !a.sources.shim_counters);
    let grown = wait_for("idle_for to grow past 100 ms", Duration::from_secs(5), || {
        observer.idle_for(pid).filter(|d| *d >= Duration::from_millis(100))
    });
    observer.record_shim_activity(pid, 10).unwrap(); // same count: still idle
    assert!(observer.idle_for(pid).unwrap() >= grown);
    observer.record_shim_activity(pid, 11).unwrap();
    assert!(observer.idle_for(pid).unwrap() < grown);
    let mut exits = observer.exit_events();
    child.kill().unwrap();
    child.wait().unwrap();
    let event = wait_for("the exit event", Duration::from_secs(5), || exits.try_recv().ok());
    assert_eq!((event.pid, event.activity.map(|a| a.shim_calls)), (pid, Some(11)));
}

/// A subscriber that stops reading holds at most `exit_queue` events; the rest are counted,
/// not queued, so memory stays bounded.
#[test]
fn a_subscriber_that_stops_reading_loses_newer_exits_counted_not_queued() {
    let dir = tempfile::tempdir().unwrap();
    let observer = Observer::start(ObserverConfig { exit_queue: 1, ..procfs_config(dir.path()) }).unwrap();
    let mut exits = observer.exit_events();
    let mut children: Vec<_> = (0..3).map(|_| Command::new("sleep").arg("30").spawn().unwrap()).collect();
    for c in &children {
        observer.watch(c.id()).unwrap();
    }
    for c in &mut children {
        c.kill().unwrap();
        c.wait().unwrap();
    }
    wait_for("two exit events counted as lagged", Duration::from_secs(5), || {
        (observer.metrics().exit_events_lagged.get() == 2).then_some(())
    });
    let first = exits.try_recv().expect("the queued exit event");
    assert!(children.iter().any(|c| c.id() == first.pid), "{first:?}");
    assert!(exits.try_recv().is_err(), "only exit_queue = 1 event was queued");
}
