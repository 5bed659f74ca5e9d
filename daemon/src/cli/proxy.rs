//! `nbos kernel-proxy -f {connection_file}`: a local kernel that is really a
//! NotebookOS kernel behind the gateway.
//!
//! Jupyter clients that only know kernelspecs (nbclient, papermill, `jupyter
//! console`, VS Code) start this process as "the kernel". It binds the five ZMQ
//! channels of the connection file, checks the HMAC of every client message with
//! the file's key (a message that fails is dropped, counted and logged), creates
//! a kernel on the gateway and forwards messages both ways over the channels
//! WebSocket (`v1.kernel.websocket.jupyter.org`, so the four JSON parts pass
//! through unchanged), re-signing what it sends to the client with the file's key.
//! SIGINT interrupts the remote kernel; `shutdown_request` or SIGTERM deletes it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::Context;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message as WsFrame;
use zeromq::{PubSocket, RepSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::gateway::client::{default_runtime_dir, GatewayClient};
use crate::jupyter::{wire, ws, Channel, Message, Signer};
use crate::kernel::connection::ConnectionInfo;

/// Options of `nbos kernel-proxy`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The connection file the Jupyter client wrote (ports and HMAC key).
    #[arg(short = 'f', long = "connection-file", value_name = "FILE")]
    pub connection_file: PathBuf,
    /// Kernelspec to start on the gateway.
    #[arg(long, default_value = crate::kernel::spec::DEFAULT_SPEC)]
    pub kernel_name: String,
    /// GPUs per cell (overrides the kernelspec's request).
    #[arg(long)]
    pub gpus: Option<u32>,
    /// File holding the gateway's API token (kept out of argv and kernel.json).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Runtime directory of the local daemon, to find its endpoint file.
    #[arg(long, value_name = "DIR")]
    pub runtime_dir: Option<PathBuf>,
}

/// Runs the proxy until the kernel is shut down.
pub fn run(target: &crate::cli::client::Target, args: Args) -> anyhow::Result<()> {
    let conn = ConnectionInfo::read(&args.connection_file)?;
    let gateway = GatewayClient::resolve(
        target.url.as_deref(),
        target.token.as_deref(),
        args.token_file.as_deref(),
        &args.runtime_dir.clone().unwrap_or_else(default_runtime_dir),
    )?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(proxy(conn, gateway, args))
}

/// Messages from clients dropped for a bad HMAC or a malformed frame.
static DROPPED: AtomicU64 = AtomicU64::new(0);

