//! One ipykernel process of a kernel and the daemon's ZMQ sockets to it.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use bytes::Bytes;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use zeromq::{DealerSendHalf, DealerSocket, ReqSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use super::connection::ConnectionInfo;
use super::hub::Hub;
use super::port_owner::{self, Listener, PortTaken};
use super::process::{KernelProcess, LaunchSpec};
use super::sockets;
use crate::jupyter::{wire, Channel, Message, Signer};
use crate::metrics::{DropLabels, Metrics};

/// How long a new kernel process may take to accept connections.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// A running ipykernel process and the daemon's sockets to it.
pub struct Ipykernel {
    /// Position among the local kernel's processes.
    pub index: usize,
    /// The ipykernel process (shared with the socket readers, which kill a kernel that
    /// breaks the protocol).
    pub process: Arc<KernelProcess>,
    /// Its connection file contents.
    pub conn: ConnectionInfo,
    signer: Signer,
    shell: Mutex<DealerSendHalf>,
    control: Mutex<DealerSendHalf>,
    stdin: Mutex<DealerSendHalf>,
    readers: Vec<JoinHandle<()>>,
    max_message_bytes: usize,
}

impl Drop for Ipykernel {
    fn drop(&mut self) {
        for r in &self.readers {
            r.abort();
        }
    }
}

impl std::fmt::Debug for Ipykernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ipykernel").field("index", &self.index).field("pid", &self.process.pid()).finish()
    }
}

