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
//!
//! Several gateways (`--gateway A --gateway B` or `--gateway A,B`, the hosts of one
//! cluster): the kernel is created on the first that answers; when the WebSocket is
//! lost, the proxy reconnects to the next gateway that serves the same kernel id
//! (any host's gateway serves any kernel of the cluster), with backoff, until
//! `--reconnect-timeout`. The Jupyter client keeps its ZMQ sockets throughout; it
//! sees an `idle` status once reconnected. Requests that were in flight on the lost
//! socket get an error reply (`GatewayConnectionLost`), so no client waits forever,
//! and late messages for them are dropped.
//!
//! The gateways given are where it starts: once the kernel runs, the proxy learns every
//! live host's gateway from the cluster's status, and again every [`LEARN_EVERY`], so a
//! kernelspec naming one host (the local daemon's, as the packaged one does) still
//! reconnects and deletes through the survivors when that host dies.
//!
//! This file runs the proxy (binds, connects, forwards both ways); [`client_side`] is the
//! Jupyter client's side (routing replies to the ZMQ sockets, answering what a lost socket
//! abandoned), [`gateway_side`] the gateway's (create, reconnect, delete); [`kernelspec`]
//! is `nbos install-kernelspec`, the kernelspec that starts the proxy.

mod client_side;
mod gateway_side;
mod kernelspec;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message as WsFrame;
use zeromq::{PubSocket, RepSocket, RouterSocket, Socket, SocketRecv, SocketSend};

use notebookosd::jupyter::{wire, ws, Channel, Message, Signer};
use notebookosd::kernel::connection::ConnectionInfo;
use notebookosd::link::client::GatewayClient;
use notebookosd::link::endpoint::default_runtime_dir;

use self::client_side::{Abandoned, Route, Routers};
use self::gateway_side::{create_on_first, learn, reconnect, DeleteOnDrop};
pub use self::kernelspec::{install_kernelspec, InstallArgs};

/// Options of `nbos kernel-proxy`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The connection file the Jupyter client wrote (ports and HMAC key).
    #[arg(short = 'f', long = "connection-file", value_name = "FILE")]
    pub connection_file: PathBuf,
    /// Kernelspec to start on the gateway.
    #[arg(long, default_value = notebookosd::kernel::spec::DEFAULT_SPEC)]
    pub kernel_name: String,
    /// GPUs per cell (overrides the kernelspec's request).
    #[arg(long)]
    pub gpus: Option<u32>,
    /// Runtime directory of the local daemon, to find its endpoint file.
    #[arg(long, value_name = "DIR")]
    pub runtime_dir: Option<PathBuf>,
    /// Gateways of one cluster, in order of preference (repeat, or a comma list).
    /// Default: `--url`, else the local daemon's endpoint.
    #[arg(long = "gateway", value_name = "URL", value_delimiter = ',')]
    pub gateways: Vec<String>,
    /// Attach to this existing kernel instead of creating one (it is not deleted when the
    /// proxy ends, unless the client shuts it down).
    #[arg(long, value_name = "ID")]
    pub kernel_id: Option<String>,
    /// How long to keep trying the gateways after the WebSocket is lost.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = humantime::parse_duration)]
    pub reconnect_timeout: Duration,
    /// The largest message a client may send on the proxy's ZMQ sockets, bytes; a client
    /// that sends more is disconnected.
    #[arg(long, value_name = "BYTES", default_value_t = notebookosd::kernel::sockets::DEFAULT_MAX_MESSAGE_BYTES)]
    pub max_message_bytes: usize,
}

