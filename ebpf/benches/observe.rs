//! `cargo bench -p nbos-ebpf --bench observe`: what the observer adds per launch on the production
//! path, printed as the same JSON object as `nbos bench observe --json`. A child process
//! (`nbos-observe-loop`) runs 100,000-launch loops under the real CUDA shim
//! (`libnbos_cuda_shim.so`, a dev-dependency, `LD_PRELOAD`ed, unmanaged: the lease server is the
//! daemon's, see `nbos bench observe`) over tests/fake-cuda built with the bench (release)
//! profile; rounds alternate observed and unobserved loops. Under `cargo test --benches` it runs
//! one small round as a smoke test. `NBOS_BENCH_LIBRARY` picks another driver library,
//! `NBOS_BENCH_SYNC_EVERY` the launches per synchronisation (default 100), `NBOS_BENCH_LAUNCHES`
//! the loop length, `NBOS_BENCH_ROUNDS` the rounds (default 21).

use std::path::PathBuf;
use std::process::ExitCode;

use nbos_ebpf::bench::{run, BenchOptions, ChildCommand, ShimEnv};

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
    let Some(shim) = beside_bench("libnbos_cuda_shim.so") else {
        eprintln!("observe bench: libnbos_cuda_shim.so not found next to the bench binary");
        return ExitCode::FAILURE;
    };
    let scratch = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("observe bench: scratch directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    let shim_env = match ShimEnv::unmanaged(&shim, &library, scratch.path()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("observe bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut env = shim_env.env;
    env.push(("FAKE_CUDA_STATE_DIR".into(), scratch.path().join("fake-cuda").into_os_string()));
    let var = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let (launches, sync_every, rounds) = if full {
        (var("NBOS_BENCH_LAUNCHES", 100_000), var("NBOS_BENCH_SYNC_EVERY", 100), var("NBOS_BENCH_ROUNDS", 21))
    } else {
        (1_000, 100, 1)
    };
    let opts = BenchOptions {
        library,
        child: ChildCommand { program: env!("CARGO_BIN_EXE_nbos-observe-loop").into(), args: Vec::new() },
        env,
        counters_dir: shim_env.counters_dir,
        launches,
        sync_every,
        rounds: usize::try_from(rounds).unwrap_or(21),
    };
    match run(&opts, &mut |_| Ok(())) {
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
