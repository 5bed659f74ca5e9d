//! `nbos bench raft --etcd`: the comparison runs (a tiny one, so the etcd path cannot rot), and
//! asking for it without etcd installed fails with the install command instead of passing.
//! etcd comes from `scripts/install-deps.sh` (Debian `etcd-server`); without it the first test
//! fails rather than skips.

use std::path::Path;
use std::process::Command;

const NBOS: &str = env!("CARGO_BIN_EXE_nbos");
const ETCD: &str = "/usr/bin/etcd";

#[test]
fn bench_raft_with_etcd_drives_both_the_same_way() {
    assert!(Path::new(ETCD).is_file(), "{ETCD} missing: run scripts/install-deps.sh (apt-get install etcd-server)");
    let o = Command::new(NBOS)
        .args(["bench", "raft", "--nodes", "3", "--duration", "1s", "--idle-groups", "10", "--clients", "4"])
        .args(["--etcd", "--json"])
        .output()
        .expect("nbos bench raft --etcd");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "nbos bench raft --etcd failed: {err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {}", String::from_utf8_lossy(&o.stdout)));
    for key in ["etcd_throughput_ops", "etcd_sequential_ops", "etcd_commit_p50_ms", "throughput_ratio_vs_etcd"] {
        let x = v[key].as_f64().unwrap_or_else(|| panic!("`{key}` is not a number in {v}"));
        assert!(x > 0.0, "`{key}` = {x} in {v}");
    }
    assert_eq!(v["etcd_client"], "grpc", "{v}");
    assert_eq!(v["policy"], "leader", "{v}");
}

#[test]
fn bench_raft_etcd_without_the_binary_fails_with_the_install_command() {
    let o = Command::new(NBOS)
        .args(["bench", "raft", "--duration", "1s", "--etcd", "--etcd-bin", "/nonexistent/etcd", "--json"])
        .output()
        .expect("nbos bench raft --etcd");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "must fail when etcd is missing; stdout: {}", String::from_utf8_lossy(&o.stdout));
    assert!(err.contains("apt-get install etcd-server") && err.contains("/nonexistent/etcd"), "{err}");
    assert!(o.stdout.is_empty(), "no report when the comparison cannot run");
}
