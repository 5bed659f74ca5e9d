//! `nbos bench observe`: what the GPU activity observer adds per kernel launch on the production
//! path, measured in one run.
//!
//! A child process (this executable again, `bench observe --child`) runs the launch loop of
//! `nbos_ebpf::bench::child_main` with the environment the daemon gives kernel processes
//! ([`ShimEnvironment::prepare`]: the CUDA shim as `libcuda.so.1` in `LD_PRELOAD`,
//! `NBOS_SHIM_COUNTERS_DIR`, `NBOS_LEASE_SOCKET`), registered with a lease server (the
//! daemon's code, in this process, which names the driver in its `Registered` reply) whose activity interval is the daemon's
//! ([`shim_env::ACTIVITY_INTERVAL`]), so the shim holds a lease and reports activity as in a
//! kernel. Rounds time the same loop with the observer attached as the node starts it (eBPF:
//! launch counts from the counters file, uprobes on the driver's copy, memset and synchronise
//! entry points) and without it, alternately; `added_ns_per_launch` is the median of the paired
//! differences. The driver is the fake-cuda TEST DOUBLE next to this executable unless
//! `--library` names another.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use nbos_ebpf::bench::{BenchError, BenchOptions, BenchReport, ChildCommand};

use notebookosd::config::{GpuConfig, GpuDriver};
use notebookosd::gpu::control::GpuControl;
use notebookosd::gpu::inventory::fake_gpu_uuid;
use notebookosd::gpu::GpuInfo;
use notebookosd::kernel::shim_env::{self, ShimEnvironment};
use notebookosd::lease::metrics::LeaseMetrics;
use notebookosd::lease::table::Policy;
use notebookosd::lease::{LeaseServer, LeaseServerConfig, RegisteredProcess};

/// Options of `nbos bench observe`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Driver library the shim forwards to and the observer probes; default: tests/fake-cuda's
    /// `libfake_cuda.so` next to this executable (a development build).
    #[arg(long)]
    pub library: Option<PathBuf>,
    /// The CUDA shim; default: libnbos_cuda_shim.so next to this executable.
    #[arg(long)]
    pub shim: Option<PathBuf>,
    /// Launches per timed loop.
    #[arg(long, default_value_t = 100_000)]
    pub launches: u64,
    /// One `cuCtxSynchronize` every this many launches (0: none).
    #[arg(long, default_value_t = 100)]
    pub sync_every: u64,
    /// Rounds (pairs of observed and unobserved loops); figures are medians over rounds.
    #[arg(long, default_value_t = 21)]
    pub rounds: usize,
    /// Internal: run as the benchmark's kernel process (commands on stdin).
    #[arg(long, hide = true)]
    pub child: bool,
}

/// `name` beside the running `nbos` (or in its `deps/`, where cargo puts test cdylibs).
fn beside_exe(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the nbos executable")?;
    let dir = exe.parent().context("nbos executable has no directory")?;
    [dir.join(name), dir.join("deps").join(name)].into_iter().find(|p| p.exists()).with_context(|| {
        format!("no {name} next to {}: build the workspace, or pass --library / --shim", exe.display())
    })
}

/// Whether `path` is the fake-cuda TEST DOUBLE (it exports `fakeCudaIsTestDouble`).
fn is_test_double(path: &Path) -> anyhow::Result<bool> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .with_context(|| format!("{}: NUL in path", path.display()))?;
    // SAFETY: a valid C string; the driver's initialisers (fake or real) have no preconditions
    // and it is loaded by the bench's child anyway.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    anyhow::ensure!(!handle.is_null(), "{}: cannot be loaded", path.display());
    // SAFETY: a live handle from dlopen and a NUL-terminated name.
    let fake = !unsafe { libc::dlsym(handle, c"fakeCudaIsTestDouble".as_ptr()) }.is_null();
    // SAFETY: the handle came from dlopen above and no symbol from it is kept.
    unsafe { libc::dlclose(handle) };
    Ok(fake)
}

/// Runs the benchmark (or, with `--child`, its kernel process).
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.child {
        match nbos_ebpf::bench::child_main() {
            0 => return Ok(()),
            code => anyhow::bail!("the benchmark's loop failed (exit status {code})"),
        }
    }
    let json = args.json;
    let progress = crate::progress::stages(json, "bench observe:");
    progress.set_message("the observer's overhead on a launch loop, and its detection delay");
    let report = measure(&args)?;
    progress.finish_and_clear();
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", human(&report));
    }
    Ok(())
}

