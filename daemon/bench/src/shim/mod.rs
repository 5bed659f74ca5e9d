//! `nbos bench shim`: what the CUDA shim costs a kernel process, measured in one run.
//!
//! The shim runs as kernels get it: a child process (this executable again, with the
//! hidden `--child` flag) started with the environment the daemon gives kernel processes
//! ([`ShimEnvironment::prepare`]: the shim copied to a private `libcuda.so.1`, first on
//! `LD_LIBRARY_PATH` and in `LD_PRELOAD`, `NBOS_LEASE_SOCKET`, and
//! `NBOS_SHIM_COUNTERS_DIR`, so every counted call bumps the counters file), registered
//! with a lease server (the daemon's own code, in this process) whose activity interval
//! is the daemon's ([`shim_env::ACTIVITY_INTERVAL`]). The driver is the fake-cuda TEST
//! DOUBLE next to this executable unless `--driver` names another; the shim is
//! `libnbos_cuda_shim.so` next to this executable unless `--shim` names another.
//!
//! What is measured (all in the child, with a lease held, one context current):
//!
//! - **Added ns per call** (`launch_*`, `memcpy_*`): `--batches` pairs; each pair times
//!   the same loop of `--batch` calls (`cuLaunchKernel` of an empty kernel, or a 4-byte
//!   `cuMemcpyHtoDAsync_v2`) once straight into the driver (`dlsym` on the driver's own
//!   handle) and once through the shim (`dlopen("libcuda.so.1")`, as cudart finds it),
//!   back to back, the order alternating between pairs; an untimed `cuCtxSynchronize`
//!   follows each loop so queued work never throttles submission. `*_added_ns_p50` is the
//!   median over pairs of (shim − direct) ns per call; `*_direct_ns_p50` and
//!   `*_shim_ns_p50` are the medians of each side, and `*_ratio` their quotient.
//! - **Lease acquire** (`lease_acquire_*`): `--acquire-rounds` times, the host revokes
//!   the lease and waits for the release; then the child times one `cuCtxSynchronize`
//!   through the shim, which blocks, asks for a lease, and returns once granted. First with
//!   memory left resident, then (test double only, `*_restore_*`) with the child's 4 KiB
//!   of device memory checkpointed at each revoke and restored before each grant.
//! - **Evict / restore bandwidth** (test double only): the child holds `--evict-mib` MiB;
//!   three times, revoke + checkpoint timed by the host, then the blocked call that
//!   restores it timed by the child. GiB/s = size / median time.
//!
//! Build with `--release` for meaningful figures (the JSON says which build ran).
//!
//! This file is the host's side (the lease server, the child driven over stdin/stdout);
//! [`child`] is the child's, [`cuda`] the driver entry points both open.

mod child;
mod cuda;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;

use self::child::{child_main, Overhead, Setup};
use self::cuda::Lib;

use crate::stats::percentile;
use notebookosd::config::{GpuConfig, GpuDriver};
use notebookosd::gpu::checkpoint::DriverCheckpoint;
use notebookosd::gpu::control::GpuControl;
use notebookosd::gpu::inventory::fake_gpu_uuid;
use notebookosd::gpu::GpuInfo;
use notebookosd::kernel::shim_env::{self, ShimEnvironment};
use notebookosd::lease::metrics::LeaseMetrics;
use notebookosd::lease::table::Policy;
use notebookosd::lease::{LeaseServer, LeaseServerConfig, LeaseState, RegisteredProcess};

