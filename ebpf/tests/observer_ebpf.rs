//! Privileged acceptance tests of the eBPF observer: real uprobes on a real shared library
//! called by a real process, and the real sched_process_exit tracepoint.
//! Run as root; with NBOS_REQUIRE_PRIVILEGED=1 they fail instead of skipping.

mod common;

use std::time::Duration;

use common::{driver_library, ebpf_observer, wait_for, Workload};
use nbos_ebpf::clock::monotonic_ns;
use nbos_ebpf::{Mode, ObserverConfig};

const MIB: u64 = 1 << 20;

fn config() -> ObserverConfig {
    ObserverConfig { libraries: vec![driver_library()], counters_dir: None, ..ObserverConfig::default() }
}

#[test]
fn exact_launch_and_copy_counts_and_nothing_for_an_idle_process() {
    let Some(observer) = ebpf_observer("exact_counts", config()) else { return };
    assert_eq!(observer.mode(), Mode::Ebpf);
    assert!(observer.probe_count() >= 3, "probes: {}", observer.probe_count());
    let lib = driver_library();
    let mut busy = Workload::start(&lib);
    let idle = Workload::start(&lib);
    busy.run("launch 1000");
    busy.run(&format!("htod 100 {MIB}"));

    let a = observer.snapshot(busy.pid()).expect("activity of the busy process");
    assert_eq!(a.launches, 1000);
    assert_eq!(a.copies, 100);
    assert_eq!(a.copy_bytes, 100 * MIB);
    assert_eq!(a.syncs, 0);
    assert_eq!(a.comm, "workload");
    assert!(a.sources.uprobes && !a.sources.shim_counters);
    assert!(a.first_activity_ns > 0 && a.last_activity_ns >= a.first_activity_ns);
    assert_eq!(observer.snapshot(idle.pid()), None);
    let all: Vec<u32> = observer.snapshot_all().iter().map(|a| a.pid).collect();
    assert!(all.contains(&busy.pid()) && !all.contains(&idle.pid()), "{all:?}");
}

/// Byte counts come from the call's arguments (memset: count × element size). The 2D/3D copy
/// descriptors are not exercised here: tests/fake-cuda does not export cuMemcpy2D/3D (their
/// field offsets are checked against cuda.h in `bpf_abi`).
#[test]
fn memset_and_sync_are_counted_with_bytes_from_the_arguments() {
    let Some(observer) = ebpf_observer("memset_sync", config()) else { return };
    let mut w = Workload::start(&driver_library());
    w.run("htod 1 4096"); // allocates the device buffer the memsets write
    w.run("memset32 3 256");
    w.run("sync");
    let a = observer.snapshot(w.pid()).unwrap();
    assert_eq!((a.copies, a.copy_bytes), (1, 4096));
    assert_eq!((a.memsets, a.memset_bytes), (3, 3 * 256 * 4));
    assert_eq!((a.syncs, a.launches), (1, 0));
}

#[test]
fn idle_for_grows_while_sleeping_and_resets_at_the_next_launch() {
    let Some(observer) = ebpf_observer("idle_for", config()) else { return };
    let mut w = Workload::start(&driver_library());
    w.run("launch 1");
    let first = observer.idle_for(w.pid()).unwrap();
    let grown = wait_for("idle_for to grow past 200 ms", Duration::from_secs(5), || {
        observer.idle_for(w.pid()).filter(|d| *d >= Duration::from_millis(200))
    });
    assert!(grown > first);
    w.run("launch 1");
    // Without a reset it would be `grown` plus the time since: smaller means it started again.
    let reset = observer.idle_for(w.pid()).unwrap();
    assert!(reset < grown, "reset {reset:?} grown {grown:?}");
    assert_eq!(observer.snapshot(w.pid()).unwrap().launches, 2);
}

/// How late the event comes is a figure of `nbos bench observe` (`exit_event_ms`), not a
/// limit here: the wait is generous, so a loaded machine cannot fail it.
#[test]
fn exit_event_arrives_with_final_counts() {
    let Some(observer) = ebpf_observer("exit_event", config()) else { return };
    let mut exits = observer.exit_events();
    let mut w = Workload::start(&driver_library());
    let pid = w.pid();
    w.run("launch 7");
    w.exit();
    let event = wait_for("the exit event", Duration::from_secs(30), || loop {
        match exits.try_recv() {
            Ok(e) if e.pid == pid => break Some(e),
            Ok(_) => continue,
            Err(_) => break None,
        }
    });
    assert!(event.exited_at_ns > 0 && event.exited_at_ns <= monotonic_ns(), "the kernel's exit timestamp: {event:?}");
    assert_eq!(event.exit_code, Some(0));
    assert_eq!(event.activity.as_ref().map(|a| a.launches), Some(7));
    assert_eq!(observer.snapshot(pid), None, "an exited process is dropped");
    assert_eq!(observer.idle_for(pid), None);
}

