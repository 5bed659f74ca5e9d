//! `nbos bench observe`: the price of observation per probed call and on a launch-heavy loop
//! (by default 100,000 launches through the CUDA shim and tests/fake-cuda), observer attached
//! vs detached, measured in one run (see `nbos_ebpf::bench`).

use std::path::PathBuf;

use anyhow::Context;
use nbos_ebpf::bench::{BenchOptions, BenchReport};

/// Options of `nbos bench observe`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Driver library to call and probe; default: tests/fake-cuda's `libfake_cuda.so` next to
    /// this executable (a development build).
    #[arg(long)]
    pub library: Option<PathBuf>,
    /// CUDA shim to call through (run unmanaged, forwarding to `--library`); default:
    /// libnbos_cuda_shim.so next to this executable.
    #[arg(long, conflicts_with = "no_shim")]
    pub shim: Option<PathBuf>,
    /// Call the driver library directly, without the shim.
    #[arg(long)]
    pub no_shim: bool,
    /// Launches per timed loop.
    #[arg(long, default_value_t = 100_000)]
    pub launches: u64,
    /// One `cuCtxSynchronize` every this many launches (0: none).
    #[arg(long, default_value_t = 100)]
    pub sync_every: u64,
    /// Rounds; each figure is the median over rounds.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
}

/// `libfake_cuda.so` beside the running `nbos` (target/debug or target/release).
fn default_library() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the nbos executable")?;
    let dir = exe.parent().context("nbos executable has no directory")?;
    [dir.join("libfake_cuda.so"), dir.join("deps/libfake_cuda.so")].into_iter().find(|p| p.exists()).with_context(
        || {
            format!(
                "no libfake_cuda.so next to {}: build it (cargo build -p fake-cuda) or pass --library",
                exe.display()
            )
        },
    )
}

/// `libnbos_cuda_shim.so` beside the running `nbos`.
fn default_shim() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the nbos executable")?;
    let shim = exe.parent().context("nbos executable has no directory")?.join("libnbos_cuda_shim.so");
    anyhow::ensure!(
        shim.exists(),
        "no {}: build it (cargo build -p nbos-cuda-shim), pass --shim PATH, or --no-shim",
        shim.display()
    );
    Ok(shim)
}

/// Runs the benchmark.
pub fn run(args: Args) -> anyhow::Result<()> {
    let Args { json, library, shim, no_shim, launches, sync_every, rounds } = args;
    let library = match library {
        Some(l) => std::path::absolute(&l).with_context(|| format!("resolving {}", l.display()))?,
        None => default_library()?,
    };
    let shim = match (shim, no_shim) {
        (_, true) => None,
        (Some(s), false) => Some(s),
        (None, false) => Some(default_shim()?),
    };
    let report = nbos_ebpf::bench::run(&BenchOptions { library, shim, launches, sync_every, rounds })
        .context("benchmarking the GPU activity observer")?;
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", human(&report));
    }
    Ok(())
}

fn opt(v: Option<f64>, unit: &str) -> String {
    v.map_or_else(|| "n/a (no eBPF)".to_owned(), |v| format!("{v:.1} {unit}"))
}

fn human(r: &BenchReport) -> String {
    format!(
        "observer bench ({mode} mode), {launches} launches + {syncs} syncs per loop through {shim}{lib}, median of {rounds}\n\
         bare loop:                         {bare:.1} ns/launch\n\
         shim counters-file update:         {counter:+.1} ns/launch (paid with or without observer)\n\
         detached baseline (shim counting): {det:.1} ns/launch\n\
         observer attached (design):        {des:.1} ns/launch, {pct:+.2}% wall time\n\
         uprobes on every call:             {all} ({allpct})\n\
         uprobe cost per hit:               {cost}\n",
        mode = r.mode,
        launches = r.launches,
        syncs = r.syncs,
        lib = r.library.display(),
        shim = r.shim.as_ref().map_or_else(String::new, |s| format!("{} -> ", s.display())),
        rounds = r.rounds,
        bare = r.bare_ns_per_launch,
        counter = r.shim_counter_ns_per_launch,
        det = r.detached_ns_per_launch,
        des = r.designed_ns_per_launch,
        pct = r.launch_loop_overhead_pct,
        all = opt(r.all_probes_ns_per_launch, "ns/launch"),
        allpct = opt(r.all_probes_overhead_pct, "%"),
        cost = opt(r.uprobe_cost_ns, "ns"),
    )
}