/// Options of `nbos bench shim`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// The CUDA driver (full path); default: libfake_cuda.so next to this executable.
    #[arg(long)]
    pub driver: Option<PathBuf>,
    /// The shim; default: libnbos_cuda_shim.so next to this executable.
    #[arg(long)]
    pub shim: Option<PathBuf>,
    /// Calls per timed loop.
    #[arg(long, default_value_t = 2000)]
    pub batch: u32,
    /// Pairs of timed loops (direct and through the shim) per call measured.
    #[arg(long, default_value_t = 200)]
    pub batches: u32,
    /// Revoke/acquire cycles. 1,000 so that p99 is not the second-worst of a handful of
    /// samples (at 200 a single VM vCPU wake-up of a few ms decides it).
    #[arg(long, default_value_t = 1000)]
    pub acquire_rounds: u32,
    /// Device memory held while measuring eviction and restore, MiB.
    #[arg(long, default_value_t = 256)]
    pub evict_mib: u64,
    /// Write every lease-acquire sample (no checkpoint) to this file as
    /// `<start CLOCK_MONOTONIC ns> <duration ns>` lines, to line slow ones up with a
    /// scheduler trace (`perf sched record -k mono`).
    #[arg(long)]
    pub acquire_trace: Option<PathBuf>,
    /// Internal: run as the benchmark's kernel process (commands on stdin).
    #[arg(long, hide = true)]
    pub child: bool,
}

/// The figures.
#[derive(Debug, Serialize)]
pub struct Report {
    /// `fake` or the real driver's version (`cuDriverGetVersion`).
    pub driver: String,
    /// `release` or `debug`.
    pub build: &'static str,
    /// Median ns per cuLaunchKernel straight into the driver.
    pub launch_direct_ns_p50: f64,
    /// Median ns per cuLaunchKernel through the shim, lease held.
    pub launch_shim_ns_p50: f64,
    /// Added ns per leased cuLaunchKernel: median of the paired differences.
    pub launch_added_ns_p50: f64,
    /// shim / direct (medians).
    pub launch_ratio: f64,
    /// Median ns per cuMemcpyHtoDAsync_v2 (4 bytes) straight into the driver.
    pub memcpy_direct_ns_p50: f64,
    /// Median ns per cuMemcpyHtoDAsync_v2 through the shim.
    pub memcpy_shim_ns_p50: f64,
    /// Added ns per leased cuMemcpyHtoDAsync_v2: median of the paired differences.
    pub memcpy_added_ns_p50: f64,
    /// shim / direct (medians).
    pub memcpy_ratio: f64,
    /// Launches the child's counters file recorded (the shim counted as in a kernel).
    pub counted_launches: Option<u64>,
    /// Blocked call → lease granted → call returned, median µs.
    pub lease_acquire_p50_us: f64,
    /// Same, 99th percentile.
    pub lease_acquire_p99_us: f64,
    /// Blocked call → restore of the checkpointed (4 KiB) memory → grant, median µs (test double only).
    pub lease_acquire_restore_p50_us: Option<f64>,
    /// Same, 99th percentile.
    pub lease_acquire_restore_p99_us: Option<f64>,
    /// Eviction (revoke + checkpoint) bandwidth, GiB/s (null without the checkpoint API).
    pub evict_gib_s: Option<f64>,
    /// Restore (blocked call → restore → grant) bandwidth, GiB/s.
    pub restore_gib_s: Option<f64>,
    /// MiB held during the eviction measurement.
    pub evict_mib: u64,
}

/// Per-call figures of one call kind, as the child reports them.
fn beside_exe(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating this executable")?;
    let dir = exe.parent().context("executable has no directory")?;
    Ok(dir.join(name))
}

/// Revokes `pid`'s current lease and waits until the host has released (and evicted) it.
/// The published status lags the shim by a moment, so first wait for the lease to show
/// as bound, then for that very lease to show as unbound.
fn revoke_and_wait(server: &LeaseServer, pid: u32) -> anyhow::Result<()> {
    let mut lease = 0;
    let bound = server.wait_until(Duration::from_secs(60), |s| {
        s.iter().any(|p| {
            let hit = p.pid == pid && p.state == LeaseState::Bound;
            if hit {
                lease = p.lease;
            }
            hit
        })
    });
    if !bound {
        bail!("lease never showed as bound: {:?}", server.status());
    }
    server.revoke(pid);
    let released = server.wait_until(Duration::from_secs(60), |s| {
        s.iter().any(|p| p.pid == pid && p.lease == lease && p.state == LeaseState::Unbound)
    });
    if !released {
        bail!("revocation did not complete: {:?}", server.status());
    }
    Ok(())
}

