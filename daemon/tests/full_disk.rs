//! A full disk under a host's state directory (issue 16's full-disk fault; docs/operations.md,
//! "When a host's disk fills"). Host 3's `node.state_dir` is a 64 MiB tmpfs that a filler
//! file then fills while a replicated kernel runs cells, sent through host 3's gateway so
//! that host 3's replica executes them:
//!
//! - no cell is acknowledged (`ok`) whose changes are then lost: a cell whose namespace
//!   export fails on the full disk answers `NamespaceSyncFailed` (the campaign found it
//!   answered `ok` and lost 22 such cells);
//! - host 3's raft log write fails, and its daemon stops by itself with exit status 1 and
//!   the reason (fail-stop, no host that looks alive and never answers), its kernel
//!   processes with it;
//! - the kernel goes on with its replicas on hosts 1 and 2: every cell is answered;
//! - once the filler is gone, host 3 starts again on its own state directory, recovers its
//!   raft log and catches up: the namespace holds the cell acknowledged before the disk
//!   filled and every cell run while host 3 was down, exactly once, in order;
//! - `notebookos_state_dir_free_bytes` showed the filesystem's room while it ran.
//!
//! Needs root (mount); skips elsewhere unless `NBOS_REQUIRE_PRIVILEGED=1`.

mod required;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nbos_test_support::cell_client::{executed_revision, CellClient, CellRun};
use nbos_test_support::{wait_for, Options, TestCluster, TOKEN};
use notebookosd::link::client::GatewayClient;

const CELL_TIMEOUT: Duration = Duration::from_secs(90);

/// A tmpfs mounted for the test's life (lazily unmounted on drop, even after a panic).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).expect("mount point");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "nbos-full-disk"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(dir.to_owned()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Writes random bytes into `path` until the filesystem refuses (ENOSPC); the bytes written.
fn fill(path: &Path) -> u64 {
    let mut f = std::fs::File::create(path).expect("filler");
    let mut chunk = vec![0u8; 1 << 20];
    getrandom::fill(&mut chunk).expect("random");
    let mut written = 0u64;
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    let _ = f.sync_all();
    written
}

fn gateway(c: &TestCluster, host: u64) -> GatewayClient {
    let ca = c.dir().join("pki/ca.pem");
    GatewayClient::new(&c.host(host).url, Some(TOKEN.to_owned()))
        .with_tls(notebookosd::link::tls::client_config(&ca, None).expect("tls"))
}

fn ok(run: &CellRun) -> bool {
    run.reply.get("status").and_then(|s| s.as_str()) == Some("ok")
}

