//! A kernel's environment is built, not inherited: the daemon's own variables (cloud
//! credentials, CA paths, its settings) never reach a kernel, only an allow-list of them
//! (PATH, HOME, the locale…), plus what the daemon sets on purpose and the client's
//! `KERNEL_*`. What a user can check: `/proc/<kernel pid>/environ`.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nbos_test_support::{http, start_daemon, TOKEN};

/// `/proc/PID/environ` as a map.
fn environ_of(pid: u32) -> BTreeMap<String, String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).expect("environ");
    raw.split(|b| *b == 0)
        .filter(|v| !v.is_empty())
        .filter_map(|v| {
            let v = String::from_utf8_lossy(v);
            let (k, val) = v.split_once('=')?;
            Some((k.to_owned(), val.to_owned()))
        })
        .collect()
}

/// Names a kernel may have: the inherited allow-list and what the daemon sets itself.
fn expected_name(name: &str) -> bool {
    notebookosd::kernel::process::inherited(name)
        || ["NBOS_", "NOTEBOOKOS_", "FAKE_CUDA_", "KERNEL_"].iter().any(|p| name.starts_with(p))
        || ["LD_PRELOAD", "LD_LIBRARY_PATH", "JPY_SESSION_NAME"].contains(&name)
}

#[test]
fn a_kernel_sees_only_allow_listed_and_deliberate_variables() {
    // A new Python: /proc shows the kernel's whole environment.
    check_environment("prewarm_max = 0\n", true);
    // A pre-warmed one: /proc shows what the pool's process started with (the daemon's
    // allow-list and the shim's, never its secrets); the kernel's own variables were set
    // when it took the process over (tests/kernel_prewarm.rs checks them from a cell).
    check_environment("prewarm_min = 1\nprewarm_max = 1\n", false);
}

fn check_environment(prewarm_toml: &str, started_afresh: bool) {
    let wrapper = [
        "env",
        "AWS_SECRET_ACCESS_KEY=daemon-secret",
        "REQUESTS_CA_BUNDLE=/etc/daemon-ca.pem",
        "NBOS_LOG=info",
        "LC_ALL=C.UTF-8",
    ];
    let d = start_daemon(&wrapper, Stdio::inherit(), |c| {
        c.fake_gpus(1).overlay(&format!("[kernel]\n{prewarm_toml}")).expect("[kernel] keys");
    });
    let body = serde_json::json!({
        "name": "notebookos-python-1gpu",
        "env": { "KERNEL_PROJECT": "vision", "LD_PRELOAD": "/tmp/evil.so", "AWS_PROFILE": "client" },
    });
    let (status, model) = http("POST", &format!("{}/api/kernels", d.url), Some(TOKEN), Some(&body.to_string()));
    assert_eq!(status, 201, "{model}");
    let model: serde_json::Value = serde_json::from_str(&model).expect("model");
    let id = model["id"].as_str().expect("id").to_owned();
    let pid = model["pids"][0].as_u64().and_then(|p| u32::try_from(p).ok()).expect("pid");
    let deadline = Instant::now() + Duration::from_secs(30);
    let env = loop {
        let env = environ_of(pid);
        if !env.is_empty() {
            break env;
        }
        assert!(Instant::now() < deadline, "no environment for {pid}");
        std::thread::sleep(Duration::from_millis(50));
    };
    for leaked in ["AWS_SECRET_ACCESS_KEY", "REQUESTS_CA_BUNDLE", "NBOS_LOG", "AWS_PROFILE"] {
        assert!(!env.contains_key(leaked), "{leaked} reached the kernel: {env:?}");
    }
    let unexpected: Vec<&String> = env.keys().filter(|k| !expected_name(k)).collect();
    assert!(unexpected.is_empty(), "variables outside the allow-list: {unexpected:?}");
    assert_eq!(env.get("LC_ALL").map(String::as_str), Some("C.UTF-8"), "the locale is inherited");
    assert!(env.contains_key("PATH"));
    assert_ne!(env.get("LD_PRELOAD").map(String::as_str), Some("/tmp/evil.so"), "the client cannot preload");
    if started_afresh {
        assert_eq!(env.get("KERNEL_PROJECT").map(String::as_str), Some("vision"), "the client's KERNEL_* arrive");
        assert_eq!(env.get("NOTEBOOKOS_KERNEL_ID"), Some(&id));
    }
    let (status, _) = http("DELETE", &format!("{}/api/kernels/{id}", d.url), Some(TOKEN), None);
    assert_eq!(status, 204);
}
