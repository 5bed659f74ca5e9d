//! `nbos bench cell`: the round trip of a trivial cell (`execute_request` until
//! its `execute_reply` and the kernel's `idle` status) through the gateway
//! (REST + WebSocket, as JupyterLab talks to it) and straight to an ipykernel
//! over ZMQ, in the same run on the same machine, interleaved so both see the
//! same load. Reports p50/p99 of each and what the gateway adds.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message as WsFrame;

use crate::stats::{percentile, round3};
use notebookosd::jupyter::{ws, Channel, Message};
use notebookosd::kernel::connection::ConnectionInfo;
use notebookosd::kernel::hub::{Hub, Outgoing};
use notebookosd::kernel::identity::{self, KernelUsers};
use notebookosd::kernel::ipykernel::Ipykernel;
use notebookosd::kernel::process::LaunchSpec;
use notebookosd::link::client::GatewayClient;
use notebookosd::link::token::read_token_file;
use notebookosd::metrics::Metrics;

/// Options of `nbos bench cell`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Measured cells per path.
    #[arg(long, default_value_t = 300)]
    pub cells: usize,
    /// Unmeasured warm-up cells per path.
    #[arg(long, default_value_t = 30)]
    pub warmup: usize,
    /// Python with ipykernel, for the direct kernel and the daemon's kernel.
    #[arg(long, default_value = "python3")]
    pub python: PathBuf,
    /// Use this running gateway instead of starting a temporary notebookosd.
    #[arg(long)]
    pub url: Option<String>,
    /// Token file for `--url`.
    #[arg(long, value_name = "FILE", requires = "url")]
    pub token_file: Option<PathBuf>,
    /// The cell's code.
    #[arg(long, default_value = "pass")]
    pub code: String,
}

/// Results, in milliseconds.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CellBench {
    /// Median round trip through the gateway.
    pub gateway_p50_ms: f64,
    /// 99th percentile through the gateway.
    pub gateway_p99_ms: f64,
    /// Median round trip straight to ipykernel.
    pub direct_p50_ms: f64,
    /// 99th percentile straight to ipykernel.
    pub direct_p99_ms: f64,
    /// `gateway_p50_ms - direct_p50_ms`.
    pub added_p50_ms: f64,
    /// `gateway_p99_ms - direct_p99_ms`.
    pub added_p99_ms: f64,
    /// Cells measured per path.
    pub cells: usize,
    /// The gateway measured.
    pub gateway_url: String,
}

/// Runs the benchmark.
pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.cells >= 10, "--cells must be at least 10 for a p99 to mean anything");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    let result = runtime.block_on(bench(&args))?;
    if args.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        println!("trivial cell round trip ({} cells per path, code {:?})", result.cells, args.code);
        println!(
            "  gateway ({}):  p50 {:.3} ms  p99 {:.3} ms",
            result.gateway_url, result.gateway_p50_ms, result.gateway_p99_ms
        );
        println!("  direct ZMQ:      p50 {:.3} ms  p99 {:.3} ms", result.direct_p50_ms, result.direct_p99_ms);
        println!("  added by the gateway: p50 {:.3} ms  p99 {:.3} ms", result.added_p50_ms, result.added_p99_ms);
    }
    Ok(())
}

/// A temporary daemon for the benchmark, stopped on drop.
struct TempDaemon {
    child: std::process::Child,
    _dir: tempfile::TempDir,
    url: String,
}

impl Drop for TempDaemon {
    fn drop(&mut self) {
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill(2) with our own child's pid, which we have not reaped yet.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let _ = self.child.wait();
    }
}

