//! `nbos bench kernel-start --run-as owner`: a replica's start (create → first cell
//! answered) on one host with `kernel.run_as = "owner"` beside the shared `kernel.user`,
//! each from the pre-warm pool and from a new Python (docs/prewarm.md, "Kernels that run
//! as their owners").
//!
//! Kernels are created in this process through the daemon's kernel table
//! (`Kernels::create` with an owner, what the gateway's create handler calls), because the
//! HTTP API names no owner until users are configured; the first cell is the daemon's own
//! silent request (`1 + 1`), so these figures leave out the HTTP and WebSocket hops that
//! the other setups include. Root only: it makes (once, then reuses) the account
//! [`BENCH_OWNER`].

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use notebookosd::config::{KernelConfig, RunAs};
use notebookosd::kernel::binding::{Binder, LogOnlyLeases};
use notebookosd::kernel::identity::{self, KernelUsers};
use notebookosd::kernel::sandbox::{self, Sandbox};
use notebookosd::kernel::Kernels;
use notebookosd::metrics::{Metrics, PrewarmTakeLabels, StateLabels};
use serde::Serialize;

use crate::stats::{percentile, round3};

/// The account the owner's kernels run as.
pub const BENCH_OWNER: &str = "nbos-bench-owner";
const CELL_TIMEOUT: Duration = Duration::from_secs(120);
const REFILL_TIMEOUT: Duration = Duration::from_secs(120);

/// p50/p99 of one account mode, with and without the pool, ms.
#[derive(Debug, Serialize)]
pub struct ModeTimes {
    /// New Python every time: p50.
    pub cold_p50_ms: f64,
    /// New Python every time: p99.
    pub cold_p99_ms: f64,
    /// From the pool: p50.
    pub pool_p50_ms: f64,
    /// From the pool: p99.
    pub pool_p99_ms: f64,
    /// Takes that found a ready process.
    pub pool_hits: u64,
}

/// The result.
#[derive(Debug, Serialize)]
pub struct OwnerStartBench {
    /// Kernels started in each mode.
    pub samples: usize,
    /// Every kernel as `kernel.user`.
    pub kernel_user: ModeTimes,
    /// Every kernel as [`BENCH_OWNER`] (`kernel.run_as = "owner"`).
    pub owner: ModeTimes,
}