fn metric(c: &TestCluster, host: u64, name: &str) -> Option<f64> {
    let ca = c.dir().join("pki/ca.pem");
    let agent =
        ureq::AgentBuilder::new().tls_config(notebookosd::link::tls::client_config(&ca, None).expect("tls")).build();
    let text = agent.get(&format!("{}/metrics", c.host(host).url)).call().ok()?.into_string().ok()?;
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[test]
fn a_host_whose_state_disk_fills_stops_and_catches_up_once_space_returns() {
    const TEST: &str = "a_host_whose_state_disk_fills_stops_and_catches_up_once_space_returns";
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        required::cannot_run(TEST, "mounting a small filesystem needs root");
        return;
    }
    let mut c =
        TestCluster::create_tls(3, Options { fake_gpus: 1, host_ttl: Duration::from_secs(1), ..Options::default() });
    let state3 = c.host(3).dir.join("state");
    let Some(_disk) = Tmpfs::mount(&state3, "64m") else {
        required::cannot_run(TEST, "mount -t tmpfs failed");
        return;
    };
    for id in 1..=3 {
        c.restart(id);
    }
    c.wait_ready(&[1, 2, 3], Duration::from_secs(60));
    let free = metric(&c, 3, "notebookos_state_dir_free_bytes").expect("notebookos_state_dir_free_bytes on host 3");
    assert!(free > 0.0 && free <= 64.0 * 1024.0 * 1024.0, "host 3's state dir is the 64 MiB tmpfs: {free}");

    let (code, model) = c.post(1, "/api/kernels", serde_json::json!({ "name": "python3", "gpus": 0 }));
    assert_eq!(code, 201, "create: {model}\n{}", c.logs());
    let kernel = model["id"].as_str().expect("id").to_owned();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        // Through host 3's gateway: pre-selection prefers the gateway's own replica.
        let mut client = CellClient::connect(&gateway(&c, 3), &kernel).await.expect("connect");
        let run = client.run("acked = ['before']", CELL_TIMEOUT).await.expect("cell");
        assert!(ok(&run), "{run:?}");
        assert_eq!(run.reply_metadata["nbos_election"]["node_id"], 3, "host 3 executes: {run:?}");

        let filled = fill(&state3.join("filler"));
        eprintln!("filled host 3's state directory with {} MiB", filled >> 20);
        // Each cell commits ~900 KB of incompressible namespace to the kernel's raft group
        // (inline: under cluster.sync_inline_max_bytes), so host 3's log write soon fails.
        // Acknowledged cells, cells refused as not synchronised, and cells whose outcome the
        // client never learnt (ExecutorHostDied, or the gateway died with the host).
        let (mut cells, mut acked, mut not_synced, mut unknown) = (0, Vec::new(), Vec::new(), Vec::new());
        let status = loop {
            if let Some(status) = c.wait_exit(3, Duration::from_millis(200)) {
                break status;
            }
            assert!(cells < 40, "host 3 still runs after {cells} cells on a full disk:\n{}", c.host(3).log());
            let code = format!("import os\nblob{cells} = os.urandom(900_000)\nacked.append({cells})");
            match client.run(&code, CELL_TIMEOUT).await {
                Ok(run) if ok(&run) => acked.push(cells),
                Ok(run) => match run.reply["ename"].as_str() {
                    Some("NamespaceSyncFailed") => not_synced.push(cells),
                    Some("ExecutorHostDied") => unknown.push(cells),
                    _ => panic!("cell {cells}: an error that does not say whether the cell counted: {run:?}"),
                },
                // Host 3's gateway went down with it: the client moves to host 1's.
                Err(_) => {
                    unknown.push(cells);
                    client = CellClient::connect(&gateway(&c, 1), &kernel).await.expect("reconnect");
                }
            }
            cells += 1;
        };
        eprintln!(
            "while the disk was full: acknowledged {acked:?}, not synchronised {not_synced:?}, unknown {unknown:?}"
        );
        // Host 3 (and its gateway) is gone.
        client = CellClient::connect(&gateway(&c, 1), &kernel).await.expect("reconnect");
        let log = c.host(3).log();
        assert_eq!(status.code(), Some(1), "host 3 exits with status 1 ({status}):\n{log}");
        assert!(log.contains("raft log write failed"), "the reason is logged:\n{log}");
        assert!(log.contains("No space left on device"), "the OS error is named:\n{log}");
        assert!(log.contains("This host stopped (fail-stop"), "what happened and what to do:\n{log}");
        wait_for(Duration::from_secs(30), "host 3's kernel processes to be gone", || {
            c.kernel_pids(3).is_empty().then_some(())
        });

        // The kernel goes on with hosts 1 and 2.
        for i in 0..3 {
            let run = client.run(&format!("acked.append('down{i}')"), CELL_TIMEOUT).await.expect("cell");
            assert!(ok(&run), "cell {i} with host 3 down: {run:?}");
        }

        // Space returns: host 3 starts on its own state directory and catches up.
        std::fs::remove_file(state3.join("filler")).expect("remove the filler");
        c.restart(3);
        c.wait_ready(&[1, 2, 3], Duration::from_secs(60));
        let log = c.host(3).log();
        assert!(log.contains("meta group recovered from the durable log"), "host 3 recovered its log:\n{log}");
        let run = client.run("import json\nprint(json.dumps(acked))", CELL_TIMEOUT).await.expect("cell");
        assert!(ok(&run), "{run:?}");
        let got: Vec<serde_json::Value> = serde_json::from_str(run.stdout.trim()).expect("the list as JSON");
        let ints: Vec<i64> = got.iter().filter_map(serde_json::Value::as_i64).collect();
        let words: Vec<&str> = got.iter().filter_map(serde_json::Value::as_str).collect();
        assert_eq!(words, ["before", "down0", "down1", "down2"], "{got:?}");
        assert!(ints.windows(2).all(|w| w[0] < w[1]), "each cell once, in order: {got:?}");
        for i in &acked {
            assert!(ints.contains(&(*i as i64)), "acknowledged cell {i} is in the namespace: {got:?}");
        }
        for i in &not_synced {
            assert!(!ints.contains(&(*i as i64)), "cell {i} answered NamespaceSyncFailed yet counts: {got:?}");
        }
        for i in &ints {
            assert!(
                acked.contains(&(*i as usize)) || unknown.contains(&(*i as usize)),
                "cell {i} was refused: {got:?}"
            );
        }
        // Host 3's own replica is back and caught up: it applied the last cell's revision
        // and its namespace digest equals the others'.
        let rev = executed_revision(&run).expect("the cell's revision");
        wait_for(Duration::from_secs(90), "host 3's replica to apply the last revision", || {
            let (code, v) = c.get(3, "/api/v1/cluster/replicas");
            (code == 200
                && v.as_array().is_some_and(|a| {
                    a.iter().any(|r| {
                        r["kernel_id"] == kernel.as_str() && r["applied_revision"].as_u64().is_some_and(|a| a >= rev)
                    })
                }))
            .then_some(())
        });
        let digests: Vec<String> = (1..=3)
            .map(|h| {
                let (code, v) = c.get(h, &format!("/api/v1/cluster/kernels/{kernel}/digest"));
                assert_eq!(code, 200, "digest on host {h}: {v}");
                v["digest"].as_str().expect("digest").to_owned()
            })
            .collect();
        assert!(digests.iter().all(|d| *d == digests[0]), "every replica's namespace is the same: {digests:?}");
    });
}
