//! The real CUDA shim and the real observer together, as the daemon runs them: a process under
//! `libnbos_cuda_shim.so` (`LD_PRELOAD`, forwarding to tests/fake-cuda, writing its counters file
//! in `NBOS_SHIM_COUNTERS_DIR`), watched by an eBPF observer with `launch_probes = false` and that
//! counters directory. Elsewhere each is tested against a stand-in for the other. Needs root
//! (skips otherwise; with NBOS_REQUIRE_PRIVILEGED=1 it fails instead).

mod common;

use std::path::Path;
use std::time::Duration;

use common::{ebpf_observer, wait_for, Workload};
use nbos_ebpf::bench::ShimEnv;
use nbos_ebpf::ObserverConfig;

const LAUNCHES: u64 = 500;
const COPIES: u64 = 7;
const COPY_BYTES: u64 = 4096;

#[test]
fn the_observer_reports_exactly_what_a_process_under_the_shim_did_then_its_idleness_and_exit() {
    let driver = common::driver_library();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let shim = ShimEnv::unmanaged(&common::shim_library(), &driver, dir.path()).unwrap();
    // As daemon/src/node/observer.rs starts it.
    let production = ObserverConfig {
        libraries: vec![driver.clone()],
        launch_probes: false,
        counters_dir: Some(shim.counters_dir.clone()),
        ..ObserverConfig::default()
    };
    let Some(observer) = ebpf_observer("shim_and_observer", production) else { return };
    // The uprobes alone (no counters file): what the driver-library probes saw through the shim.
    let uprobes_cfg = ObserverConfig {
        libraries: vec![driver.clone()],
        launch_probes: false,
        counters_dir: None,
        ..ObserverConfig::default()
    };
    let Some(uprobes) = ebpf_observer("shim_and_observer_uprobes", uprobes_cfg) else { return };
    let mut exits = observer.exit_events();

    // "libcuda.so.1": the soname the preloaded shim answers to, as cudart loads it.
    let mut w = Workload::start_with_env(Path::new("libcuda.so.1"), &shim.env);
    let pid = w.pid();
    w.run(&format!("launch {LAUNCHES}"));
    w.run(&format!("htod {COPIES} {COPY_BYTES}"));
    w.run("sync");

    assert!(nbos_ebpf::shim_counters::path_for(&shim.counters_dir, pid).is_file(), "the shim wrote its counters file");
    let a = observer.snapshot(pid).expect("the observer sees the process");
    assert_eq!((a.launches, a.copies, a.copy_bytes, a.syncs), (LAUNCHES, COPIES, COPIES * COPY_BYTES, 1), "{a:?}");
    assert!(a.sources.shim_counters && a.sources.uprobes, "{a:?}");
    let u = uprobes.snapshot(pid).expect("the uprobes saw the process");
    assert_eq!((u.launches, u.copies, u.copy_bytes, u.syncs), (0, COPIES, COPIES * COPY_BYTES, 1), "{u:?}");
    assert_eq!(observer.snapshot_all().iter().filter(|p| p.pid == pid).count(), 1);

    // Idle: no GPU call, so idle_for grows; one launch resets it.
    let grown = wait_for("idle_for to grow", Duration::from_secs(10), || {
        observer.idle_for(pid).filter(|d| *d >= Duration::from_millis(500))
    });
    w.run("launch 1");
    let reset = observer.idle_for(pid).expect("alive");
    assert!(reset < grown, "reset {reset:?} grown {grown:?}");

    w.exit();
    let event = wait_for("the exit event", Duration::from_secs(5), || loop {
        match exits.try_recv() {
            Ok(e) if e.pid == pid => break Some(e),
            Ok(_) => continue,
            Err(_) => break None,
        }
    });
    assert_eq!(event.exit_code, Some(0));
    let last = event.activity.expect("final counts");
    assert_eq!((last.launches, last.copies, last.syncs), (LAUNCHES + 1, COPIES, 1), "{last:?}");
    assert_eq!(observer.snapshot(pid), None, "an exited process is dropped");
    assert_eq!(observer.idle_for(pid), None);
}