fn measure(args: &Args) -> anyhow::Result<BenchReport> {
    let driver = match &args.library {
        Some(l) => std::path::absolute(l).with_context(|| format!("resolving {}", l.display()))?,
        None => beside_exe(shim_env::FAKE_DRIVER_FILE)?,
    };
    let shim = match &args.shim {
        Some(s) => s.clone(),
        None => beside_exe(shim_env::SHIM_FILE)?,
    };
    anyhow::ensure!(driver.is_file(), "{}: no such driver library", driver.display());
    let fake = is_test_double(&driver)?;
    let dir = tempfile::tempdir().context("creating a scratch directory")?;
    let socket = dir.path().join("lease.sock");
    let gpu_cfg = GpuConfig {
        driver: if fake { GpuDriver::Fake } else { GpuDriver::Nvidia },
        cuda_driver_path: Some(driver.clone()),
        shim_library: Some(shim),
        fake_gpus: 1,
        ..GpuConfig::default()
    };
    // The kernel processes' environment, exactly as the daemon builds it.
    let shim_env = ShimEnvironment::prepare(&gpu_cfg, dir.path(), &socket)?;
    let metrics = LeaseMetrics::default();
    let gpus: Vec<GpuInfo> = if fake {
        vec![GpuInfo {
            index: 0,
            uuid: fake_gpu_uuid(0),
            name: "bench".into(),
            memory_mib: gpu_cfg.fake_gpu_memory_mib,
            simulated: true,
        }]
    } else {
        notebookosd::gpu::inventory::nvml_inventory(None)
            .map_err(|e| anyhow::anyhow!("listing the GPUs through NVML: {e}"))?
            .gpus
    };
    let cfg = LeaseServerConfig {
        socket,
        // The lease stays with the child between loops (the observer starts in between): this
        // bench measures the loop, not lease turnover.
        policy: Policy { idle_grace: Duration::from_secs(3600), idle_release: Duration::from_secs(3600) },
        activity_interval: shim_env::ACTIVITY_INTERVAL,
        memory_limit_bytes: 0,
        driver_path: shim_env.driver.clone(),
    };
    let server = LeaseServer::start(cfg, gpus, GpuControl::new(None, metrics.clone()), metrics)
        .context("starting the lease server")?;
    let exe = std::env::current_exe().context("locating this executable")?;
    let mut env: Vec<(std::ffi::OsString, std::ffi::OsString)> =
        shim_env.env.iter().map(|(k, v)| (k.into(), v.into())).collect();
    env.push(("NBOS_KERNEL_ID".into(), "bench-observe".into()));
    env.push(("NBOS_REPLICA".into(), "0".into()));
    let opts = BenchOptions {
        library: driver,
        child: ChildCommand { program: exe, args: vec!["bench".into(), "observe".into(), "--child".into()] },
        env,
        counters_dir: shim_env.counters_dir.clone(),
        launches: args.launches,
        sync_every: args.sync_every,
        rounds: args.rounds,
    };
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    // Registered before the child's first driver call, as the daemon does.
    let mut register = |pid: u32| -> Result<(), BenchError> {
        server.register_process(RegisteredProcess { kernel_id: "bench-observe".into(), replica: 0, pid, uid, gpus: 1 });
        Ok(())
    };
    let report = nbos_ebpf::bench::run(&opts, &mut register).context("benchmarking the GPU activity observer")?;
    drop(server);
    Ok(report)
}

fn human(r: &BenchReport) -> String {
    format!(
        "observer bench ({mode} mode, {probes} uprobes), {launches} launches + {syncs} syncs per loop in a child\n\
         under {shim} ({managed}) -> {lib}, median of {rounds} paired rounds\n\
         unobserved:                 {un:.1} ns/launch\n\
         observed (daemon's design): {ob:.1} ns/launch\n\
         added by observation:       {add:+.1} ns/launch ({pct:+.2} %)\n\
         per probed call (uprobe):   {cost}\n\
         launches counted:           {counted}\n\
         exit -> exit event:         {exit_ms:.2} ms\n",
        mode = r.mode,
        probes = r.probes,
        launches = r.launches,
        syncs = r.syncs,
        shim = r.shim.as_ref().map_or_else(|| "?".to_owned(), |s| s.display().to_string()),
        managed = if r.managed { "lease held, activity reports on" } else { "unmanaged" },
        lib = r.library.display(),
        rounds = r.rounds,
        un = r.unobserved_ns_per_launch,
        ob = r.observed_ns_per_launch,
        add = r.added_ns_per_launch,
        pct = r.added_pct,
        cost = r.uprobe_cost_ns.map_or_else(|| "n/a".to_owned(), |c| format!("{c:.0} ns")),
        counted = r.counted_launches,
        exit_ms = r.exit_event_ms,
    )
}