#[test]
fn a_watched_process_without_gpu_calls_reports_its_exit() {
    let Some(observer) = ebpf_observer("watched_exit", config()) else { return };
    let mut exits = observer.exit_events();
    let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let pid = child.id();
    observer.watch(pid).unwrap();
    assert_eq!(observer.snapshot(pid), None);
    assert!(observer.idle_for(pid).is_some());
    child.kill().unwrap();
    child.wait().unwrap();
    let event = wait_for("the watched exit", Duration::from_secs(5), || loop {
        match exits.try_recv() {
            Ok(e) if e.pid == pid => break Some(e),
            Ok(_) => continue,
            Err(_) => break None,
        }
    });
    assert_eq!(event.activity, None);
    assert_eq!(event.exit_code, Some(libc::SIGKILL), "exit_code holds the killing signal");
    // The sweep must not report the same exit again.
    observer.refresh_metrics();
    assert!(std::iter::from_fn(|| exits.try_recv().ok()).all(|e| e.pid != pid), "duplicate exit event");
}

#[test]
fn watching_a_process_that_is_already_gone_still_reports_its_exit() {
    let Some(observer) = ebpf_observer("watched_gone", config()) else { return };
    let mut exits = observer.exit_events();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    observer.watch(pid).unwrap();
    observer.refresh_metrics();
    let event = wait_for("the exit of a process gone before the watch", Duration::from_secs(5), || {
        std::iter::from_fn(|| exits.try_recv().ok()).find(|e| e.pid == pid)
    });
    assert_eq!(event.exit_code, None, "the kernel's exit status was not seen");
    observer.refresh_metrics();
    assert!(std::iter::from_fn(|| exits.try_recv().ok()).all(|e| e.pid != pid), "duplicate exit event");
}

#[test]
fn metrics_count_launches_per_kernel_label_and_show_the_mode() {
    let Some(observer) = ebpf_observer("metrics", config()) else { return };
    let mut w = Workload::start(&driver_library());
    observer.set_kernel_label(w.pid(), "kernel-a");
    w.run("launch 5");
    w.run(&format!("htod 2 {MIB}"));
    observer.refresh_metrics();
    let mut registry = prometheus_client::registry::Registry::default();
    observer.metrics().register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(text.contains("notebookos_gpu_launches_total{kernel=\"kernel-a\"} 5"), "{text}");
    assert!(text.contains(&format!("notebookos_gpu_copy_bytes_total{{kernel=\"kernel-a\"}} {}", 2 * MIB)), "{text}");
    assert!(text.contains("notebookos_observer_mode{mode=\"ebpf\"} 1"), "{text}");
    assert!(text.contains("notebookos_observer_mode{mode=\"procfs\"} 0"), "{text}");
    assert!(text.contains("notebookos_observer_exit_events_dropped_total 0"), "{text}");
    // Refreshing again adds nothing new: counters follow the process, not the number of sweeps.
    observer.refresh_metrics();
    let mut again = String::new();
    prometheus_client::encoding::text::encode(&mut again, &registry).unwrap();
    assert!(again.contains("notebookos_gpu_launches_total{kernel=\"kernel-a\"} 5"), "{again}");
}

/// The production design: no uprobe on launches, exact launch counts from the shim's counters
/// file, uprobes on the rarer calls, and the exit still reported (the observer watches every
/// process with a counters file).
#[test]
fn production_design_reads_launches_from_the_counters_file_and_probes_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let config = ObserverConfig {
        libraries: vec![driver_library()],
        launch_probes: false,
        counters_dir: Some(dir.path().to_owned()),
        ..ObserverConfig::default()
    };
    let Some(observer) = ebpf_observer("production_design", config) else { return };
    let mut exits = observer.exit_events();
    let mut w = Workload::start(&driver_library());
    let pid = w.pid();
    // Play the shim's part: it counts what it forwards.
    let shim = nbos_ebpf::shim_counters::ShimCountersWriter::create(dir.path(), pid).unwrap();
    w.run("launch 1000");
    for _ in 0..1000 {
        shim.record_launch();
    }
    w.run("sync");
    let a = observer.snapshot(pid).unwrap();
    assert_eq!((a.launches, a.syncs), (1000, 1), "{a:?}");
    assert!(a.sources.uprobes && a.sources.shim_counters);
    observer.refresh_metrics();
    w.exit();
    let event = wait_for("the exit event", Duration::from_secs(5), || loop {
        match exits.try_recv() {
            Ok(e) if e.pid == pid => break Some(e),
            Ok(_) => continue,
            Err(_) => break None,
        }
    });
    assert_eq!(event.activity.map(|a| a.launches), Some(1000));
    assert!(!nbos_ebpf::shim_counters::path_for(dir.path(), pid).exists());
}

/// The optional ioctl probe counts ioctls on the configured device files only (here /dev/null
/// stands in for /dev/nvidia*, which this machine lacks), per process.
#[test]
fn ioctl_probe_counts_ioctls_on_the_watched_device_files() {
    let config = ObserverConfig {
        libraries: vec![driver_library()],
        counters_dir: None,
        ioctl_probe: true,
        ioctl_devices: vec!["/dev/null".into()],
        ..ObserverConfig::default()
    };
    let Some(observer) = ebpf_observer("ioctl_probe", config) else { return };
    let mut w = Workload::start(&driver_library());
    let other = Workload::start(&driver_library());
    w.run("ioctl 5 /dev/null");
    w.run("ioctl 3 /dev/zero"); // not a watched device
    let a = observer.snapshot(w.pid()).expect("ioctls make the process known");
    assert_eq!((a.driver_ioctls, a.launches), (5, 0));
    assert!(a.last_activity_ns > 0);
    assert_eq!(observer.snapshot(other.pid()), None);
}