fn start_daemon(python: &std::path::Path) -> anyhow::Result<TempDaemon> {
    let exe = std::env::current_exe().context("finding nbos")?;
    let daemon = exe.with_file_name("notebookosd");
    anyhow::ensure!(daemon.exists(), "notebookosd is not next to nbos ({})", daemon.display());
    let dir = tempfile::Builder::new().prefix("nbos-bench-cell-").tempdir()?;
    // The daemon's kernels run as another uid (kernel.user) and must pass through it.
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o711))?;
    let python = if python.components().count() > 1 { std::path::absolute(python)? } else { python.to_owned() };
    let config = dir.path().join("notebookosd.toml");
    std::fs::write(
        &config,
        format!(
            "[node]\nname = \"bench\"\nstate_dir = {:?}\nruntime_dir = {:?}\n[http]\nlisten = \"127.0.0.1:0\"\n\
             allow_unauthenticated_loopback = true\n[kernel]\npython = {:?}\n[log]\nlevel = \"warn\"\n",
            dir.path().join("state"),
            dir.path().join("run"),
            python
        ),
    )?;
    let child = std::process::Command::new(&daemon)
        .arg("--config")
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", daemon.display()))?;
    let endpoint = dir.path().join("run").join(notebookosd::link::endpoint::ENDPOINT_FILE);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut d = TempDaemon { child, _dir: dir, url: String::new() };
    loop {
        if let Some(e) = std::fs::read_to_string(&endpoint)
            .ok()
            .and_then(|t| serde_json::from_str::<notebookosd::link::endpoint::Endpoint>(&t).ok())
        {
            d.url = e.url;
            return Ok(d);
        }
        if let Some(status) = d.child.try_wait()? {
            anyhow::bail!("the temporary notebookosd exited: {status}");
        }
        anyhow::ensure!(Instant::now() < deadline, "the temporary notebookosd did not start in 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn execute_request(code: &str) -> Message {
    Message::new(
        "execute_request",
        "bench",
        &uuid::Uuid::new_v4().to_string(),
        SystemTime::now(),
        None,
        &serde_json::json!({ "code": code, "silent": false, "store_history": false }),
    )
}

fn is_idle_for(channel: Channel, msg: &Message, msg_id: &str) -> (bool, bool) {
    let parent: Option<String> = serde_json::from_slice::<serde_json::Value>(&msg.parent_header)
        .ok()
        .and_then(|v| v.get("msg_id").and_then(|m| m.as_str()).map(str::to_owned));
    if parent.as_deref() != Some(msg_id) {
        return (false, false);
    }
    let ty = msg.header().map(|h| h.msg_type).unwrap_or_default();
    let reply = channel == Channel::Shell && ty == "execute_reply";
    let idle = channel == Channel::Iopub
        && ty == "status"
        && msg.content_json().ok().and_then(|c| c.get("execution_state").cloned()) == Some("idle".into());
    (reply, idle)
}

async fn bench(args: &Args) -> anyhow::Result<CellBench> {
    // The gateway path.
    let temp;
    let gateway = match &args.url {
        Some(u) => GatewayClient::new(u, args.token_file.as_deref().map(read_token_file).transpose()?),
        None => {
            temp = start_daemon(&args.python)?;
            GatewayClient::new(&temp.url, None)
        }
    };
    let g = gateway.clone();
    let model =
        tokio::task::spawn_blocking(move || g.create_kernel(notebookosd::kernel::spec::DEFAULT_SPEC, None)).await??;
    let socket = gateway.connect_channels(&model.id, true).await?;
    let (mut ws_tx, mut ws_rx) = socket.split();

    // The direct path: our own ipykernel, our own ZMQ sockets, no gateway.
    let dir = tempfile::Builder::new().prefix("nbos-bench-direct-").tempdir()?;
    let hub = Arc::new(Hub::new("starting", SystemTime::now()));
    // A relative interpreter path would be resolved in the kernel's directory.
    let python = if args.python.components().count() > 1 {
        std::path::absolute(&args.python).context("resolving --python")?
    } else {
        args.python.clone()
    };
    // As the daemon's kernels run: never as root (the shipped kernel.user when we are root).
    let users = KernelUsers::from_config(&notebookosd::config::KernelConfig::default(), identity::daemon_is_root())?;
    let launch = LaunchSpec {
        python,
        dir: dir.path().to_owned(),
        identity: users.acquire("bench-direct", None)?,
        ..Default::default()
    };
    let replica =
        Ipykernel::start(0, &launch, ConnectionInfo::new_loopback("bench")?, hub.clone(), Arc::new(Metrics::new()))
            .await?;
    let (client, mut direct_rx, _) = hub.connect();

    let mut gateway_ms = Vec::with_capacity(args.cells);
    let mut direct_ms = Vec::with_capacity(args.cells);
    let bar = crate::progress::bar(args.json, args.warmup + args.cells, "cells (gateway, then direct):");
    for i in 0..(args.warmup + args.cells) {
        // Gateway.
        let req = execute_request(&args.code);
        let id = req.header()?.msg_id;
        let t = Instant::now();
        ws_tx.send(WsFrame::Binary(ws::to_v1_binary(Channel::Shell, &req).into())).await?;
        let (mut replied, mut idle) = (false, false);
        while !(replied && idle) {
            let frame = tokio::time::timeout(Duration::from_secs(60), ws_rx.next())
                .await
                .context("no answer from the gateway in 60 s")?
                .context("the gateway closed the WebSocket")??;
            if let WsFrame::Binary(b) = frame {
                let (ch, m) = ws::from_v1_binary(&b)?;
                let (r, i) = is_idle_for(ch, &m, &id);
                replied |= r;
                idle |= i;
            }
        }
        let gw = t.elapsed();
        // Direct.
        let req = execute_request(&args.code);
        let id = req.header()?.msg_id;
        let t = Instant::now();
        hub.expect_reply(&id, client, SystemTime::now());
        replica.send(Channel::Shell, &req).await?;
        let (mut replied, mut idle) = (false, false);
        while !(replied && idle) {
            let (ch, m): Outgoing = tokio::time::timeout(Duration::from_secs(60), direct_rx.recv())
                .await
                .context("no answer from the kernel in 60 s")?
                .context("the kernel connection closed")?;
            let (r, i) = is_idle_for(ch, &m, &id);
            replied |= r;
            idle |= i;
        }
        let direct = t.elapsed();
        if i >= args.warmup {
            gateway_ms.push(gw.as_secs_f64() * 1e3);
            direct_ms.push(direct.as_secs_f64() * 1e3);
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let _ = ws_tx.close().await;
    replica.process.signal(libc::SIGTERM)?;
    replica.process.stop(Duration::from_secs(3)).await;
    let g = gateway.clone();
    let id = model.id.clone();
    tokio::task::spawn_blocking(move || g.delete_kernel(&id)).await??;

    let (gp50, gp99) = (percentile(&mut gateway_ms, 50.0), percentile(&mut gateway_ms, 99.0));
    let (dp50, dp99) = (percentile(&mut direct_ms, 50.0), percentile(&mut direct_ms, 99.0));
    Ok(CellBench {
        gateway_p50_ms: round3(gp50),
        gateway_p99_ms: round3(gp99),
        direct_p50_ms: round3(dp50),
        direct_p99_ms: round3(dp99),
        added_p50_ms: round3(gp50 - dp50),
        added_p99_ms: round3(gp99 - dp99),
        cells: args.cells,
        gateway_url: gateway.url.clone(),
    })
}