impl Ipykernel {
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
        let process = Arc::new(KernelProcess::start(launch, &file).await?);
        let signer = Signer::new(conn.key.as_bytes());
        let (pid, cap) = (process.pid(), launch.max_message.0);
        let sockets = async {
            // Shell, control and stdin share one identity: ipykernel addresses an
            // input_request on stdin to the identity that sent the execute_request on shell.
            let identity = Bytes::from(format!("nbos-{}", super::connection::random_hex(8)?));
            let (shell_tx, shell_rx) = dealer(&conn, conn.shell_port, &identity, pid, cap).await?.split();
            let (control_tx, control_rx) = dealer(&conn, conn.control_port, &identity, pid, cap).await?.split();
            let (stdin_tx, stdin_rx) = dealer(&conn, conn.stdin_port, &identity, pid, cap).await?.split();
            let mut iopub = SubSocket::with_options(sockets::options(cap));
            wait_listening(&conn, conn.iopub_port, pid).await?;
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
        let reader = |channel| Reader {
            channel,
            signer: signer.clone(),
            hub: hub.clone(),
            metrics: metrics.clone(),
            process: process.clone(),
        };
        let readers = vec![
            spawn_reader(reader(Channel::Shell), shell_rx),
            spawn_reader(reader(Channel::Control), control_rx),
            spawn_reader(reader(Channel::Stdin), stdin_rx),
            spawn_reader(reader(Channel::Iopub), iopub),
        ];
        Ok(Self {
            max_message_bytes: cap,
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
            let mut hb = ReqSocket::with_options(sockets::options(self.max_message_bytes));
            hb.connect(&endpoint).await.ok()?;
            hb.send(ZmqMessage::from("ping")).await.ok()?;
            let back = hb.recv().await.ok()?;
            (back.get(0).map(|b| b.as_ref()) == Some(b"ping".as_ref())).then_some(())
        };
        matches!(tokio::time::timeout(timeout, ping).await, Ok(Some(())))
    }
}

/// How often a port the kernel has not opened yet is looked up again.
const LISTEN_POLL: Duration = Duration::from_millis(50);

/// Returns once the kernel `pid` listens on its `port`; fails when another process does
/// (the daemon never connects to a socket that is not its kernel's: [`port_owner`]).
///
/// The daemon connects only once the port is open: zeromq 0.7 retries a refused connect
/// after 50 ms, doubling the wait each time up to 30 s, so a kernel that opened its ports
/// 13 s after it started (its imports on a loaded host) was reached at about 26 s, and one
/// that opened them after about 26 s not before [`CONNECT_TIMEOUT`].
async fn wait_listening(conn: &ConnectionInfo, port: u16, pid: u32) -> anyhow::Result<()> {
    let ip: std::net::IpAddr =
        conn.ip.parse().with_context(|| format!("the kernel's ip {:?} is not an IP address", conn.ip))?;
    loop {
        match port_owner::listener(ip, port, pid)? {
            Listener::Kernel => return Ok(()),
            Listener::Another => return Err(PortTaken { port, pid }.into()),
            Listener::Nobody => tokio::time::sleep(LISTEN_POLL).await,
        }
    }
}

async fn dealer(
    conn: &ConnectionInfo,
    port: u16,
    identity: &Bytes,
    pid: u32,
    max_message_bytes: usize,
) -> anyhow::Result<DealerSocket> {
    let mut opts = sockets::options(max_message_bytes);
    opts.peer_identity(identity.clone().try_into().map_err(|e| anyhow::anyhow!("socket identity: {e}"))?);
    let mut s = DealerSocket::with_options(opts);
    wait_listening(conn, port, pid).await?;
    s.connect(&conn.endpoint(port)).await.with_context(|| format!("connecting to the kernel at port {port}"))?;
    Ok(s)
}

/// What a socket reader needs: where messages go, and the process to kill when it breaks
/// the protocol.
struct Reader {
    channel: Channel,
    signer: Signer,
    hub: Arc<Hub>,
    metrics: Arc<Metrics>,
    process: Arc<KernelProcess>,
}

fn spawn_reader<S: SocketRecv + Send + 'static>(r: Reader, mut sock: S) -> JoinHandle<()> {
    tokio::spawn(async move {
        let channel = r.channel;
        loop {
            let zmsg = match sock.recv().await {
                Ok(m) => m,
                Err(e) if sockets::is_protocol_violation(&e) => {
                    // An oversized or malformed frame comes from code in the kernel (or a
                    // process that wrote to its socket): the socket is gone, and a kernel
                    // that cannot be talked to is stopped, which its owner sees as a death.
                    r.metrics
                        .messages_dropped_total
                        .get_or_create(&DropLabels { source: "kernel".into(), reason: "protocol_violation".into() })
                        .inc();
                    tracing::error!(
                        channel = channel.as_str(),
                        pid = r.process.pid(),
                        error = %e,
                        "the kernel broke the ZMQ protocol (an oversized or malformed frame): killing it"
                    );
                    if let Err(e) = r.process.signal(crate::sys::signals::SIGKILL) {
                        tracing::warn!(pid = r.process.pid(), error = format!("{e:#}"), "could not kill the kernel");
                    }
                    return;
                }
                Err(e) => {
                    tracing::debug!(channel = channel.as_str(), error = %e, "kernel socket closed");
                    return;
                }
            };
            match wire::parse(zmsg.into_vec(), &r.signer) {
                Ok((_ids, msg)) => r.hub.deliver(channel, msg, SystemTime::now()),
                Err(e) => {
                    r.metrics
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
        let (pid, cap) = (std::process::id(), sockets::DEFAULT_MAX_MESSAGE_BYTES);
        let connected = tokio::time::timeout(BOUND, dealer(&conn, conn.shell_port, &identity, pid, cap)).await;
        kernel.abort();
        let socket = connected.expect("connected soon after the kernel opened its port, not at a backed-off retry");
        socket.expect("connect");
    }

    /// Issue 29: ports are picked, released, then bound by the kernel; a local process that
    /// binds one first is never connected to (it could send the daemon anything).
    #[tokio::test]
    async fn a_port_another_process_listens_on_is_never_connected_to() {
        let conn = ConnectionInfo::new_loopback("python3").expect("ports");
        let squatter = "import socket,sys\n\
            s=socket.socket()\n\
            s.bind(('127.0.0.1',int(sys.argv[1])))\n\
            s.listen()\n\
            print('listening',flush=True)\n\
            sys.stdin.read()\n\
            s.setblocking(False)\n\
            try:\n s.accept(); print('connected')\n\
            except BlockingIOError:\n print('untouched')\n";
        let mut child = tokio::process::Command::new("python3")
            .args(["-c", squatter, &conn.shell_port.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        let mut out = tokio::io::BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line).await.expect("listening");
        assert_eq!(line.trim(), "listening");

        let identity = Bytes::from_static(b"nbos-test");
        // The "kernel" is this test process, which does not hold the listener.
        let (pid, cap) = (std::process::id(), sockets::DEFAULT_MAX_MESSAGE_BYTES);
        let connected =
            tokio::time::timeout(Duration::from_secs(10), dealer(&conn, conn.shell_port, &identity, pid, cap))
                .await
                .expect("an answer");
        let Err(err) = connected else { panic!("connected to another process's port") };
        assert!(err.chain().any(|c| c.is::<PortTaken>()), "{err:#}");

        drop(child.stdin.take());
        line.clear();
        tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line).await.expect("verdict");
        let _ = child.wait().await;
        assert_eq!(line.trim(), "untouched", "the daemon connected to the squatter");
    }
}