/// The benchmark's kernel process, killed if the benchmark ends early.
struct KernelChild {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl KernelChild {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends one command and reads its one-line answer (an `error ...` line is an error).
    fn ask(&mut self, command: &str) -> anyhow::Result<String> {
        writeln!(self.stdin, "{command}").context("writing to the benchmark's kernel process")?;
        self.stdin.flush().context("writing to the benchmark's kernel process")?;
        let mut line = String::new();
        let n = self.stdout.read_line(&mut line).context("reading from the benchmark's kernel process")?;
        if n == 0 {
            bail!("the benchmark's kernel process exited during `{command}` (its stderr is above)");
        }
        let line = line.trim_end().to_owned();
        if let Some(e) = line.strip_prefix("error ") {
            bail!("`{command}` in the benchmark's kernel process: {e}");
        }
        Ok(line)
    }

    /// Times one blocking gated call in the child: (start CLOCK_MONOTONIC ns, duration ns).
    fn timed_call(&mut self) -> anyhow::Result<(u64, u64)> {
        let line = self.ask("call")?;
        let mut it = line.split_whitespace().map(str::parse::<u64>);
        match (it.next(), it.next()) {
            (Some(Ok(t)), Some(Ok(d))) => Ok((t, d)),
            _ => bail!("unexpected answer to `call`: {line:?}"),
        }
    }
}

impl Drop for KernelChild {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "exit");
        let _ = self.stdin.flush();
        // A child stuck in a blocked call does not read `exit`.
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Revoke, wait for the release, then have the child time a blocked gated call until it
/// returns: (start ns, duration ns) per round.
fn acquire_cycles(server: &LeaseServer, child: &mut KernelChild, rounds: u32) -> anyhow::Result<Vec<(u64, u64)>> {
    let mut out = Vec::with_capacity(rounds as usize);
    for _ in 0..rounds {
        revoke_and_wait(server, child.pid())?;
        out.push(child.timed_call()?);
    }
    Ok(out)
}

fn micros(samples: &[(u64, u64)]) -> Vec<f64> {
    samples.iter().map(|(_, d)| *d as f64 / 1e3).collect()
}

/// Runs the benchmark (or, with `--child`, its kernel process).
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.child {
        return child_main();
    }
    let progress = crate::progress::stages(args.json, "bench shim:");
    progress.set_message("launch, copy, lease and eviction cycles in a child process");
    let report = measure(&args)?;
    progress.finish_and_clear();
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("driver                  {} ({} build)", report.driver, report.build);
        println!(
            "cuLaunchKernel          direct {:.1} ns, shim {:.1} ns: +{:.1} ns (x{:.2}; median of paired differences)",
            report.launch_direct_ns_p50, report.launch_shim_ns_p50, report.launch_added_ns_p50, report.launch_ratio
        );
        println!(
            "cuMemcpyHtoDAsync       direct {:.1} ns, shim {:.1} ns: +{:.1} ns (x{:.2}; median of paired differences)",
            report.memcpy_direct_ns_p50, report.memcpy_shim_ns_p50, report.memcpy_added_ns_p50, report.memcpy_ratio
        );
        println!(
            "lease acquire           p50 {:.1} µs, p99 {:.1} µs (with restore: p50 {:?} µs, p99 {:?} µs)",
            report.lease_acquire_p50_us,
            report.lease_acquire_p99_us,
            report.lease_acquire_restore_p50_us,
            report.lease_acquire_restore_p99_us
        );
        match (report.evict_gib_s, report.restore_gib_s) {
            (Some(e), Some(r)) => {
                println!("evict / restore         {e:.2} / {r:.2} GiB/s ({} MiB)", report.evict_mib)
            }
            _ => println!("evict / restore         n/a (no checkpoint API in this driver)"),
        }
    }
    Ok(())
}

