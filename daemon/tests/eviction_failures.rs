//! Evictions and restores that fail, end to end: a daemon with simulated GPUs (the
//! fake-cuda TEST DOUBLE, its faults injected at runtime through
//! `run/fake-cuda/faults/<op>`), real ipykernel kernels whose cells put memory on the GPU
//! through the CUDA shim, and what an operator sees.
//!
//! - An eviction whose lock times out, whose checkpoint fails, or whose checkpoint leaves
//!   the memory on the GPU fences the GPU: the next kernel's cell waits (one GPU) or runs
//!   on another GPU (two), `nbos status`, `/api/v1/status` and `notebookos_gpus_fenced`
//!   say so with the reason, and the GPU is granted again once the memory is gone (its
//!   kernel shut down), or to its own kernel, whose memory is still there.
//! - A restore that fails leaves the kernel's cell waiting (its process locked, its memory
//!   off the GPU) and retried, never running without its memory; once the restore works
//!   the cell runs on its own data.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use nbos_test_support::{bins, http, run_cell, start_daemon, wait_for, wait_until, CellOutcome, Daemon, TOKEN};
use serde_json::Value;

/// Generous: the waits below end as soon as what they wait for holds.
const WAIT: Duration = Duration::from_secs(30);

/// Puts 64 Ki floats of 2.0 on the GPU and keeps them in the kernel's namespace.
const ALLOCATE: &str =
    "from nbos_kernel import gpu\ndev = gpu.open_device()\nbuf = dev.buffer(1 << 16, 2.0)\ndev.sum(buf)";
/// Sums them again on the device: needs the kernel's memory back on a GPU.
const SUM_AGAIN: &str = "dev.sum(buf)";
/// What both print.
const SUM: &str = "131072.0";

fn start(gpus: u32, idle_release: Option<Duration>) -> Daemon {
    start_daemon(&[], Stdio::inherit(), |c| {
        c.fake_gpus(gpus).config.kernel.prewarm_max = 0;
        if let Some(after) = idle_release {
            c.idle_release(after);
        }
    })
}

/// Creates a 1-GPU kernel: its id and process id.
fn create_kernel(d: &Daemon) -> (String, u32) {
    let body = r#"{"name":"notebookos-python-1gpu"}"#;
    let (code, text) = http("POST", &format!("{}/api/kernels", d.url), Some(TOKEN), Some(body));
    assert_eq!(code, 201, "{text}");
    let model: Value = serde_json::from_str(&text).expect("json");
    let pid = model["pids"][0].as_u64().and_then(|p| u32::try_from(p).ok()).expect("pid");
    (model["id"].as_str().expect("id").to_owned(), pid)
}

fn delete_kernel(d: &Daemon, id: &str) {
    assert_eq!(http("DELETE", &format!("{}/api/kernels/{id}", d.url), Some(TOKEN), None).0, 204, "delete {id}");
}

fn get_json(d: &Daemon, path: &str) -> Value {
    let (code, text) = http("GET", &format!("{}{path}", d.url), Some(TOKEN), None);
    assert_eq!(code, 200, "{path}: {text}");
    serde_json::from_str(&text).expect("json")
}

/// The fake driver's fault file for `op` (`lock`, `checkpoint`, `restore`).
fn fault_file(d: &Daemon, op: &str) -> PathBuf {
    d.dir().join("run/fake-cuda/faults").join(op)
}

fn inject(d: &Daemon, op: &str, fault: &str) {
    let path = fault_file(d, op);
    std::fs::create_dir_all(path.parent().expect("faults dir")).expect("create faults dir");
    std::fs::write(&path, fault).expect("write fault");
}

fn clear(d: &Daemon, op: &str) {
    std::fs::remove_file(fault_file(d, op)).expect("remove fault");
}