async fn proxy(conn: ConnectionInfo, gateway: GatewayClient, args: Args) -> anyhow::Result<()> {
    let signer = Signer::new(conn.key.as_bytes());
    // Bind first: the client connects as soon as we are started.
    let mut shell = RouterSocket::new();
    shell.bind(&conn.endpoint(conn.shell_port)).await.context("binding shell")?;
    let mut control = RouterSocket::new();
    control.bind(&conn.endpoint(conn.control_port)).await.context("binding control")?;
    let mut stdin = RouterSocket::new();
    stdin.bind(&conn.endpoint(conn.stdin_port)).await.context("binding stdin")?;
    let mut iopub = PubSocket::new();
    iopub.bind(&conn.endpoint(conn.iopub_port)).await.context("binding iopub")?;
    let mut hb = RepSocket::new();
    hb.bind(&conn.endpoint(conn.hb_port)).await.context("binding hb")?;
    tokio::spawn(async move {
        while let Ok(m) = hb.recv().await {
            if hb.send(m).await.is_err() {
                break;
            }
        }
    });

    let started = Instant::now();
    let g = gateway.clone();
    let (name, gpus) = (args.kernel_name.clone(), args.gpus);
    let model = tokio::task::spawn_blocking(move || g.create_kernel(&name, gpus)).await??;
    let kernel_id = model.id.clone();
    tracing::info!(kernel = %kernel_id, elapsed = ?started.elapsed(), "remote kernel started");
    let guard = DeleteOnDrop { gateway: gateway.clone(), id: kernel_id.clone(), armed: true };

    let socket = gateway.connect_channels(&kernel_id, true).await?;
    let (mut ws_tx, mut ws_rx) = socket.split();

    let (shell_tx, mut shell_rx) = shell.split();
    let (control_tx, mut control_rx) = control.split();
    let (stdin_tx, mut stdin_rx) = stdin.split();
    let mut routers = Routers { shell: shell_tx, control: control_tx, stdin: stdin_tx, iopub };
    // Which client identities asked which request, to route the replies.
    let mut routes: HashMap<String, Vec<Bytes>> = HashMap::new();
    let mut shutdown_requested: Option<String> = None;

    use tokio::signal::unix::{signal, SignalKind};
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;

    loop {
        let from_client = tokio::select! {
            m = shell_rx.recv() => Some((Channel::Shell, m)),
            m = control_rx.recv() => Some((Channel::Control, m)),
            m = stdin_rx.recv() => Some((Channel::Stdin, m)),
            frame = ws_rx.next() => {
                match frame {
                    Some(Ok(WsFrame::Binary(b))) => match ws::from_v1_binary(&b) {
                        Ok((channel, msg)) => {
                            let done = routers.deliver_to_client(channel, msg, &mut routes, &signer, &kernel_id, shutdown_requested.as_deref()).await;
                            if done {
                                tracing::info!(kernel = %kernel_id, "kernel shut down by the client");
                                break;
                            }
                        }
                        Err(e) => tracing::warn!(error = %e, "undecodable message from the gateway"),
                    },
                    Some(Ok(WsFrame::Close(_))) | None => anyhow::bail!("the gateway closed the kernel's WebSocket"),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => anyhow::bail!("the gateway WebSocket failed: {e}"),
                }
                None
            }
            _ = sigint.recv() => {
                let (g, id) = (gateway.clone(), kernel_id.clone());
                match tokio::task::spawn_blocking(move || g.interrupt_kernel(&id)).await {
                    Ok(Ok(())) => tracing::info!("interrupted"),
                    Ok(Err(e)) => tracing::warn!(error = format!("{e:#}"), "interrupt failed"),
                    Err(e) => tracing::warn!(error = %e, "interrupt task failed"),
                }
                None
            }
            _ = sigterm.recv() => {
                tracing::info!("SIGTERM: deleting the remote kernel");
                break;
            }
        };
        let Some((channel, received)) = from_client else { continue };
        let frames = match received {
            Ok(m) => m.into_vec(),
            Err(e) => anyhow::bail!("{} socket failed: {e}", channel.as_str()),
        };
        match wire::parse(frames, &signer) {
            Ok((ids, msg)) => {
                let header = msg.header()?;
                // Only requests get replies (a comm_msg entry would never be removed).
                if channel != Channel::Stdin && header.msg_type.ends_with("_request") {
                    routes.insert(header.msg_id.clone(), ids);
                }
                if channel == Channel::Control && header.msg_type == "shutdown_request" {
                    shutdown_requested = Some(header.msg_id.clone());
                }
                let frame = ws::to_v1_binary(channel, &msg);
                ws_tx.send(WsFrame::Binary(frame.into())).await.context("sending to the gateway")?;
            }
            Err(e) => {
                let n = DROPPED.fetch_add(1, Ordering::Relaxed) + 1;
                tracing::warn!(channel = channel.as_str(), error = %e, dropped_total = n, "dropped a client message");
            }
        }
    }
    let _ = ws_tx.close().await;
    drop(guard);
    Ok(())
}

struct Routers {
    shell: zeromq::RouterSendHalf,
    control: zeromq::RouterSendHalf,
    stdin: zeromq::RouterSendHalf,
    iopub: PubSocket,
}

impl Routers {
    /// Sends a gateway message to the client; true when it was the reply to the
    /// client's shutdown request.
    async fn deliver_to_client(
        &mut self,
        channel: Channel,
        msg: Message,
        routes: &mut HashMap<String, Vec<Bytes>>,
        signer: &Signer,
        kernel_id: &str,
        shutdown: Option<&str>,
    ) -> bool {
        let parent = parent_msg_id(&msg);
        let res = match channel {
            Channel::Iopub => {
                let msg_type = msg.header().map(|h| h.msg_type).unwrap_or_default();
                let topic = Bytes::from(format!("kernel.{kernel_id}.{msg_type}"));
                let frames = wire::serialize(&[topic], &msg, signer);
                match ZmqMessage::try_from(frames) {
                    Ok(z) => self.iopub.send(z).await,
                    Err(_) => return false,
                }
            }
            Channel::Shell | Channel::Control | Channel::Stdin => {
                let ids = match &parent {
                    Some(p) if channel == Channel::Stdin => routes.get(p).cloned(),
                    Some(p) => routes.remove(p),
                    None => None,
                };
                let Some(ids) = ids else {
                    tracing::debug!(channel = channel.as_str(), "reply for no known request; dropped");
                    return false;
                };
                let frames = wire::serialize(&ids, &msg, signer);
                let Ok(z) = ZmqMessage::try_from(frames) else { return false };
                let sock = match channel {
                    Channel::Shell => &mut self.shell,
                    Channel::Control => &mut self.control,
                    _ => &mut self.stdin,
                };
                sock.send(z).await
            }
            Channel::Hb => return false,
        };
        if let Err(e) = res {
            tracing::warn!(channel = channel.as_str(), error = %e, "could not deliver to the client");
        }
        channel == Channel::Control && parent.is_some() && parent.as_deref() == shutdown
    }
}

