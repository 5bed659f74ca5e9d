//! What one notebook may take from its host (issue 29): a real root daemon, real
//! ipykernels (started afresh and taken from the pre-warm pool), and a cell that tries to
//! fill the disk through its home, fill the host's memory through `/dev/shm`, peek at
//! another kernel's `/dev/shm`, and reads its open-file and process limits. Needs root,
//! the `notebookos-kernel` account, loop devices and mke2fs; fails instead of skipping
//! when `NBOS_REQUIRE_PRIVILEGED=1`. The shipped config's check runs anywhere.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod required;
use nbos_test_support::{http, run_cell, start_daemon, Daemon, TOKEN};

const HOME_QUOTA_MIB: u64 = 64;
const SHM_MIB: u64 = 16;
const OPEN_FILES: u64 = 1000;
const NPROC: u64 = 5000;

/// Why this host cannot run the root tests, if it cannot.
fn cannot_run() -> Option<String> {
    // SAFETY: geteuid(2) has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (mount namespaces, loop devices, another uid)".to_owned());
    }
    if !Command::new("id").args(["-u", "notebookos-kernel"]).output().is_ok_and(|o| o.status.success()) {
        return Some("no notebookos-kernel account: run scripts/install-deps.sh".to_owned());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("no /dev/loop-control (loop devices) on this host".to_owned());
    }
    if !["/usr/sbin/mke2fs", "/sbin/mke2fs"].iter().any(|p| Path::new(p).exists()) {
        return Some("no mke2fs: install e2fsprogs (scripts/install-deps.sh)".to_owned());
    }
    None
}

fn start(prewarm: &str) -> (Daemon, PathBuf) {
    let d = start_daemon(&[], Stdio::inherit(), |c| {
        let k = &mut c.fake_gpus(0).config.kernel;
        (k.home_quota_mib, k.shm_size_mib, k.open_files_max, k.nproc_max) =
            (HOME_QUOTA_MIB, SHM_MIB, OPEN_FILES, NPROC);
        c.overlay(&format!("[kernel]\n{prewarm}")).expect("[kernel] keys");
    });
    let (_, status) = http("GET", &format!("{}/api/v1/status", d.url), Some(TOKEN), None);
    let status: serde_json::Value = serde_json::from_str(&status).expect("status json");
    let state_dir = PathBuf::from(status["state_dir"].as_str().expect("state_dir"));
    (d, state_dir)
}

