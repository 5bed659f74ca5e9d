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

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message as WsFrame;
use zeromq::{PubSocket, RepSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use notebookosd::jupyter::{wire, ws, Channel, Message, Signer};
use notebookosd::kernel::connection::ConnectionInfo;
use notebookosd::link::client::{is_not_found, ChannelsSocket, GatewayClient};
use notebookosd::link::endpoint::default_runtime_dir;

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
pub fn run(target: &crate::client::Target, args: Args) -> anyhow::Result<()> {
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

/// Messages from clients dropped for a bad HMAC or a malformed frame.
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Requests abandoned on a lost socket whose late messages are still dropped.
const MAX_ABANDONED: usize = 4096;

/// Creates the kernel on the first gateway that answers; returns its index and the model.
async fn create_on_first(
    gateways: &[GatewayClient],
    name: &str,
    gpus: Option<u32>,
) -> anyhow::Result<(usize, notebookosd::kernel::KernelModel)> {
    let mut errors = Vec::new();
    for (i, g) in gateways.iter().enumerate() {
        let (g, name) = (g.clone(), name.to_owned());
        match tokio::task::spawn_blocking(move || g.create_kernel(&name, gpus)).await? {
            Ok(m) => return Ok((i, m)),
            Err(e) => {
                tracing::warn!(gateway = %gateways[i].url, error = format!("{e:#}"), "could not create the kernel");
                errors.push(format!("{e:#}"));
            }
        }
    }
    anyhow::bail!("no gateway could create the kernel: {}", errors.join("; "))
}

/// Finds a gateway (starting after `from`) whose channels socket for `id` opens.
async fn reconnect(
    gateways: &[GatewayClient],
    from: usize,
    id: &str,
    timeout: Duration,
) -> anyhow::Result<(usize, ChannelsSocket)> {
    let deadline = Instant::now() + timeout;
    let mut backoff = Duration::from_millis(50);
    let n = gateways.len();
    loop {
        let mut not_found = 0;
        for step in 1..=n {
            let i = (from + step) % n;
            let attempt = tokio::time::timeout(Duration::from_secs(5), gateways[i].connect_channels(id, true)).await;
            match attempt {
                Ok(Ok(socket)) => return Ok((i, socket)),
                Ok(Err(e)) => {
                    if is_not_found(&e) {
                        not_found += 1;
                    }
                    tracing::debug!(gateway = %gateways[i].url, error = format!("{e:#}"), "reconnect attempt failed");
                }
                Err(_) => tracing::debug!(gateway = %gateways[i].url, "reconnect attempt timed out"),
            }
        }
        // Every gateway answered and none knows the kernel: it is gone, waiting will not help.
        anyhow::ensure!(not_found < n, "no gateway knows kernel {id} any more (deleted or lost)");
        anyhow::ensure!(
            Instant::now() + backoff < deadline,
            "lost the kernel's WebSocket and no gateway took it back within {timeout:?}"
        );
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

async fn proxy(conn: ConnectionInfo, gateways: Vec<GatewayClient>, args: Args) -> anyhow::Result<()> {
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
    // An attached kernel is not the proxy's to delete when it ends (unless the client shuts it down).
    let mut guard = DeleteOnDrop { gateways: gateways.clone(), current, id: kernel_id.clone(), armed: owned };
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
                let (g, id) = (gateways[current].clone(), kernel_id.clone());
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
            tracing::info!(kernel = %kernel_id, gateway = %gateways[current].url, "reconnected");
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

/// Where a request came from, to route its reply (or answer it when its socket is lost).
struct Route {
    ids: Vec<Bytes>,
    channel: Channel,
    request: Message,
}

/// Msg ids of requests answered as abandoned (bounded, oldest forgotten first).
#[derive(Default)]
struct Abandoned {
    set: HashSet<String>,
    order: VecDeque<String>,
}

impl Abandoned {
    fn insert(&mut self, id: String) {
        if self.set.insert(id.clone()) {
            self.order.push_back(id);
        }
        while self.order.len() > MAX_ABANDONED {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }

    fn contains(&self, msg: &Message) -> bool {
        parent_msg_id(msg).is_some_and(|p| self.set.contains(&p))
    }
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
        routes: &mut HashMap<String, Route>,
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
                    Some(p) if channel == Channel::Stdin => routes.get(p).map(|r| r.ids.clone()),
                    Some(p) => routes.remove(p).map(|r| r.ids),
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

impl Routers {
    /// Answers every request still waiting on a lost socket with an error, as a kernel
    /// answers a failed request (busy, error, idle for cells), and remembers them so
    /// late messages for them are dropped.
    async fn abandon_in_flight(
        &mut self,
        routes: &mut HashMap<String, Route>,
        abandoned: &mut Abandoned,
        signer: &Signer,
        kernel_id: &str,
    ) {
        for (msg_id, route) in routes.drain() {
            let Ok(h) = route.request.header() else { continue };
            let evalue = "the connection to the gateway was lost while this request was in flight; \
                          the proxy reconnected to the kernel, re-run the cell if needed";
            let error = serde_json::json!({
                "ename": "GatewayConnectionLost",
                "evalue": evalue,
                "traceback": [format!("GatewayConnectionLost: {evalue}")],
            });
            let is_cell = h.msg_type == "execute_request";
            if is_cell {
                self.publish(
                    &route.request,
                    "status",
                    &serde_json::json!({ "execution_state": "busy" }),
                    signer,
                    kernel_id,
                )
                .await;
                self.publish(&route.request, "error", &error, signer, kernel_id).await;
            }
            let mut content = error;
            content["status"] = "error".into();
            if is_cell {
                content["execution_count"] = 0.into();
            }
            let reply_type =
                h.msg_type.strip_suffix("_request").map_or_else(|| h.msg_type.clone(), |t| format!("{t}_reply"));
            let reply = daemon_message(&reply_type, &h.session, Some(&route.request.header), &content);
            let frames = wire::serialize(&route.ids, &reply, signer);
            if let Ok(z) = ZmqMessage::try_from(frames) {
                let sock = if route.channel == Channel::Control { &mut self.control } else { &mut self.shell };
                if let Err(e) = sock.send(z).await {
                    tracing::warn!(error = %e, "could not answer an abandoned request");
                }
            }
            if is_cell {
                self.publish(
                    &route.request,
                    "status",
                    &serde_json::json!({ "execution_state": "idle" }),
                    signer,
                    kernel_id,
                )
                .await;
            }
            tracing::warn!(msg_id = %msg_id, msg_type = %h.msg_type, "request abandoned with the lost gateway socket");
            abandoned.insert(msg_id);
        }
    }

    /// Publishes a proxy-originated IOPub message in reply to `parent`.
    async fn publish(
        &mut self,
        parent: &Message,
        msg_type: &str,
        content: &serde_json::Value,
        signer: &Signer,
        kernel_id: &str,
    ) {
        let session = parent.header().map(|h| h.session).unwrap_or_default();
        let msg = daemon_message(msg_type, &session, Some(&parent.header), content);
        self.send_iopub(msg, signer, kernel_id).await;
    }

    /// Publishes a `status` with no parent (or `parent`).
    async fn publish_status(&mut self, state: &str, parent: Option<&Message>, signer: &Signer, kernel_id: &str) {
        let content = serde_json::json!({ "execution_state": state });
        let msg = daemon_message("status", "nbos-kernel-proxy", parent.map(|p| &p.header), &content);
        self.send_iopub(msg, signer, kernel_id).await;
    }

    async fn send_iopub(&mut self, msg: Message, signer: &Signer, kernel_id: &str) {
        let msg_type = msg.header().map(|h| h.msg_type).unwrap_or_default();
        let topic = Bytes::from(format!("kernel.{kernel_id}.{msg_type}"));
        let frames = wire::serialize(&[topic], &msg, signer);
        if let Ok(z) = ZmqMessage::try_from(frames) {
            if let Err(e) = self.iopub.send(z).await {
                tracing::warn!(error = %e, "could not publish to the client");
            }
        }
    }
}

/// A message the proxy itself originates.
fn daemon_message(msg_type: &str, session: &str, parent: Option<&Bytes>, content: &serde_json::Value) -> Message {
    Message::new(msg_type, session, &uuid::Uuid::new_v4().to_string(), SystemTime::now(), parent, content)
}

fn parent_msg_id(msg: &Message) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(&msg.parent_header).ok()?;
    v.get("msg_id")?.as_str().map(str::to_owned)
}

/// Deletes the remote kernel when the proxy ends, however it ends: through the
/// gateway in use, else any other.
struct DeleteOnDrop {
    gateways: Vec<GatewayClient>,
    current: usize,
    id: String,
    armed: bool,
}

impl Drop for DeleteOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let n = self.gateways.len();
        for step in 0..n {
            let g = &self.gateways[(self.current + step) % n];
            // Already gone is fine: a client's shutdown_request deletes a replicated kernel itself.
            match g.delete_kernel_if_exists(&self.id) {
                Ok(_) => return,
                Err(e) => {
                    tracing::warn!(kernel = %self.id, gateway = %g.url, error = format!("{e:#}"), "could not delete the remote kernel");
                }
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
    #[arg(long, default_value = notebookosd::kernel::spec::DEFAULT_SPEC)]
    pub kernel_name: String,
    /// GPUs per cell (overrides the gateway kernelspec's request).
    #[arg(long)]
    pub gpus: Option<u32>,
    /// Install under PREFIX/share/jupyter/kernels (e.g. a virtualenv) instead of the user's data dir.
    #[arg(long, value_name = "PREFIX", conflicts_with = "kernels_dir")]
    pub prefix: Option<PathBuf>,
    /// Install into exactly this `kernels` directory.
    #[arg(long, value_name = "DIR")]
    pub kernels_dir: Option<PathBuf>,
    /// Gateways of a cluster the proxy fails over between (repeat, or a comma list).
    #[arg(long = "gateway", value_name = "URL", value_delimiter = ',')]
    pub gateways: Vec<String>,
}

/// Writes `kernels/<name>/kernel.json` that runs `nbos kernel-proxy`.
pub fn install_kernelspec(target: &crate::client::Target, args: InstallArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.name.is_empty() && args.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)),
        "kernelspec name {:?} must be letters, digits, '-', '_' or '.'",
        args.name
    );
    anyhow::ensure!(
        notebookosd::kernel::spec::gpus_of(&args.kernel_name).is_some(),
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
    if !args.gateways.is_empty() {
        argv.extend(["--gateway".into(), args.gateways.join(",")]);
    }
    // The global --token-file: the proxy reads it (the token itself never goes into kernel.json).
    if let Some(f) = &target.token_file {
        let abs = std::path::absolute(f).with_context(|| format!("resolving {}", f.display()))?;
        argv.extend(["--token-file".into(), abs.display().to_string()]);
    }
    // An https:// gateway: the kernel's proxy needs the same CA (and client certificate).
    for (flag, file) in
        [("--ca-cert", &target.ca_cert), ("--client-cert", &target.client_cert), ("--client-key", &target.client_key)]
    {
        if let Some(f) = file {
            let abs = std::path::absolute(f).with_context(|| format!("resolving {}", f.display()))?;
            argv.extend([flag.into(), abs.display().to_string()]);
        }
    }
    let gpus = args.gpus.or_else(|| notebookosd::kernel::spec::gpus_of(&args.kernel_name)).unwrap_or(0);
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
