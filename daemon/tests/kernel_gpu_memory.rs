//! A kernel's own GPU memory limit, through the daemon as a Jupyter client uses it: the
//! request carries `KERNEL_GPU_MEMORY_MIB` (or `gpu_memory_mib`), bad values are a clear
//! 400, the REST model and `nbos kernels` show the limit, and a cell allocating through
//! the CUDA shim (ctypes, the fake-cuda TEST DOUBLE as the driver) gets
//! `CUDA_ERROR_OUT_OF_MEMORY` over it and memory under it.

use std::process::{Command, Stdio};

use nbos_test_support::{bins, http, run_cell, start_daemon, TOKEN};

/// Allocates 3 MiB, then 1 MiB, through the shim: prints the three CUresults.
const CELL: &str = r#"import ctypes
cu = ctypes.CDLL("libcuda.so.1")
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cu.cuCtxSetCurrent(ctx) == 0
over = cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(3 << 20))
under = cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 20))
free, total = ctypes.c_size_t(), ctypes.c_size_t()
cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
f"over={over} under={under} total={total.value}""#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_created_with_a_gpu_memory_limit_is_held_to_it_and_shows_it() {
    let d = start_daemon(&[], Stdio::inherit(), |c| {
        c.fake_gpus(1).config.gpu.fake_gpu_memory_mib = 64;
    });
    let url = d.url.clone();
    let u = url.clone();
    let kernel = tokio::task::spawn_blocking(move || {
        let create = |body: &str| http("POST", &format!("{u}/api/kernels"), Some(TOKEN), Some(body));
        // Bad limits are refused, saying why, before any kernel starts.
        for (body, says) in [
            (r#"{"name":"notebookos-python-1gpu","gpu_memory_mib":0}"#, "at least 1 MiB"),
            (r#"{"name":"notebookos-python-1gpu","gpu_memory_mib":-3}"#, "at least 1 MiB"),
            (r#"{"name":"notebookos-python-1gpu","gpu_memory_mib":99999999999}"#, "more than any GPU set has"),
            (r#"{"name":"notebookos-python-1gpu","env":{"KERNEL_GPU_MEMORY_MIB":"lots"}}"#, "whole number of MiB"),
        ] {
            let (code, text) = create(body);
            assert_eq!(code, 400, "{body}: {text}");
            assert!(text.contains(says) && text.contains("KERNEL_GPU_MEMORY_MIB"), "{body}: {text}");
        }
        let (code, list) = http("GET", &format!("{u}/api/kernels"), Some(TOKEN), None);
        assert_eq!((code, list.as_str()), (200, "[]"), "nothing was started");

        // The Enterprise Gateway convention: a KERNEL_* variable in the request's env.
        let (code, body) =
            create(r#"{"name":"notebookos-python-1gpu","env":{"KERNEL_GPU_MEMORY_MIB":"2","KERNEL_USERNAME":"t"}}"#);
        assert_eq!(code, 201, "{body}");
        let model: serde_json::Value = serde_json::from_str(&body).expect("json");
        assert_eq!(model["gpu_memory_mib"], 2, "{model}");
        let id = model["id"].as_str().expect("id").to_owned();
        let (code, body) = http("GET", &format!("{u}/api/kernels/{id}"), Some(TOKEN), None);
        assert_eq!(code, 200);
        let got: serde_json::Value = serde_json::from_str(&body).expect("json");
        assert_eq!(got["gpu_memory_mib"], 2, "{got}");
        id
    })
    .await
    .expect("join");

    // `nbos kernels` shows it, in the table and in JSON.
    let out =
        Command::new(bins::nbos()).args(["--url", &url, "kernels"]).env("NBOS_TOKEN", TOKEN).output().expect("nbos");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    let header = table.lines().next().unwrap_or_default();
    let row = table.lines().find(|l| l.starts_with(&kernel)).unwrap_or_else(|| panic!("no row for {kernel}:\n{table}"));
    let column = header.find("gpu mem/MiB").expect("a GPU memory column") + "gpu mem/MiB".len();
    assert_eq!(row.get(..column).map(|s| s.trim_end().rsplit(' ').next()), Some(Some("2")), "{table}");
    let out = Command::new(bins::nbos())
        .args(["--url", &url, "kernels", "--json"])
        .env("NBOS_TOKEN", TOKEN)
        .output()
        .expect("nbos");
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(all["kernels"][0]["gpu_memory_mib"], 2, "{all}");

    // A cell allocating through the shim: over 2 MiB is CUDA_ERROR_OUT_OF_MEMORY (2), under
    // it succeeds, and the driver's view of the GPU is the limit.
    let cell = run_cell(&url, TOKEN, &kernel, CELL).await;
    assert_eq!(cell.status, "ok", "{cell:?}");
    assert_eq!(cell.result.as_deref(), Some(format!("'over=2 under=0 total={}'", 2 << 20).as_str()));
}
