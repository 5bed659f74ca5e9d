//! The scheduler core driven alone, in virtual time, through every NotebookOS
//! session template (`traces/templates/*.json` in the repository, 60 s ticks): no GPU is
//! ever committed twice (the replay keeps an independent ledger), every training
//! event runs, committed GPU-ticks equal the floor, and bound GPU-ticks stay
//! within the floor plus the idle-release allowance.

// A test of the crate reads the trace templates from disk; the crate itself may not (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::path::PathBuf;

use nbos_sched::replay::{replay, Report};
use nbos_sched::template::{Template, TICK_MS};

/// Where the templates are: `NBOS_TRACES_DIR`, else `<repo>/traces/templates`.
fn templates() -> Vec<(String, Template)> {
    let dir = std::env::var_os("NBOS_TRACES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../traces/templates"));
    let mut out = Vec::new();
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| {
        panic!("cannot read the workload templates in {} ({e}); set NBOS_TRACES_DIR", dir.display())
    });
    for entry in entries {
        let path = entry.expect("dir entry").path();
        if path.extension().is_some_and(|e| e == "json") {
            let text = std::fs::read_to_string(&path).expect("read template");
            let t = Template::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            out.push((path.file_name().expect("name").to_string_lossy().into_owned(), t));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(out.len() >= 7, "expected the 7 shipped templates in {}, found {}", dir.display(), out.len());
    out
}

fn check(name: &str, t: &Template, gpus: u32, idle_release_ms: u64) -> Report {
    let r = replay(t, gpus, idle_release_ms, 1000.0)
        .unwrap_or_else(|v| panic!("{name} on {gpus} GPUs, idle_release {idle_release_ms} ms: {v}"));
    assert_eq!(r.completed, r.trainings, "{name}: every training event runs");
    assert_eq!(r.rejected, 0, "{name}");
    assert_eq!(r.gpu_ticks_committed, r.gpu_ticks_floor, "{name}: committed GPU-ticks are exactly the floor");
    assert_eq!(
        r.scheduler_bound_gpu_ms,
        u128::from(r.gpu_ticks_bound) * u128::from(TICK_MS),
        "{name}: the scheduler's own GPU-time integral disagrees with the replay's ledger"
    );
    let idle_ticks = idle_release_ms.div_ceil(TICK_MS);
    let allowance: u64 = t.sessions.iter().flat_map(|s| &s.trainings).map(|tr| u64::from(tr.gpus) * idle_ticks).sum();
    assert!(
        r.gpu_ticks_bound >= r.gpu_ticks_floor && r.gpu_ticks_bound <= r.gpu_ticks_floor + allowance,
        "{name}: bound {} not within [floor {}, floor + idle allowance {}]",
        r.gpu_ticks_bound,
        r.gpu_ticks_floor,
        r.gpu_ticks_floor + allowance
    );
    r
}

#[test]
fn every_template_on_the_smallest_feasible_host() {
    for (name, t) in templates() {
        let r = check(&name, &t, t.max_gpus(), 30_000);
        eprintln!(
            "{name}: {} trainings on {} GPU(s): bound {} GPU-ticks, floor {}, reservation {}, max wait {} ticks",
            r.trainings,
            t.max_gpus(),
            r.gpu_ticks_bound,
            r.gpu_ticks_floor,
            r.gpu_ticks_reservation,
            r.waits_ms.iter().max().copied().unwrap_or(0) / TICK_MS
        );
    }
}

#[test]
fn every_template_with_a_long_idle_release_preempts_instead_of_waiting() {
    for (name, t) in templates() {
        // Five ticks of idle holding: waiting cells must take idle-held GPUs from others.
        let r = check(&name, &t, t.max_gpus(), 5 * TICK_MS);
        let contended = t.sessions.len() > 1 && t.max_gpus() == 1;
        if contended {
            assert!(r.preemptions > 0, "{name}: contended 1-GPU host must preempt idle-held GPUs");
        }
    }
}

#[test]
fn a_roomy_host_never_makes_a_cell_wait_and_beats_reservation() {
    for (name, t) in templates() {
        // One GPU per session's largest request: no contention at all.
        let room: u32 = t.sessions.iter().map(|s| s.trainings.iter().map(|x| x.gpus).max().unwrap_or(0)).sum();
        let r = check(&name, &t, room, 30_000);
        assert!(r.waits_ms.iter().all(|w| *w == 0), "{name}: a cell waited on a host with room for everyone");
        assert!(
            r.gpu_ticks_bound <= r.gpu_ticks_reservation,
            "{name}: per-cell binding ({}) bound more than whole-session reservation ({})",
            r.gpu_ticks_bound,
            r.gpu_ticks_reservation
        );
    }
}

#[test]
fn replays_are_deterministic() {
    for (name, t) in templates() {
        let a = replay(&t, t.max_gpus(), 2 * TICK_MS, 1000.0).expect("replay a");
        let b = replay(&t, t.max_gpus(), 2 * TICK_MS, 1000.0).expect("replay b");
        assert_eq!(a, b, "{name}: two replays of the same template differ");
    }
}