fn create_kernel(d: &Daemon) -> String {
    let (code, body) = http("POST", &format!("{}/api/kernels", d.url), Some(TOKEN), Some(r#"{"name":"python3"}"#));
    assert_eq!(code, 201, "{body}");
    let model: serde_json::Value = serde_json::from_str(&body).expect("json");
    model["id"].as_str().expect("id").to_owned()
}

/// The value of one series on /metrics (0 when absent).
fn metric(d: &Daemon, series: &str) -> f64 {
    let (_, text) = http("GET", &format!("{}/metrics", d.url), None, None);
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Runs `code` (whose last line is a `json.dumps(...)`) in the kernel; its value.
async fn cell_json(url: &str, kernel: &str, code: &str) -> serde_json::Value {
    let out = run_cell(url, TOKEN, kernel, code).await.value();
    let text = out.trim().trim_matches('\'');
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: cell printed {out}"))
}

/// Writes 1 MiB blocks to a file until the write fails or `cap` MiB are written: MiB
/// written, the errno's name, and the filesystem's size in MiB.
const FILL: &str = r#"import os, errno, json
def fill(path, cap):
    n, err = 0, None
    try:
        with open(path, 'wb') as f:
            block = b'x' * (1 << 20)
            while n < cap:
                f.write(block)
                f.flush()
                n += 1
    except OSError as e:
        err = errno.errorcode.get(e.errno, str(e.errno))
    st = os.statvfs(os.path.dirname(path))
    return {"mib": n, "err": err, "fs_mib": st.f_blocks * st.f_frsize >> 20}
"#;

/// Every limit, seen from one kernel's cell; `other` is another kernel's id, whose
/// `/dev/shm` file must not be visible.
async fn check_kernel(d: &Daemon, state_dir: &Path, id: &str, how: &str) {
    let url = d.url.clone();
    let own_dir = state_dir.join("kernels").join(id);
    let home = own_dir.join("home");
    let cell = format!(
        "{FILL}import resource\njson.dumps({{\"home\": os.environ['HOME'], \"tmp\": os.environ.get('TMPDIR'), \
         \"cwd\": os.getcwd(), \"nofile\": resource.getrlimit(resource.RLIMIT_NOFILE), \
         \"nproc\": resource.getrlimit(resource.RLIMIT_NPROC), \
         \"disk\": fill(os.path.join(os.environ['HOME'], 'fill'), {}), \
         \"shm\": fill('/dev/shm/nbos-fill-{id}', {})}})",
        HOME_QUOTA_MIB * 4,
        SHM_MIB * 4
    );
    let seen = cell_json(&url, id, &cell).await;
    // Its home is on disk under the state directory, and its temporary files go there.
    assert_eq!(seen["home"], home.display().to_string().as_str(), "{how}: {seen}");
    assert_eq!(seen["tmp"], seen["home"], "{how}: {seen}");
    assert_eq!(seen["cwd"], seen["home"], "{how}: {seen}");
    // The limits are the configured ones, not the daemon's (LimitNOFILE=1048576).
    assert_eq!(seen["nofile"], serde_json::json!([OPEN_FILES, OPEN_FILES]), "{how}: {seen}");
    assert_eq!(seen["nproc"], serde_json::json!([NPROC, NPROC]), "{how}: {seen}");
    // Filling the home stops at its quota with ENOSPC (or EDQUOT)...
    let disk = &seen["disk"];
    assert!(disk["err"] == "ENOSPC" || disk["err"] == "EDQUOT", "{how}: home not bounded: {seen}");
    assert!(disk["fs_mib"].as_u64().is_some_and(|m| m <= HOME_QUOTA_MIB), "{how}: {seen}");
    assert!(disk["mib"].as_u64().is_some_and(|m| m <= HOME_QUOTA_MIB), "{how}: {seen}");
    // ...and the host's disk holds at most the image: the file is not in the host's view
    // of the directory, and the image's allocated blocks are within the quota.
    assert!(!home.join("fill").exists(), "{how}: the kernel's file landed on the host's disk");
    let image = std::fs::metadata(own_dir.join(".home.ext4")).expect("the home image");
    assert_eq!(image.uid(), 0, "{how}: the image is not root's");
    assert!(image.blocks() * 512 <= HOME_QUOTA_MIB << 20, "{how}: image holds {} bytes", image.blocks() * 512);
    // Filling /dev/shm stops at its size, and the host's /dev/shm never sees the file.
    let shm = &seen["shm"];
    assert_eq!(shm["err"], "ENOSPC", "{how}: /dev/shm not bounded: {seen}");
    assert!(shm["mib"].as_u64().is_some_and(|m| m <= SHM_MIB), "{how}: {seen}");
    assert!(!Path::new(&format!("/dev/shm/nbos-fill-{id}")).exists(), "{how}: the kernel wrote the host's /dev/shm");
    // The kernel lives on, and freeing its space works.
    let free = format!(
        "import os, json\nos.remove(os.path.join(os.environ['HOME'], 'fill'))\nos.remove('/dev/shm/nbos-fill-{id}')\njson.dumps(6 * 7)"
    );
    let again = cell_json(&url, id, &free).await;
    assert_eq!(again, 42, "{how}");
}

/// One kernel started afresh, one taken from the pre-warm pool: both get every limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_cannot_fill_the_hosts_disk_or_dev_shm_and_has_the_configured_rlimits() {
    if let Some(why) = cannot_run() {
        required::cannot_run("kernel_limits", &why);
        return;
    }
    // Started afresh (no pool).
    let (d, state_dir) = tokio::task::block_in_place(|| start("prewarm_max = 0\n"));
    let fresh = tokio::task::block_in_place(|| create_kernel(&d));
    check_kernel(&d, &state_dir, &fresh, "a new kernel").await;
    // A neighbour does not see the first kernel's /dev/shm segment.
    let cell = format!("{FILL}json.dumps(fill('/dev/shm/nbos-mine-{fresh}', 1))");
    assert_eq!(cell_json(&d.url, &fresh, &cell).await["err"], serde_json::Value::Null);
    let neighbour = tokio::task::block_in_place(|| create_kernel(&d));
    let listed = cell_json(&d.url, &neighbour, "import os, json\njson.dumps(sorted(os.listdir('/dev/shm')))").await;
    assert!(
        listed.as_array().is_some_and(|l| !l.iter().any(|f| f.as_str().is_some_and(|f| f.contains(&fresh)))),
        "another kernel's /dev/shm is visible: {listed}"
    );
    drop(d);

    // Taken from the pool: its process existed before the kernel was known.
    let (d, state_dir) = tokio::task::block_in_place(|| start("prewarm_min = 1\nprewarm_max = 1\n"));
    let deadline = Instant::now() + Duration::from_secs(90);
    while tokio::task::block_in_place(|| metric(&d, r#"notebookos_prewarm_pool_processes{state="ready"}"#)) < 1.0 {
        assert!(Instant::now() < deadline, "the pre-warm pool did not fill");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pooled = tokio::task::block_in_place(|| create_kernel(&d));
    let hits = tokio::task::block_in_place(|| metric(&d, r#"notebookos_prewarm_takes_total{result="hit"}"#));
    assert_eq!(hits, 1.0, "the kernel did not come from the pool");
    check_kernel(&d, &state_dir, &pooled, "a pre-warmed kernel").await;
}

/// The shipped config bounds kernels: a memory limit, homes with a quota (on disk under
/// the state directory, node/kernels_dir.rs), a bounded /dev/shm, an open-file limit below the
/// daemon's.
#[test]
fn the_shipped_config_bounds_what_a_kernel_may_take() {
    let text = include_str!("../../packaging/notebookosd.toml");
    let c = notebookosd::config::Config::parse(text, "packaging/notebookosd.toml").expect("shipped config");
    let k = &c.kernel;
    assert!(k.memory_limit_mib > 0, "no memory limit per kernel");
    assert!(k.home_quota_mib > 0, "no home quota");
    assert!(k.shm_size_mib > 0, "/dev/shm shared and unbounded");
    assert!(k.open_files_max > 0 && k.open_files_max < 1_048_576, "kernels inherit the daemon's open-file limit");
    assert!(k.nproc_max > 0, "no RLIMIT_NPROC");
    assert!(!c.node.state_dir.starts_with("/run"), "{}", c.node.state_dir.display());
}
