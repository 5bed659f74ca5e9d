//! `nbos bench observe`: a child under the real shim (leased, with the daemon's environment) and
//! the real observer; the JSON has the documented figures and every observed launch was counted.
//! (Timings are never asserted.) Without root the observer runs in procfs mode; with
//! NBOS_REQUIRE_PRIVILEGED=1 that fails.

use std::process::Command;

const NBOS: &str = env!("CARGO_BIN_EXE_nbos");

#[test]
fn bench_observe_counts_the_childs_launches_and_reports_the_added_cost() {
    let o = Command::new(NBOS)
        .args(["bench", "observe", "--launches", "2000", "--sync-every", "100", "--rounds", "2", "--json"])
        .output()
        .expect("nbos bench observe");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "nbos bench observe failed: {err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {}", String::from_utf8_lossy(&o.stdout)));
    assert_eq!(v["counted_launches"], 2000, "{v}");
    assert_eq!(v["managed"], true, "the child's shim held a lease: {v}");
    assert_eq!(v["syncs"], 20, "{v}");
    for key in
        ["unobserved_ns_per_launch", "observed_ns_per_launch", "added_ns_per_launch", "added_pct", "exit_event_ms"]
    {
        assert!(v[key].as_f64().is_some(), "`{key}` is not a number in {v}");
    }
    if std::env::var("NBOS_REQUIRE_PRIVILEGED").as_deref() == Ok("1") {
        assert_eq!(v["mode"], "ebpf", "{v}");
        assert!(v["uprobe_cost_ns"].as_f64().is_some(), "{v}");
    }
}
