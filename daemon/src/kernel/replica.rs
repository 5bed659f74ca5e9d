//! One replica of a kernel: an ipykernel process and the daemon's ZMQ sockets to it.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use bytes::Bytes;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use zeromq::{
    DealerSendHalf, DealerSocket, ReqSocket, Socket, SocketOptions, SocketRecv, SocketSend, SubSocket, ZmqMessage,
};

use super::connection::ConnectionInfo;
use super::hub::Hub;
use super::process::{KernelProcess, LaunchSpec};
use crate::jupyter::{wire, Channel, Message, Signer};
use crate::metrics::{DropLabels, Metrics};

/// How long a new kernel process may take to accept connections.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// A running replica.
pub struct Replica {
    /// Position in the kernel's replica set.
    pub index: usize,
    /// The ipykernel process.
    pub process: KernelProcess,
    /// Its connection file contents.
    pub conn: ConnectionInfo,
    signer: Signer,
    shell: Mutex<DealerSendHalf>,
    control: Mutex<DealerSendHalf>,
    stdin: Mutex<DealerSendHalf>,
    readers: Vec<JoinHandle<()>>,
}

impl Drop for Replica {
    fn drop(&mut self) {
        for r in &self.readers {
            r.abort();
        }
    }
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica").field("index", &self.index).field("pid", &self.process.pid()).finish()
    }
}

impl Replica {
    /// Starts the process and connects to all its channels; messages from it go to `hub`.
    pub async fn start(
        index: usize,
        launch: &LaunchSpec,
        conn: ConnectionInfo,
        hub: Arc<Hub>,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        let file = launch.dir.join(format!("connection-{index}.json"));
        conn.write(&file)?;
        let process = KernelProcess::start(launch, &file).await?;
        let signer = Signer::new(conn.key.as_bytes());
        let sockets = async {
            // Shell, control and stdin share one identity: ipykernel addresses an
            // input_request on stdin to the identity that sent the execute_request on shell.
            let identity = Bytes::from(format!("nbos-{}", super::connection::random_hex(8)?));
            let (shell_tx, shell_rx) = dealer(&conn, conn.shell_port, &identity).await?.split();
            let (control_tx, control_rx) = dealer(&conn, conn.control_port, &identity).await?.split();
            let (stdin_tx, stdin_rx) = dealer(&conn, conn.stdin_port, &identity).await?.split();
            let mut iopub = SubSocket::new();
            wait_listening(&conn, conn.iopub_port).await;
            iopub.connect(&conn.endpoint(conn.iopub_port)).await.context("connecting to the kernel's iopub")?;
            iopub.subscribe("").await.context("subscribing to iopub")?;
            anyhow::Ok((shell_tx, shell_rx, control_tx, control_rx, stdin_tx, stdin_rx, iopub))
        };
        let connected = tokio::select! {
            r = tokio::time::timeout(CONNECT_TIMEOUT, sockets) => r.context("the kernel did not open its ports in time")?,
            how = process.wait() => {
                anyhow::bail!("the kernel process exited while starting ({how}); see {}", launch.dir.join("kernel.log").display())
            }
        };
        let (shell_tx, shell_rx, control_tx, control_rx, stdin_tx, stdin_rx, iopub) = connected?;
        let readers = vec![
            spawn_reader(Channel::Shell, shell_rx, signer.clone(), hub.clone(), metrics.clone()),
            spawn_reader(Channel::Control, control_rx, signer.clone(), hub.clone(), metrics.clone()),
            spawn_reader(Channel::Stdin, stdin_rx, signer.clone(), hub.clone(), metrics.clone()),
            spawn_reader(Channel::Iopub, iopub, signer.clone(), hub, metrics),
        ];
        Ok(Self {
            index,
            process,
            conn,
            signer,
            shell: Mutex::new(shell_tx),
            control: Mutex::new(control_tx),
            stdin: Mutex::new(stdin_tx),
            readers,
        })
    }

    /// Signs and sends a message to the kernel.
    pub async fn send(&self, channel: Channel, msg: &Message) -> anyhow::Result<()> {
        let frames = wire::serialize(&[], msg, &self.signer);
        let zmsg = ZmqMessage::try_from(frames).map_err(|e| anyhow::anyhow!("empty message: {e}"))?;
        let sock = match channel {
            Channel::Shell => &self.shell,
            Channel::Control => &self.control,
            Channel::Stdin => &self.stdin,
            Channel::Iopub | Channel::Hb => anyhow::bail!("clients cannot send on {}", channel.as_str()),
        };
        sock.lock().await.send(zmsg).await.with_context(|| format!("sending on the kernel's {}", channel.as_str()))
    }