fn parent_msg_id(msg: &Message) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(&msg.parent_header).ok()?;
    v.get("msg_id")?.as_str().map(str::to_owned)
}

/// Deletes the remote kernel when the proxy ends, however it ends.
struct DeleteOnDrop {
    gateway: GatewayClient,
    id: String,
    armed: bool,
}

impl Drop for DeleteOnDrop {
    fn drop(&mut self) {
        if self.armed {
            if let Err(e) = self.gateway.delete_kernel(&self.id) {
                tracing::warn!(kernel = %self.id, error = format!("{e:#}"), "could not delete the remote kernel");
            }
        }
    }
}

/// Options of `nbos install-kernelspec`.
#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    /// Name of the installed kernelspec (the directory under `kernels/`).
    #[arg(long, default_value = "notebookos")]
    pub name: String,
    /// Gateway kernelspec the proxy starts.
    #[arg(long, default_value = crate::kernel::spec::DEFAULT_SPEC)]
    pub kernel_name: String,
    /// GPUs per cell (overrides the gateway kernelspec's request).
    #[arg(long)]
    pub gpus: Option<u32>,
    /// Token file the proxy reads (the token itself never goes into kernel.json).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Install under PREFIX/share/jupyter/kernels (e.g. a virtualenv) instead of the user's data dir.
    #[arg(long, value_name = "PREFIX", conflicts_with = "kernels_dir")]
    pub prefix: Option<PathBuf>,
    /// Install into exactly this `kernels` directory.
    #[arg(long, value_name = "DIR")]
    pub kernels_dir: Option<PathBuf>,
}

/// Writes `kernels/<name>/kernel.json` that runs `nbos kernel-proxy`.
pub fn install_kernelspec(target: &crate::cli::client::Target, args: InstallArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.name.is_empty() && args.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)),
        "kernelspec name {:?} must be letters, digits, '-', '_' or '.'",
        args.name
    );
    anyhow::ensure!(
        crate::kernel::spec::gpus_of(&args.kernel_name).is_some(),
        "unknown gateway kernelspec {:?} (see GET /api/kernelspecs)",
        args.kernel_name
    );
    let kernels_dir = match (&args.kernels_dir, &args.prefix) {
        (Some(d), _) => d.clone(),
        (None, Some(p)) => p.join("share/jupyter/kernels"),
        (None, None) => match std::env::var_os("JUPYTER_DATA_DIR") {
            Some(d) => PathBuf::from(d).join("kernels"),
            None => {
                let home = std::env::var_os("HOME").context("HOME is not set; pass --prefix or --kernels-dir")?;
                PathBuf::from(home).join(".local/share/jupyter/kernels")
            }
        },
    };
    let nbos = std::env::current_exe().context("finding the nbos executable")?;
    let mut argv: Vec<String> = vec![
        nbos.display().to_string(),
        "kernel-proxy".into(),
        "-f".into(),
        "{connection_file}".into(),
        "--kernel-name".into(),
        args.kernel_name.clone(),
    ];
    if let Some(g) = args.gpus {
        argv.extend(["--gpus".into(), g.to_string()]);
    }
    if let Some(u) = &target.url {
        argv.extend(["--url".into(), u.clone()]);
    }
    if let Some(f) = &args.token_file {
        let abs = std::path::absolute(f).with_context(|| format!("resolving {}", f.display()))?;
        argv.extend(["--token-file".into(), abs.display().to_string()]);
    }
    let gpus = args.gpus.or_else(|| crate::kernel::spec::gpus_of(&args.kernel_name)).unwrap_or(0);
    let spec = serde_json::json!({
        "argv": argv,
        "display_name": format!("NotebookOS ({}, {gpus} GPU per cell)", args.kernel_name),
        "language": "python",
        "interrupt_mode": "signal",
        "metadata": { "notebookos": { "gpus": gpus, "gateway_kernelspec": args.kernel_name } },
    });
    let dir = kernels_dir.join(&args.name);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let file = dir.join("kernel.json");
    std::fs::write(&file, serde_json::to_string_pretty(&spec)?)
        .with_context(|| format!("writing {}", file.display()))?;
    println!("installed kernelspec {} in {}", args.name, dir.display());
    Ok(())
}
