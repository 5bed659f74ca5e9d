//! `nbos bench …` as a script uses it: one JSON object with the documented keys.

use std::process::Command;

const NBOS: &str = env!("CARGO_BIN_EXE_nbos");

#[test]
fn bench_raft_json_has_the_documented_figures() {
    let o = Command::new(NBOS)
        .args(["bench", "raft", "--nodes", "3", "--duration", "1s", "--idle-groups", "20", "--clients", "8", "--json"])
        .output()
        .expect("nbos bench raft");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "nbos bench raft failed: {err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {}", String::from_utf8_lossy(&o.stdout)));
    // failover_idle_group_ms: the killed leader led one of the 20 idle groups (each node leads
    // about a third of them; none is a 0.03 % chance).
    for key in [
        "commit_p50_ms",
        "commit_p99_ms",
        "commit_p999_ms",
        "throughput_ops",
        "failover_ms",
        "failover_idle_group_ms",
        "rss_1000_groups_mib",
    ] {
        let x = v[key].as_f64().unwrap_or_else(|| panic!("`{key}` is not a number in {v}"));
        assert!(x > 0.0, "`{key}` = {x} in {v}");
    }
    assert!(v["commit_p50_ms"].as_f64() <= v["commit_p99_ms"].as_f64(), "{v}");
    assert!(v["etcd_throughput_ops"].is_null(), "etcd was not asked for: {v}");
}