    /// One heartbeat round trip.
    pub async fn heartbeat(&self, timeout: Duration) -> bool {
        let endpoint = self.conn.endpoint(self.conn.hb_port);
        let ping = async {
            // A fresh REQ socket each time: a REQ that lost its reply is stuck for good.
            let mut hb = ReqSocket::new();
            hb.connect(&endpoint).await.ok()?;
            hb.send(ZmqMessage::from("ping")).await.ok()?;
            let back = hb.recv().await.ok()?;
            (back.get(0).map(|b| b.as_ref()) == Some(b"ping".as_ref())).then_some(())
        };
        matches!(tokio::time::timeout(timeout, ping).await, Ok(Some(())))
    }
}

/// How often a port the kernel has not opened yet is tried again.
const LISTEN_POLL: Duration = Duration::from_millis(50);

/// Returns once something listens on the kernel's `port` (or connecting fails for another
/// reason, which the socket's own connect then reports).
///
/// zeromq 0.7 retries a refused connect after 50 ms, doubling the wait each time up to
/// 30 s: a kernel that opens its ports 13 s after it started (its imports on a loaded
/// host) is reached at about 26 s, and one that opens them after about 26 s not before
/// [`CONNECT_TIMEOUT`], so its start failed although the kernel was listening. Polling at a
/// fixed short interval here means zeromq's first attempt finds the port open.
async fn wait_listening(conn: &ConnectionInfo, port: u16) {
    loop {
        match tokio::net::TcpStream::connect((conn.ip.as_str(), port)).await {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => tokio::time::sleep(LISTEN_POLL).await,
            // Open (the probe closes before any handshake, which ZMQ ignores), or an error
            // the real connect reports with its context.
            _ => return,
        }
    }
}

async fn dealer(conn: &ConnectionInfo, port: u16, identity: &Bytes) -> anyhow::Result<DealerSocket> {
    let mut opts = SocketOptions::default();
    opts.peer_identity(identity.clone().try_into().map_err(|e| anyhow::anyhow!("socket identity: {e}"))?);
    let mut s = DealerSocket::with_options(opts);
    wait_listening(conn, port).await;
    s.connect(&conn.endpoint(port)).await.with_context(|| format!("connecting to the kernel at port {port}"))?;
    Ok(s)
}

fn spawn_reader<S: SocketRecv + Send + 'static>(
    channel: Channel,
    mut sock: S,
    signer: Signer,
    hub: Arc<Hub>,
    metrics: Arc<Metrics>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let zmsg = match sock.recv().await {
                Ok(m) => m,
                Err(e) => {
                    tracing::debug!(channel = channel.as_str(), error = %e, "kernel socket closed");
                    return;
                }
            };
            match wire::parse(zmsg.into_vec(), &signer) {
                Ok((_ids, msg)) => hub.deliver(channel, msg, SystemTime::now()),
                Err(e) => {
                    metrics
                        .messages_dropped_total
                        .get_or_create(&DropLabels { source: "kernel".into(), reason: e.kind().into() })
                        .inc();
                    tracing::warn!(channel = channel.as_str(), error = %e, "dropped a message from the kernel");
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression test of the kernel start stall (issue 18): a kernel whose ports opened
    /// late on a loaded host was reached only at zeromq's next backed-off retry (at 12.75 s
    /// for a port opened at 7 s; after 25.6 s, past the start deadline), so starts failed
    /// with "the kernel did not open its ports in time" while the kernel was listening.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_kernel_that_opens_its_ports_late_is_reached_as_soon_as_it_does() {
        const OPENS_AFTER: Duration = Duration::from_secs(7);
        // zeromq's own retries come at 6.35 s and then 12.75 s (or later, with its jitter):
        // this bound tells the two apart with seconds to spare either side.
        const BOUND: Duration = Duration::from_secs(11);
        let conn = ConnectionInfo::new_loopback("python3").expect("ports");
        let endpoint = conn.endpoint(conn.shell_port);
        let kernel = tokio::spawn(async move {
            tokio::time::sleep(OPENS_AFTER).await;
            let mut router = zeromq::RouterSocket::new();
            router.bind(&endpoint).await.expect("bind");
            // Listening until the test aborts this task.
            std::future::pending::<()>().await;
            drop(router);
        });
        let identity = Bytes::from_static(b"nbos-test");
        let connected = tokio::time::timeout(BOUND, dealer(&conn, conn.shell_port, &identity)).await;
        kernel.abort();
        let socket = connected.expect("connected soon after the kernel opened its port, not at a backed-off retry");
        socket.expect("connect");
    }
}