/// Runs the proxy until the kernel is shut down.
pub fn run(target: &crate::client::ConnectArgs, args: Args) -> anyhow::Result<()> {
    let conn = ConnectionInfo::read(&args.connection_file)?;
    let runtime_dir = args.runtime_dir.clone().unwrap_or_else(default_runtime_dir);
    let urls: Vec<Option<&str>> = if args.gateways.is_empty() {
        vec![target.url.as_deref()]
    } else {
        args.gateways.iter().map(|u| Some(u.trim())).filter(|u| u.is_some_and(|u| !u.is_empty())).collect()
    };
    anyhow::ensure!(!urls.is_empty(), "--gateway names no URL");
    // The global --token-file (kept out of argv and kernel.json), else NBOS_TOKEN.
    let token = target.token()?;
    let gateways = urls
        .into_iter()
        .map(|u| {
            let client = GatewayClient::resolve(u, token.as_deref(), None, &runtime_dir)?;
            Ok(match &target.ca_cert {
                Some(ca) => client.with_tls(notebookosd::link::tls::client_config(
                    ca,
                    target.client_cert.as_deref().zip(target.client_key.as_deref()),
                )?),
                None => client,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(proxy(conn, gateways, args))
}

/// How often the proxy asks the cluster for its hosts' gateways again (hosts join and leave).
const LEARN_EVERY: Duration = Duration::from_secs(30);

/// Messages from clients dropped for a bad HMAC or a malformed frame.
static DROPPED: AtomicU64 = AtomicU64::new(0);

async fn proxy(conn: ConnectionInfo, mut gateways: Vec<GatewayClient>, args: Args) -> anyhow::Result<()> {
    let signer = Signer::new(conn.key.as_bytes());
    // Bind first: the client connects as soon as we are started.
    // Any local process can connect to these ports: each socket caps what it takes.
    let opts = || notebookosd::kernel::sockets::options(args.max_message_bytes);
    let mut shell = RouterSocket::with_options(opts());
    shell.bind(&conn.endpoint(conn.shell_port)).await.context("binding shell")?;
    let mut control = RouterSocket::with_options(opts());
    control.bind(&conn.endpoint(conn.control_port)).await.context("binding control")?;
    let mut stdin = RouterSocket::with_options(opts());
    stdin.bind(&conn.endpoint(conn.stdin_port)).await.context("binding stdin")?;
    let mut iopub = PubSocket::with_options(opts());
    iopub.bind(&conn.endpoint(conn.iopub_port)).await.context("binding iopub")?;
    let mut hb = RepSocket::with_options(opts());
    hb.bind(&conn.endpoint(conn.hb_port)).await.context("binding hb")?;
    tokio::spawn(async move {
        loop {
            match hb.recv().await {
                Ok(m) => {
                    if hb.send(m).await.is_err() {
                        break;
                    }
                }
                // A client that broke the protocol is disconnected; the others keep beating.
                Err(e) if notebookosd::kernel::sockets::is_protocol_violation(&e) => {}
                Err(_) => break,
            }
        }
    });

    let started = Instant::now();
    let (mut current, kernel_id, socket, owned) = match &args.kernel_id {
        // Attach: the first gateway (in order) that serves the kernel.
        Some(id) => {
            let last = gateways.len() - 1;
            let (i, socket) = reconnect(&gateways, last, id, args.reconnect_timeout).await?;
            tracing::info!(kernel = %id, gateway = %gateways[i].url, "attached to the remote kernel");
            (i, id.clone(), socket, false)
        }
        None => {
            let (i, model) = create_on_first(&gateways, &args.kernel_name, args.gpus).await?;
            tracing::info!(kernel = %model.id, gateway = %gateways[i].url, elapsed = ?started.elapsed(), "remote kernel started");
            let mut guard = DeleteOnDrop { gateways: gateways.clone(), current: i, id: model.id.clone(), armed: true };
            // On failure the guard deletes the kernel just created.
            let socket = gateways[i].connect_channels(&model.id, true).await?;
            guard.armed = false;
            (i, model.id, socket, true)
        }
    };
    let learned = learn(&mut gateways, current).await;
    tracing::debug!(learned, known = gateways.len(), "the cluster's gateways");
    // An attached kernel is not the proxy's to delete when it ends (unless the client shuts it down).
    let mut guard = DeleteOnDrop { gateways: gateways.clone(), current, id: kernel_id.clone(), armed: owned };
    let mut relearn = tokio::time::interval_at(tokio::time::Instant::now() + LEARN_EVERY, LEARN_EVERY);
    let (mut ws_tx, mut ws_rx) = socket.split();

    let (shell_tx, mut shell_rx) = shell.split();
    let (control_tx, mut control_rx) = control.split();
    let (stdin_tx, mut stdin_rx) = stdin.split();
    let mut routers = Routers { shell: shell_tx, control: control_tx, stdin: stdin_tx, iopub };
    // Which client identities asked which request, to route the replies.
    let mut routes: HashMap<String, Route> = HashMap::new();
    let mut abandoned = Abandoned::default();
    // Messages the lost socket refused to take: never delivered, so sent again after reconnecting.
    let mut unsent: Vec<(Channel, Message)> = Vec::new();
    let mut shutdown_requested: Option<String> = None;

    use tokio::signal::unix::{signal, SignalKind};
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;

    loop {
        let mut lost: Option<String> = None;
        let from_client = tokio::select! {
            m = shell_rx.recv() => Some((Channel::Shell, m)),
            m = control_rx.recv() => Some((Channel::Control, m)),
            m = stdin_rx.recv() => Some((Channel::Stdin, m)),
            frame = ws_rx.next() => {
                match frame {
                    Some(Ok(WsFrame::Binary(b))) => match ws::from_v1_binary(&b) {
                        Ok((channel, msg)) if abandoned.contains(&msg) => {
                            tracing::debug!(channel = channel.as_str(), "late message for an abandoned request; dropped");
                        }
                        Ok((channel, msg)) => {
                            let done = routers.deliver_to_client(channel, msg, &mut routes, &signer, &kernel_id, shutdown_requested.as_deref()).await;
                            if done {
                                tracing::info!(kernel = %kernel_id, "kernel shut down by the client");
                                break;
                            }
                        }
                        Err(e) => tracing::warn!(error = %e, "undecodable message from the gateway"),
                    },
                    Some(Ok(WsFrame::Close(_))) | None => lost = Some("the gateway closed the kernel's WebSocket".to_owned()),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => lost = Some(format!("the gateway WebSocket failed: {e}")),
                }
                None
            }
            _ = sigint.recv() => {
                if shutdown_requested.is_some() {
                    // A client that shuts the kernel down may signal its process too: the
                    // kernel is going or gone, nothing to interrupt (the gateway would say 502).
                    tracing::debug!("SIGINT after the shutdown request; nothing to interrupt");
                    continue;
                }
                let (g, id) = (gateways[current].clone(), kernel_id.clone());
                match tokio::task::spawn_blocking(move || g.interrupt_kernel(&id)).await {
                    Ok(Ok(())) => tracing::info!("interrupted"),
                    Ok(Err(e)) => tracing::warn!(error = format!("{e:#}"), "interrupt failed"),
                    Err(e) => tracing::warn!(error = %e, "interrupt task failed"),
                }
                None
            }
            _ = relearn.tick() => {
                if learn(&mut gateways, current).await > 0 {
                    guard.gateways = gateways.clone();
                }
                None
            }
            _ = sigterm.recv() => {
                tracing::info!("SIGTERM: deleting the remote kernel");
                break;
            }
        };
        if let Some(why) = lost {
            if shutdown_requested.is_some() {
                // The kernel went away as asked; nothing to reconnect to.
                break;
            }
            tracing::warn!(kernel = %kernel_id, gateway = %gateways[current].url, reason = %why, "reconnecting");
            let (idx, socket) = reconnect(&gateways, current, &kernel_id, args.reconnect_timeout)
                .await
                .with_context(|| format!("{why} (kernel {kernel_id})"))?;
            current = idx;
            guard.current = idx;
            (ws_tx, ws_rx) = socket.split();
            // A warning's resolution, at the same level: whoever read "reconnecting" learns how it ended.
            tracing::warn!(kernel = %kernel_id, gateway = %gateways[current].url, "reconnected");
            // Requests that reached the lost socket may or may not have run: answered as
            // abandoned. Those it refused never left: sent again on the new socket.
            let resend: HashMap<String, Route> = unsent
                .iter()
                .filter_map(|(_, m)| m.header().ok())
                .filter_map(|h| routes.remove_entry(&h.msg_id))
                .collect();
            routers.abandon_in_flight(&mut routes, &mut abandoned, &signer, &kernel_id).await;
            routes.extend(resend);
            routers.publish_status("idle", None, &signer, &kernel_id).await;
            for (channel, msg) in std::mem::take(&mut unsent) {
                let frame = ws::to_v1_binary(channel, &msg);
                if let Err(e) = ws_tx.send(WsFrame::Binary(frame.into())).await {
                    tracing::warn!(error = %e, "sending to the gateway failed again");
                    unsent.push((channel, msg));
                }
            }
            continue;
        }
        let Some((channel, received)) = from_client else { continue };
        let frames = match received {
            Ok(m) => m.into_vec(),
            // That client is disconnected (an oversized or malformed frame); others go on.
            Err(e) if notebookosd::kernel::sockets::is_protocol_violation(&e) => {
                let n = DROPPED.fetch_add(1, Ordering::Relaxed) + 1;
                tracing::warn!(channel = channel.as_str(), error = %e, dropped_total = n, "disconnected a client that broke the ZMQ protocol");
                continue;
            }
            Err(e) => anyhow::bail!("{} socket failed: {e}", channel.as_str()),
        };
        match wire::parse(frames, &signer) {
            Ok((ids, msg)) => {
                let header = msg.header()?;
                // Only requests get replies (a comm_msg entry would never be removed).
                if channel != Channel::Stdin && header.msg_type.ends_with("_request") {
                    routes.insert(header.msg_id.clone(), Route { ids, channel, request: msg.clone() });
                }
                if channel == Channel::Control && header.msg_type == "shutdown_request" {
                    shutdown_requested = Some(header.msg_id.clone());
                    guard.armed = true;
                }
                let frame = ws::to_v1_binary(channel, &msg);
                if let Err(e) = ws_tx.send(WsFrame::Binary(frame.into())).await {
                    // The read side sees the loss too and reconnects; the message goes out
                    // again on the new socket.
                    tracing::warn!(error = %e, "sending to the gateway failed; sent again after reconnecting");
                    unsent.push((channel, msg));
                }
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