/// Runs both account modes, each without and with a pool of `pool`, `samples` kernels each.
pub fn run(python: &Path, samples: usize, pool: u32, pid_namespace: bool, json: bool) -> anyhow::Result<()> {
    anyhow::ensure!(identity::daemon_is_root(), "--run-as owner runs kernels as another account: run it as root");
    ensure_account()?;
    let python = std::path::absolute(python).context("resolving --python")?;
    sandbox::configure(Sandbox {
        open_files_max: Some(notebookosd::config::DEFAULT_KERNEL_OPEN_FILES_MAX),
        nproc_max: Some(notebookosd::config::DEFAULT_KERNEL_NPROC_MAX),
        shm_bytes: Some(notebookosd::config::DEFAULT_KERNEL_SHM_SIZE_MIB << 20),
        home_quota_bytes: None,
        limit_address_space: false,
        pid_namespace: pid_namespace && notebookosd::sys::pid_namespace::supported(),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    let result = runtime.block_on(async {
        let kernel_user = mode(&python, RunAs::KernelUser, None, samples, pool, json).await?;
        let owner = mode(&python, RunAs::Owner, Some(BENCH_OWNER), samples, pool, json).await?;
        anyhow::Ok(OwnerStartBench { samples, kernel_user, owner })
    })?;
    if json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        println!(
            "kernel start on one host, create -> first (internal) cell answered, in process, {samples} samples each, pool of {pool}:"
        );
        for (what, t) in [("run_as = kernel_user", &result.kernel_user), ("run_as = owner", &result.owner)] {
            println!(
                "  {what:<22} new Python p50 {:.1} ms p99 {:.1} ms | pre-warmed p50 {:.1} ms p99 {:.1} ms ({} pool hits)",
                t.cold_p50_ms, t.cold_p99_ms, t.pool_p50_ms, t.pool_p99_ms, t.pool_hits
            );
        }
    }
    Ok(())
}

/// One account mode: without the pool, then with it.
async fn mode(
    python: &Path,
    run_as: RunAs,
    owner: Option<&str>,
    samples: usize,
    pool: u32,
    json: bool,
) -> anyhow::Result<ModeTimes> {
    let (mut cold, _) = measure(python, run_as, owner, samples, 0, json).await?;
    let (mut warm, hits) = measure(python, run_as, owner, samples, pool, json).await?;
    Ok(ModeTimes {
        cold_p50_ms: round3(percentile(&mut cold, 50.0)),
        cold_p99_ms: round3(percentile(&mut cold, 99.0)),
        pool_p50_ms: round3(percentile(&mut warm, 50.0)),
        pool_p99_ms: round3(percentile(&mut warm, 99.0)),
        pool_hits: hits,
    })
}

/// `samples` starts on a fresh kernel table with a pool of `pool` (0: none), refilled
/// before each; returns the times (ms) and the pool's hits.
async fn measure(
    python: &Path,
    run_as: RunAs,
    owner: Option<&str>,
    samples: usize,
    pool: u32,
    json: bool,
) -> anyhow::Result<(Vec<f64>, u64)> {
    let dir = tempfile::Builder::new().prefix("nbos-bench-owner-").tempdir()?;
    // The kernels' uids pass through to their own directories (node/kernels_dir.rs).
    set_mode(dir.path(), 0o711)?;
    let kernels_dir = dir.path().join("kernels");
    std::fs::create_dir(&kernels_dir)?;
    set_mode(&kernels_dir, 0o711)?;
    let cfg = KernelConfig { run_as, ..KernelConfig::default() };
    let users = KernelUsers::from_config(&cfg, true)?;
    let metrics = Arc::new(Metrics::new());
    let binder = Binder::new(0, Duration::from_secs(60), 1.0, Arc::new(LogOnlyLeases), metrics.clone());
    let kernels = Kernels::new(python.to_owned(), kernels_dir, Vec::new(), metrics.clone(), binder, 0)
        .with_accounts(users, None, 0)
        .with_prewarm(pool, pool)?;
    let what = format!("{run_as:?} kernel starts, {}", if pool > 0 { "pool" } else { "no pool" });
    let bar = crate::progress::bar(json, samples, &what);
    let owner = owner.map(|name| notebookosd::users::User { name: name.to_owned(), groups: Vec::new() });
    let mut times = Vec::with_capacity(samples);
    for i in 0..samples {
        if pool > 0 {
            let deadline = Instant::now() + REFILL_TIMEOUT;
            let ready = || metrics.prewarm_pool_processes.get_or_create(&StateLabels { state: "ready".into() }).get();
            while ready() < i64::from(pool) {
                anyhow::ensure!(Instant::now() < deadline, "the pool did not refill to {pool} in {REFILL_TIMEOUT:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let started = Instant::now();
        let kernel = kernels.create(None, None, &[], owner.as_ref()).await.with_context(|| format!("sample {i}"))?;
        kernel
            .run_internal("1 + 1", &serde_json::json!({}), CELL_TIMEOUT)
            .await
            .with_context(|| format!("sample {i}: the first cell"))?;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
        kernels.remove(&kernel.id).await;
        bar.inc(1);
    }
    bar.finish_and_clear();
    let hits = metrics.prewarm_takes_total.get_or_create(&PrewarmTakeLabels { result: "hit".into() }).get();
    kernels.shutdown_all().await;
    Ok((times, hits))
}

/// Makes [`BENCH_OWNER`] unless it exists, a regular account (uid >= 1000,
/// `kernel.owner_uid_min`'s default: a system account is refused); one made below it is
/// made again.
fn ensure_account() -> anyhow::Result<()> {
    let known =
        std::process::Command::new("getent").args(["passwd", BENCH_OWNER]).output().context("running getent")?;
    if known.status.success() {
        // name:x:uid:gid:...
        let line = String::from_utf8_lossy(&known.stdout);
        let uid: u32 = line
            .split(':')
            .nth(2)
            .and_then(|u| u.trim().parse().ok())
            .with_context(|| format!("getent passwd {BENCH_OWNER} gave no uid: {line:?}"))?;
        if uid >= 1000 {
            return Ok(());
        }
        let status = std::process::Command::new("userdel")
            .args(["--remove", BENCH_OWNER])
            .status()
            .context("running userdel")?;
        anyhow::ensure!(status.success(), "userdel {BENCH_OWNER} (uid {uid} < 1000) failed: {status}");
    }
    let status = std::process::Command::new("useradd")
        .args(["--create-home", "--shell", "/usr/sbin/nologin", BENCH_OWNER])
        .status()
        .context("running useradd")?;
    anyhow::ensure!(status.success(), "useradd {BENCH_OWNER} failed: {status}");
    Ok(())
}

fn set_mode(path: &Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {mode:o} {}", path.display()))
}