fn measure(args: &Args) -> anyhow::Result<Report> {
    let shim_path = match &args.shim {
        Some(p) => p.clone(),
        None => beside_exe(shim_env::SHIM_FILE)?,
    };
    let driver_path = match &args.driver {
        Some(p) => p.clone(),
        None => beside_exe(shim_env::FAKE_DRIVER_FILE)?,
    };
    for p in [&shim_path, &driver_path] {
        if !p.exists() {
            bail!("{} does not exist (build the workspace, or pass --shim/--driver)", p.display());
        }
    }
    // Opened here only to tell the test double from a real driver (and, for the test
    // double, to checkpoint the child): the child loads it through the shim. Loading it
    // reads no settings yet (the test double reads FAKE_CUDA_* at its first call).
    let fake = Lib::open(&driver_path)?.has(c"fakeCudaIsTestDouble");
    let dir = tempfile::tempdir().context("creating a scratch directory")?;
    let socket = dir.path().join("lease.sock");
    let gpu_mib = args.evict_mib * 2 + 64;
    let gpu_cfg = GpuConfig {
        driver: if fake { GpuDriver::Fake } else { GpuDriver::Nvidia },
        cuda_driver_path: Some(driver_path.clone()),
        shim_library: Some(shim_path),
        fake_gpus: 2,
        fake_gpu_memory_mib: gpu_mib,
        ..GpuConfig::default()
    };
    // The kernel processes' environment, exactly as the daemon builds it.
    let shim = ShimEnvironment::prepare(&gpu_cfg, dir.path(), &socket)?;
    // Set before any thread exists (the CLI is single-threaded until here): this process's
    // copy of the test double reads them once, and must see the child's simulated GPUs.
    for (key, value) in shim.fake_env() {
        std::env::set_var(key, value);
    }
    let metrics = LeaseMetrics::default();
    let api: Option<Box<dyn notebookosd::gpu::checkpoint::CheckpointApi>> =
        if fake { Some(Box::new(DriverCheckpoint::load(&driver_path)?)) } else { None };
    let control = GpuControl::new(api, metrics.clone());
    let gpus: Vec<GpuInfo> = if fake {
        (0..2)
            .map(|index| GpuInfo {
                index,
                uuid: fake_gpu_uuid(index),
                name: "bench".into(),
                memory_mib: gpu_mib,
                simulated: true,
            })
            .collect()
    } else {
        // Grants name GPUs by UUID: a real driver's must come from the host's inventory.
        notebookosd::gpu::inventory::nvml_inventory(None)
            .map_err(|e| anyhow::anyhow!("listing the GPUs through NVML: {e}"))?
            .gpus
    };
    let cfg = LeaseServerConfig {
        socket,
        policy: Policy { idle_grace: Duration::from_secs(3600), idle_release: Duration::from_secs(3600) },
        activity_interval: shim_env::ACTIVITY_INTERVAL,
        memory_limit_bytes: 0,
        driver_path: driver_path.clone(),
    };
    let server = LeaseServer::start(cfg, gpus, control, metrics).context("starting the lease server")?;

    let exe = std::env::current_exe().context("locating this executable")?;
    let mut cmd = Command::new(&exe);
    cmd.args(["bench", "shim", "--child"])
        .envs(shim.env.iter().map(|(k, v)| (k, v)))
        .env("NBOS_KERNEL_ID", "bench")
        .env("NBOS_REPLICA", "0")
        // For the child's own dlopen of the driver (the shim, under the lease server, ignores
        // it: the server names the driver in `Registered`).
        .env("NBOS_CUDA_DRIVER", &driver_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut spawned = cmd.spawn().with_context(|| format!("starting {} bench shim --child", exe.display()))?;
    let (Some(stdin), Some(stdout)) = (spawned.stdin.take(), spawned.stdout.take()) else {
        let _ = spawned.kill();
        let _ = spawned.wait();
        bail!("the benchmark's kernel process has no pipes");
    };
    let mut child = KernelChild { child: spawned, stdin, stdout: BufReader::new(stdout) };
    let pid = child.pid();
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    // Registered before the child's first driver call (`setup`), as the daemon does.
    server.register_process(RegisteredProcess { kernel_id: "bench".into(), replica: 0, pid, uid, gpus: 1 });

    let setup: Setup = serde_json::from_str(&child.ask("setup")?).context("the child's setup answer")?;
    let launch: Overhead = serde_json::from_str(&child.ask(&format!("launch {} {}", args.batch, args.batches))?)
        .context("the child's launch figures")?;
    let copy: Overhead = serde_json::from_str(&child.ask(&format!("memcpy {} {}", args.batch, args.batches))?)
        .context("the child's memcpy figures")?;
    let counted_launches = nbos_ebpf::shim_counters::read(&shim.counters_dir, pid).map(|c| c.launches);

    // Lease protocol alone (memory left resident), then with checkpoint and restore of
    // the child's (small) device memory in every cycle.
    server.set_checkpointing(false);
    let samples = acquire_cycles(&server, &mut child, args.acquire_rounds)?;
    if let Some(path) = &args.acquire_trace {
        let text: String = samples.iter().map(|(t, d)| format!("{t} {d}\n")).collect();
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    let mut acquire = micros(&samples);
    server.set_checkpointing(true);
    let mut acquire_restore =
        if fake { micros(&acquire_cycles(&server, &mut child, args.acquire_rounds)?) } else { Vec::new() };

    let (mut evict_gib_s, mut restore_gib_s) = (None, None);
    if fake {
        let bytes = args.evict_mib << 20;
        child.ask(&format!("hold {bytes}"))?;
        let (mut ev, mut re) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let t = Instant::now();
            revoke_and_wait(&server, pid)?;
            ev.push(t.elapsed().as_secs_f64());
            re.push(child.timed_call()?.1 as f64 / 1e9);
        }
        let gib = bytes as f64 / f64::from(1u32 << 30);
        evict_gib_s = Some(gib / percentile(&mut ev, 50.0));
        restore_gib_s = Some(gib / percentile(&mut re, 50.0));
        child.ask("release")?;
    }
    drop(child);
    drop(server);
    Ok(Report {
        driver: if setup.fake {
            "fake".into()
        } else {
            format!("{}.{}", setup.version / 1000, (setup.version % 1000) / 10)
        },
        build: if cfg!(debug_assertions) { "debug" } else { "release" },
        launch_direct_ns_p50: launch.direct_p50,
        launch_shim_ns_p50: launch.shim_p50,
        launch_added_ns_p50: launch.added_p50,
        launch_ratio: launch.shim_p50 / launch.direct_p50,
        memcpy_direct_ns_p50: copy.direct_p50,
        memcpy_shim_ns_p50: copy.shim_p50,
        memcpy_added_ns_p50: copy.added_p50,
        memcpy_ratio: copy.shim_p50 / copy.direct_p50,
        counted_launches,
        lease_acquire_p50_us: percentile(&mut acquire, 50.0),
        lease_acquire_p99_us: percentile(&mut acquire, 99.0),
        lease_acquire_restore_p50_us: fake.then(|| percentile(&mut acquire_restore, 50.0)),
        lease_acquire_restore_p99_us: fake.then(|| percentile(&mut acquire_restore, 99.0)),
        evict_gib_s,
        restore_gib_s,
        evict_mib: args.evict_mib,
    })
}