/// The value of series `series` (name and labels as exposed) on `/metrics`, 0 if absent.
fn metric(d: &Daemon, series: &str) -> f64 {
    let (code, text) = http("GET", &format!("{}/metrics", d.url), None, None);
    assert_eq!(code, 200);
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

fn nbos_status(d: &Daemon) -> String {
    let out =
        Command::new(bins::nbos()).args(["--url", &d.url, "status"]).env("NBOS_TOKEN", TOKEN).output().expect("nbos");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until GPU `gpu` is fenced with `kernel`'s memory for `reason`, and checks that
/// every view an operator has says so.
fn expect_fenced(d: &Daemon, gpu: u64, kernel: &str, reason: &str) {
    let fenced = wait_for(WAIT, "the GPU fenced in /api/v1/status", || {
        let s = get_json(d, "/api/v1/status");
        let f = s["fenced_gpus"].as_array().cloned().unwrap_or_default();
        (!f.is_empty()).then_some(f)
    });
    assert_eq!(fenced.len(), 1, "{fenced:?}");
    assert_eq!((fenced[0]["index"].as_u64(), fenced[0]["reason"].as_str()), (Some(gpu), Some(reason)), "{fenced:?}");
    assert_eq!(fenced[0]["kernel_id"], kernel, "{fenced:?}");
    let table = nbos_status(d);
    let row = table.lines().find(|l| l.contains(&format!("8000-{gpu:012x}"))).unwrap_or_default();
    assert!(row.contains(&format!("FENCED ({reason}: memory of kernel {kernel}")), "{table}");
    assert_eq!(metric(d, "notebookos_gpus_fenced"), 1.0);
    let failures = format!("notebookos_gpu_eviction_failures_total{{reason=\"{reason}\"}}");
    assert!(metric(d, &failures) >= 1.0, "{failures}");
}

fn expect_unfenced(d: &Daemon) {
    wait_until("the fence lifted", WAIT, || get_json(d, "/api/v1/status")["fenced_gpus"] == serde_json::json!([]));
    assert_eq!(metric(d, "notebookos_gpus_fenced"), 0.0);
    assert!(!nbos_status(d).contains("FENCED"));
}

/// One GPU: kernel A's memory is on it; kernel B's cell needs it, so A is revoked and its
/// eviction fails by `fault` on `op`. B's cell waits on the fenced GPU until A is shut
/// down (its memory gone), then runs.
async fn one_gpu_waits_until_the_memory_is_gone(op: &str, fault: &str, reason: &str) {
    let d = start(1, None);
    let url = d.url.clone();
    let ((a, _), (b, b_pid)) = tokio::task::block_in_place(|| (create_kernel(&d), create_kernel(&d)));
    assert_eq!(run_cell(&url, TOKEN, &a, ALLOCATE).await.value(), SUM);
    tokio::task::block_in_place(|| inject(&d, op, fault));

    let (u, bb) = (url.clone(), b.clone());
    let b_cell = tokio::spawn(async move { run_cell(&u, TOKEN, &bb, ALLOCATE).await });
    tokio::task::block_in_place(|| {
        expect_fenced(&d, 0, &a, reason);
        // B's process asked for the GPU and was not granted it.
        wait_until("B's process waiting for a lease", WAIT, || {
            let leases = get_json(&d, "/api/v1/leases");
            leases.as_array().into_iter().flatten().any(|l| l["pid"] == b_pid && l["state"] == "requested")
        });
    });
    assert!(!b_cell.is_finished(), "B's cell ran on a GPU holding A's memory");

    // The memory goes with A's process: the GPU comes back and B's cell runs.
    tokio::task::block_in_place(|| {
        clear(&d, op);
        delete_kernel(&d, &a);
        expect_unfenced(&d);
    });
    let out: CellOutcome = tokio::time::timeout(WAIT, b_cell).await.expect("B's cell in time").expect("join");
    assert_eq!(out.value(), SUM, "{out:?}");
    tokio::task::block_in_place(|| delete_kernel(&d, &b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_lock_that_times_out_fences_the_gpu_until_the_memory_is_gone() {
    one_gpu_waits_until_the_memory_is_gone("lock", "timeout", "lock_timeout").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_that_leaves_memory_behind_fences_the_gpu_until_the_memory_is_gone() {
    one_gpu_waits_until_the_memory_is_gone("checkpoint", "leave", "memory_left").await;
}

/// Two GPUs: A's GPU is released after the idle time and its checkpoint fails. B's cell
/// goes to the other GPU; A's next cell gets its own GPU back with its memory intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_checkpoint_fences_the_gpu_others_take_another_and_its_kernel_gets_it_back() {
    let d = start(2, Some(Duration::from_secs(1)));
    let url = d.url.clone();
    let ((a, _), (b, _)) = tokio::task::block_in_place(|| (create_kernel(&d), create_kernel(&d)));
    tokio::task::block_in_place(|| inject(&d, "checkpoint", "fail"));
    assert_eq!(run_cell(&url, TOKEN, &a, ALLOCATE).await.value(), SUM);
    tokio::task::block_in_place(|| {
        expect_fenced(&d, 0, &a, "checkpoint_failed");
        // The binder gives the GPU to no other kernel's cell (it syncs every second).
        wait_until("the binder to see the fence", WAIT, || {
            get_json(&d, "/api/v1/gpus")["holders"][0] == format!("fenced:{a}")
        });
        clear(&d, "checkpoint");
    });

    let b_cell = run_cell(&url, TOKEN, &b, ALLOCATE).await;
    assert_eq!(b_cell.value(), SUM);
    tokio::task::block_in_place(|| {
        let leases = get_json(&d, "/api/v1/leases");
        let gpus: Vec<&Value> = leases.as_array().into_iter().flatten().map(|l| &l["gpus"]).collect();
        assert!(gpus.iter().all(|g| *g != &serde_json::json!([0])), "a lease on the fenced GPU: {leases}");
        assert_eq!(metric(&d, "notebookos_gpus_fenced"), 1.0, "still A's memory on GPU 0");
    });
    // A's memory never left GPU 0: its next cell runs there on it.
    assert_eq!(run_cell(&url, TOKEN, &a, SUM_AGAIN).await.value(), SUM);
    // Its next eviction (idle release) succeeds: the memory is gone from the GPU.
    tokio::task::block_in_place(|| {
        expect_unfenced(&d);
        wait_until("A's memory checkpointed off GPU 0", WAIT, || {
            metric(&d, "notebookos_gpu_evictions_total{mode=\"checkpoint\"}") >= 2.0
        });
        assert_eq!(metric(&d, "notebookos_gpus_fenced"), 0.0);
        delete_kernel(&d, &a);
        delete_kernel(&d, &b);
    });
}

/// One GPU: A's memory was checkpointed off for B; A's next cell needs it back, and the
/// restore fails. The cell waits (it does not run without its memory), the failures are
/// shown and counted, and once restores work again the cell runs on A's own data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_restore_keeps_the_cell_waiting_until_its_memory_is_back() {
    let d = start(1, None);
    let url = d.url.clone();
    let ((a, a_pid), (b, _)) = tokio::task::block_in_place(|| (create_kernel(&d), create_kernel(&d)));
    assert_eq!(run_cell(&url, TOKEN, &a, ALLOCATE).await.value(), SUM);
    assert_eq!(run_cell(&url, TOKEN, &b, ALLOCATE).await.value(), SUM, "A checkpointed off the GPU for B");
    tokio::task::block_in_place(|| inject(&d, "restore", "fail"));

    let (u, aa) = (url.clone(), a.clone());
    let a_cell = tokio::spawn(async move { run_cell(&u, TOKEN, &aa, SUM_AGAIN).await });
    tokio::task::block_in_place(|| {
        wait_until("A's restore failing (and retried)", WAIT, || {
            let leases = get_json(&d, "/api/v1/leases");
            leases
                .as_array()
                .into_iter()
                .flatten()
                .any(|l| l["pid"] == a_pid && l["state"] == "requested" && l["restore_failures"].as_u64() >= Some(2))
        });
        assert!(metric(&d, "notebookos_gpu_restore_failures_total") >= 2.0);
        assert_eq!(metric(&d, "notebookos_gpus_fenced"), 0.0, "B's memory was checkpointed: nothing fenced");
    });
    assert!(!a_cell.is_finished(), "A's cell ran without its GPU memory");

    tokio::task::block_in_place(|| clear(&d, "restore"));
    let out: CellOutcome = tokio::time::timeout(WAIT, a_cell).await.expect("A's cell in time").expect("join");
    assert_eq!(out.value(), SUM, "A's own data after the restore: {out:?}");
    tokio::task::block_in_place(|| {
        let leases = get_json(&d, "/api/v1/leases");
        let a_lease = leases.as_array().into_iter().flatten().find(|l| l["pid"] == a_pid).cloned();
        assert_eq!(a_lease.map(|l| l["restore_failures"].clone()), Some(serde_json::json!(0)), "{leases}");
        delete_kernel(&d, &a);
        delete_kernel(&d, &b);
    });
}
