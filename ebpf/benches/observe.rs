//! `cargo bench -p nbos-ebpf --bench observe`: the observer's price on a 100,000-launch loop
//! through tests/fake-cuda built with the bench (release) profile, printed as the same JSON
//! object as `nbos bench observe --json`. Under `cargo test --benches` it runs one small round
//! as a smoke test. The loops call through the CUDA shim (`libnbos_cuda_shim.so`, built as a
//! dev-dependency; `NBOS_BENCH_NO_SHIM=1` calls the driver directly). `NBOS_BENCH_LIBRARY` picks
//! another driver library, `NBOS_BENCH_SYNC_EVERY` the launches per synchronisation (default
//! 100), `NBOS_BENCH_LAUNCHES` the loop length.

use std::path::PathBuf;
use std::process::ExitCode;

use nbos_ebpf::bench::{run, BenchOptions};

fn beside_bench(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    [deps.join(name), deps.parent()?.join(name)].into_iter().find(|p| p.exists())
}

fn library() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NBOS_BENCH_LIBRARY") {
        return std::path::absolute(PathBuf::from(p)).ok();
    }
    beside_bench("libfake_cuda.so")
}

fn main() -> ExitCode {
    let full = std::env::args().any(|a| a == "--bench");
    let Some(library) = library() else {
        eprintln!("observe bench: libfake_cuda.so not found next to the bench binary; set NBOS_BENCH_LIBRARY");
        return ExitCode::FAILURE;
    };
    let shim = if std::env::var("NBOS_BENCH_NO_SHIM").as_deref() == Ok("1") {
        None
    } else {
        let Some(shim) = beside_bench("libnbos_cuda_shim.so") else {
            eprintln!(
                "observe bench: libnbos_cuda_shim.so not found next to the bench binary; NBOS_BENCH_NO_SHIM=1 skips it"
            );
            return ExitCode::FAILURE;
        };
        Some(shim)
    };
    let env = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let opts = if full {
        let (launches, sync_every) = (env("NBOS_BENCH_LAUNCHES", 100_000), env("NBOS_BENCH_SYNC_EVERY", 100));
        BenchOptions { library, shim, launches, sync_every, rounds: 11 }
    } else {
        BenchOptions { library, shim, launches: 1_000, sync_every: 100, rounds: 1 }
    };
    match run(&opts) {
        Ok(report) => {
            match serde_json::to_string(&report) {
                Ok(json) => println!("{json}"),
                Err(e) => eprintln!("observe bench: encoding the report: {e}"),
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("observe bench: {e}");
            ExitCode::FAILURE
        }
    }
}
