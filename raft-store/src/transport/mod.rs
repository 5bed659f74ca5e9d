//! TCP transport between nodes: ONE connection per pair of nodes, carrying every group's messages
//! in both directions.
//!
//! The node with the smaller id dials (re-dialling with exponential backoff); the other accepts.
//! Either way the connection then serves both directions: a reader feeds the engine, a writer drains
//! that peer's bounded outbound queue. When a newer connection to the same peer comes up, the older
//! one is closed. When a queue is full the message is dropped and counted (raft retransmits), so
//! memory stays bounded. Authentication (mutual TLS, then the HELLO's node id checked against the
//! certificate) happens before any protobuf byte is decoded (RUSTSEC-2024-0437), and every frame
//! is size-capped from its length prefix first.

pub mod frame;
pub mod tls;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use protobuf::Message as _;
use raft::eraftpb::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use self::frame::{Frame, FrameError};
use self::tls::TlsPair;
use crate::engine::request::Inbound;
use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// How long a peer gets to finish the TLS handshake and say HELLO.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Frames written per flush.
const WRITE_BATCH: usize = 256;
/// Connections accepted but not yet authenticated (TLS handshake and HELLO) at any one time;
/// further ones are closed at once, so a connection flood cannot hold unbounded memory.
pub const MAX_PENDING_HANDSHAKES: usize = 128;

/// What the transport hands FORWARD and ANSWER frames to (the forwarder, `crate::forward`). A
/// trait so that the transport, the lower layer, knows nothing of what forwarded requests are.
pub(crate) trait ForwardHandler: Send + Sync {
    /// Frames one connection's forwarding queue holds (requests sent and answers owed); beyond
    /// it a request is not sent and an answer is dropped (its requester times out).
    fn queue_frames(&self) -> usize;
    /// A FORWARD frame from the authenticated `peer`: decodes it now (`Err`: garbage, the
    /// connection is closed) and returns the work that yields the ANSWER frame, if any.
    fn on_request(
        self: Arc<Self>,
        peer: u64,
        request_id: u64,
        payload: Bytes,
    ) -> std::result::Result<ServeFuture, String>;
    /// An ANSWER frame from `peer`; `Err` when its body does not decode (the connection is closed).
    fn on_answer(&self, peer: u64, request_id: u64, payload: &[u8]) -> std::result::Result<(), String>;
    /// The connection `generation` to `peer` ended.
    fn on_connection_closed(&self, peer: u64, generation: u64);
}

/// Serving a forwarded request: the ANSWER frame to send back, or `None`.
pub(crate) type ServeFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Option<Bytes>> + Send>>;

struct Shared {
    node_id: u64,
    max_frame: usize,
    queue_depth: usize,
    keepalive: Duration,
    links: RwLock<HashMap<u64, Arc<Link>>>,
    addrs: RwLock<HashMap<u64, SocketAddr>>,
    dialers: Mutex<HashSet<u64>>,
    blocked: RwLock<HashSet<u64>>,
    last_seen: Mutex<HashMap<u64, Instant>>,
    metrics: Arc<Metrics>,
    tls: Option<TlsPair>,
    handshakes: Arc<tokio::sync::Semaphore>,
    inbound: crossbeam_channel::Sender<Inbound>,
    forwarder: Arc<dyn ForwardHandler>,
    rt: tokio::runtime::Handle,
}

/// Handle to the transport (cheap to clone).
#[derive(Clone)]
pub(crate) struct Transport {
    shared: Arc<Shared>,
}

/// The outbound side of one peer: its bounded queue, drained by whichever connection is current.
struct Link {
    tx: mpsc::Sender<Bytes>,
    rx: tokio::sync::Mutex<mpsc::Receiver<Bytes>>,
    /// Incremented by every new connection; an older connection seeing a newer number closes.
    generation: std::sync::atomic::AtomicU64,
    newer: tokio::sync::Notify,
    /// The current connection's queue for forwarding frames, with its generation. Unlike `tx`,
    /// it dies with its connection: a forwarded request is sent now or not at all.
    forward: Mutex<Option<(u64, mpsc::Sender<Bytes>)>>,
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}
type BoxedIo = Box<dyn Io>;

enum ReadError {
    /// The peer closed the stream between frames.
    Closed,
    Truncated,
    Frame(FrameError),
    Io(std::io::Error),
}

async fn read_frame<R: AsyncRead + Unpin>(r: &mut R, max: usize) -> std::result::Result<Frame, ReadError> {
    let first = match r.read_u8().await {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(ReadError::Closed),
        Err(e) => return Err(ReadError::Io(e)),
    };
    let mut rest = [0u8; frame::HEADER_LEN - 1];
    let eof = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            ReadError::Truncated
        } else {
            ReadError::Io(e)
        }
    };
    r.read_exact(&mut rest).await.map_err(eof)?;
    let len = u32::from_be_bytes([first, rest[0], rest[1], rest[2]]);
    let len = frame::check_len(len, max).map_err(ReadError::Frame)?;
    let mut body = BytesMut::zeroed(len);
    r.read_exact(&mut body).await.map_err(eof)?;
    frame::decode(body.freeze()).map_err(ReadError::Frame)
}

impl Transport {
    /// Binds the listener and starts dialling `peers`.
    pub(crate) fn start(
        cfg: &crate::config::StoreConfig,
        metrics: Arc<Metrics>,
        inbound: crossbeam_channel::Sender<Inbound>,
        forwarder: Arc<dyn ForwardHandler>,
        rt: tokio::runtime::Handle,
    ) -> Result<Self> {
        let tls = match &cfg.security {
            crate::config::TransportSecurity::MutualTls { ca_cert, cert, key } => Some(tls::load(ca_cert, cert, key)?),
            crate::config::TransportSecurity::Plaintext => {
                tracing::warn!(node = cfg.node_id, "raft transport is PLAINTEXT (configured explicitly)");
                None
            }
        };
        let std_listener = std::net::TcpListener::bind(cfg.listen)
            .map_err(|e| Error::io(format!("bind raft transport on {}", cfg.listen), e))?;
        std_listener.set_nonblocking(true).map_err(|e| Error::io("set listener non-blocking", e))?;
        let shared = Arc::new(Shared {
            node_id: cfg.node_id,
            max_frame: cfg.max_frame_bytes,
            queue_depth: cfg.peer_queue_depth,
            keepalive: cfg.tick_interval,
            links: RwLock::new(HashMap::new()),
            addrs: RwLock::new(HashMap::new()),
            dialers: Mutex::new(HashSet::new()),
            blocked: RwLock::new(HashSet::new()),
            last_seen: Mutex::new(HashMap::new()),
            metrics,
            tls,
            handshakes: Arc::new(tokio::sync::Semaphore::new(MAX_PENDING_HANDSHAKES)),
            inbound,
            forwarder,
            rt: rt.clone(),
        });
        let listener = {
            let _guard = rt.enter();
            TcpListener::from_std(std_listener).map_err(|e| Error::io("register listener", e))?
        };
        rt.spawn(accept_loop(shared.clone(), listener));
        let t = Transport { shared };
        for (id, addr) in &cfg.peers {
            t.add_peer(*id, *addr);
        }
        Ok(t)
    }

    /// Adds (or re-addresses) a peer. The node with the smaller id dials; the other waits.
    pub(crate) fn add_peer(&self, peer: u64, addr: SocketAddr) {
        self.shared.link(peer);
        if let Ok(mut a) = self.shared.addrs.write() {
            a.insert(peer, addr);
        }
        if self.shared.node_id < peer {
            let first = self.shared.dialers.lock().is_ok_and(|mut d| d.insert(peer));
            if first {
                self.shared.rt.spawn(dial_loop(self.shared.clone(), peer));
            }
        }
    }

    /// Test seam: drop all traffic to and from `peer` (both raft messages and keepalives).
    pub(crate) fn set_blocked(&self, peer: u64, blocked: bool) {
        if let Ok(mut b) = self.shared.blocked.write() {
            if blocked {
                b.insert(peer);
            } else {
                b.remove(&peer);
            }
        }
    }

    /// When a frame last arrived from `peer`.
    pub(crate) fn last_seen(&self, peer: u64) -> Option<Instant> {
        self.shared.last_seen.lock().ok()?.get(&peer).copied()
    }

    /// Queues a forwarding frame on the connection to `peer` that is up now; returns that
    /// connection's generation, or `None` when no connection is up (or its queue is full).
    pub(crate) fn send_forward(&self, peer: u64, frame: Bytes) -> Option<u64> {
        let link = self.shared.links.read().ok().and_then(|p| p.get(&peer).cloned())?;
        let current = link.forward.lock().ok()?;
        let (generation, tx) = current.as_ref()?;
        if self.shared.is_blocked(peer) {
            return Some(*generation); // lost "on the wire", like a real partition
        }
        tx.try_send(frame).ok()?;
        Some(*generation)
    }

    /// Queues a message; false when it could not be queued (the caller tells raft).
    pub(crate) fn send(&self, group: u64, msg: Message) -> bool {
        let m = &self.shared.metrics;
        if self.shared.is_blocked(msg.to) {
            m.drop_msg("partitioned");
            return true; // lost "on the wire", like a real partition
        }
        let payload = match msg.write_to_bytes() {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %e, "cannot encode raft message");
                return false;
            }
        };
        let Some(frame) = frame::raft(group, &payload, self.shared.max_frame) else {
            m.drop_msg("too_large");
            tracing::warn!(group, to = msg.to, bytes = payload.len(), "raft message exceeds the frame cap; dropped");
            return false;
        };
        let link = self.shared.links.read().ok().and_then(|p| p.get(&msg.to).cloned());
        let Some(link) = link else {
            m.drop_msg("no_route");
            return false;
        };
        match link.tx.try_send(frame) {
            Ok(()) => true,
            Err(_) => {
                m.drop_msg("queue_full");
                false
            }
        }
    }
}

impl Shared {
    /// The peer's link, created on first use (an accepted connection may come before `add_peer`).
    fn link(&self, peer: u64) -> Arc<Link> {
        if let Some(l) = self.links.read().ok().and_then(|l| l.get(&peer).cloned()) {
            return l;
        }
        let mut links = match self.links.write() {
            Ok(l) => l,
            Err(p) => p.into_inner(),
        };
        links
            .entry(peer)
            .or_insert_with(|| {
                let (tx, rx) = mpsc::channel(self.queue_depth);
                Arc::new(Link {
                    tx,
                    rx: tokio::sync::Mutex::new(rx),
                    generation: std::sync::atomic::AtomicU64::new(0),
                    newer: tokio::sync::Notify::new(),
                    forward: Mutex::new(None),
                })
            })
            .clone()
    }

    fn is_blocked(&self, peer: u64) -> bool {
        self.blocked.read().is_ok_and(|b| b.contains(&peer))
    }

    fn touch(&self, peer: u64) {
        if let Ok(mut m) = self.last_seen.lock() {
            m.insert(peer, Instant::now());
        }
    }
}

async fn connect(shared: &Shared, peer: u64, addr: SocketAddr) -> std::io::Result<BoxedIo> {
    let sock = TcpStream::connect(addr).await?;
    sock.set_nodelay(true)?;
    let mut stream: BoxedIo = match &shared.tls {
        Some(tls) => {
            // rustls checks that the server's certificate names `node-<peer>`.
            let name = rustls::pki_types::ServerName::try_from(tls::node_name(peer))
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
            let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.connector.connect(name, sock))
                .await
                .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake timed out"))??;
            Box::new(stream)
        }
        None => Box::new(sock),
    };
    stream.write_all(&frame::hello(shared.node_id)).await?;
    stream.flush().await?;
    Ok(stream)
}

async fn dial_loop(shared: Arc<Shared>, peer: u64) {
    let mut backoff = BACKOFF_MIN;
    loop {
        let addr = shared.addrs.read().ok().and_then(|a| a.get(&peer).copied());
        if let Some(addr) = addr {
            match connect(&shared, peer, addr).await {
                Ok(stream) => {
                    tracing::debug!(peer, %addr, "connected to peer");
                    backoff = BACKOFF_MIN;
                    run_connection(&shared, peer, addr, stream).await;
                }
                Err(e) => tracing::debug!(peer, %addr, error = %e, "cannot connect to peer"),
            }
        }
        let jitter = Duration::from_millis(rand::random::<u64>() % 25);
        tokio::time::sleep(backoff + jitter).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Serves an authenticated connection in both directions until it breaks or a newer one replaces it.
async fn run_connection(shared: &Arc<Shared>, peer: u64, addr: SocketAddr, stream: BoxedIo) {
    let link = shared.link(peer);
    let generation = link.generation.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
    link.newer.notify_waiters();
    let (forward_tx, mut forward_rx) = mpsc::channel(shared.forwarder.queue_frames());
    if let Ok(mut f) = link.forward.lock() {
        *f = Some((generation, forward_tx));
    }
    if !shared.is_blocked(peer) {
        shared.touch(peer);
        let _ = shared.inbound.try_send(Inbound::PeerConnected { peer });
    }
    shared.metrics.peer_connections.inc();
    let (r, w) = tokio::io::split(stream);
    let mut r = BufReader::with_capacity(64 << 10, r);
    let superseded = async {
        loop {
            let notified = link.newer.notified();
            if link.generation.load(std::sync::atomic::Ordering::SeqCst) != generation {
                return;
            }
            notified.await;
        }
    };
    let writer = async {
        let mut rx = link.rx.lock().await;
        pump(shared, peer, w, &mut rx, &mut forward_rx).await
    };
    tokio::select! {
        () = read_frames(shared, peer, addr, &mut r) => {}
        res = writer => {
            if let Err(e) = res {
                tracing::debug!(peer, %addr, error = %e, "connection to peer lost");
            }
        }
        () = superseded => tracing::debug!(peer, %addr, "connection replaced by a newer one"),
    }
    if let Ok(mut f) = link.forward.lock() {
        if f.as_ref().is_some_and(|(g, _)| *g == generation) {
            *f = None;
        }
    }
    shared.forwarder.on_connection_closed(peer, generation);
    shared.metrics.peer_connections.dec();
}

async fn pump(
    shared: &Shared,
    peer: u64,
    mut w: tokio::io::WriteHalf<BoxedIo>,
    rx: &mut mpsc::Receiver<Bytes>,
    forward_rx: &mut mpsc::Receiver<Bytes>,
) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(64 << 10);
    loop {
        let first = tokio::select! {
            m = rx.recv() => match m {
                Some(m) => m,
                None => return Ok(()),
            },
            Some(m) = forward_rx.recv() => m,
            _ = tokio::time::sleep(shared.keepalive) => {
                if !shared.is_blocked(peer) {
                    w.write_all(&frame::keepalive()).await?;
                    w.flush().await?;
                }
                continue;
            }
        };
        buf.clear();
        buf.extend_from_slice(&first);
        for _ in 1..WRITE_BATCH {
            match rx.try_recv().or_else(|_| forward_rx.try_recv()) {
                Ok(m) => buf.extend_from_slice(&m),
                Err(_) => break,
            }
        }
        w.write_all(&buf).await?;
        w.flush().await?;
    }
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((sock, addr)) => {
                let Ok(permit) = shared.handshakes.clone().try_acquire_owned() else {
                    shared.metrics.reject("handshake_limit");
                    tracing::warn!(%addr, limit = MAX_PENDING_HANDSHAKES, "raft transport: too many unauthenticated connections; closing");
                    continue;
                };
                let _ = sock.set_nodelay(true);
                tokio::spawn(serve_inbound(shared.clone(), sock, addr, permit));
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept on raft transport failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn serve_inbound(
    shared: Arc<Shared>,
    sock: TcpStream,
    addr: SocketAddr,
    handshake: tokio::sync::OwnedSemaphorePermit,
) {
    let m = &shared.metrics;
    let (stream, cert): (BoxedIo, _) = match &shared.tls {
        Some(tls) => match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.acceptor.accept(sock)).await {
            Ok(Ok(s)) => {
                let cert = s.get_ref().1.peer_certificates().and_then(|c| c.first().cloned());
                (Box::new(s), cert)
            }
            Ok(Err(e)) => {
                m.reject("tls");
                tracing::warn!(%addr, error = %e, "raft transport: TLS handshake refused");
                return;
            }
            Err(_) => {
                m.reject("tls");
                tracing::warn!(%addr, "raft transport: TLS handshake timed out");
                return;
            }
        },
        None => (Box::new(sock), None),
    };
    // Read the HELLO byte by byte through a reader we then hand on, so nothing is lost.
    let mut stream = BufReader::with_capacity(64 << 10, stream);
    // The HELLO is tiny: a longer length prefix is refused before anything is allocated for it
    // (in plaintext mode the peer is not authenticated yet).
    let peer = match tokio::time::timeout(HANDSHAKE_TIMEOUT, read_frame(&mut stream, frame::HELLO_FRAME_LEN)).await {
        Ok(Ok(Frame::Hello { node_id })) => node_id,
        Ok(Ok(_)) => {
            m.reject("garbage");
            tracing::warn!(%addr, "raft transport: first frame is not HELLO; closing");
            return;
        }
        Ok(Err(e)) => {
            report_read_error(&shared, addr, None, e);
            return;
        }
        Err(_) => {
            m.reject("truncated");
            tracing::warn!(%addr, "raft transport: no HELLO in time; closing");
            return;
        }
    };
    if let Some(cert) = &cert {
        if !tls::cert_names_node(cert, peer) {
            m.reject("identity");
            tracing::warn!(%addr, claimed = peer, "raft transport: certificate does not name the claimed node; closing");
            return;
        }
    }
    if peer == shared.node_id {
        m.reject("identity");
        tracing::warn!(%addr, "raft transport: a peer claims this node's own id; closing");
        return;
    }
    drop(handshake);
    run_connection(&shared, peer, addr, Box::new(stream)).await;
}

/// Reads frames from an authenticated peer until the connection ends or misbehaves.
async fn read_frames<R: AsyncRead + Unpin>(shared: &Arc<Shared>, peer: u64, addr: SocketAddr, r: &mut R) {
    let m = &shared.metrics;
    loop {
        match read_frame(r, shared.max_frame).await {
            Ok(Frame::Keepalive) => {
                if !shared.is_blocked(peer) {
                    shared.touch(peer);
                }
            }
            Ok(Frame::Raft { group, payload }) => {
                if shared.is_blocked(peer) {
                    continue;
                }
                shared.touch(peer);
                let msg = match Message::parse_from_bytes(&payload) {
                    Ok(msg) => msg,
                    Err(e) => {
                        m.reject("garbage");
                        tracing::warn!(%addr, peer, group, error = %e, "raft transport: undecodable raft message; closing");
                        return;
                    }
                };
                if msg.from != peer || msg.to != shared.node_id {
                    m.reject("wrong_sender");
                    tracing::warn!(%addr, peer, group, from = msg.from, to = msg.to, "raft transport: message not from/to the connected nodes; dropped");
                    continue;
                }
                if shared.inbound.try_send(Inbound::Raft { group, msg }).is_err() {
                    m.drop_msg("inbox_full");
                }
            }
            Ok(Frame::Forward { request_id, payload }) => {
                if shared.is_blocked(peer) {
                    continue;
                }
                shared.touch(peer);
                // The peer is authenticated and the frame is capped: only now is the body decoded.
                let serve = match shared.forwarder.clone().on_request(peer, request_id, payload) {
                    Ok(serve) => serve,
                    Err(e) => {
                        m.reject("garbage");
                        tracing::warn!(%addr, peer, error = %e, "raft transport: undecodable forwarded request; closing");
                        return;
                    }
                };
                let shared2 = shared.clone();
                shared.rt.spawn(async move {
                    if let Some(answer) = serve.await {
                        let t = Transport { shared: shared2 };
                        if t.send_forward(peer, answer).is_none() {
                            tracing::debug!(
                                peer,
                                request_id,
                                "answer to a forwarded request not sent: connection gone"
                            );
                        }
                    }
                });
            }
            Ok(Frame::Answer { request_id, payload }) => {
                if shared.is_blocked(peer) {
                    continue;
                }
                shared.touch(peer);
                if let Err(e) = shared.forwarder.on_answer(peer, request_id, &payload) {
                    m.reject("garbage");
                    tracing::warn!(%addr, peer, error = %e, "raft transport: undecodable forwarding answer; closing");
                    return;
                }
            }
            Ok(Frame::Hello { .. }) => {
                m.reject("garbage");
                tracing::warn!(%addr, peer, "raft transport: second HELLO; closing");
                return;
            }
            Err(e) => {
                report_read_error(shared, addr, Some(peer), e);
                return;
            }
        }
    }
}

fn report_read_error(shared: &Shared, addr: SocketAddr, peer: Option<u64>, e: ReadError) {
    let m = &shared.metrics;
    match e {
        ReadError::Closed => tracing::debug!(%addr, ?peer, "raft transport: peer closed the connection"),
        ReadError::Truncated => {
            m.reject("truncated");
            tracing::warn!(%addr, ?peer, "raft transport: truncated frame; closing");
        }
        ReadError::Frame(e) => {
            m.reject(e.reason());
            tracing::warn!(%addr, ?peer, error = %e, "raft transport: bad frame; closing");
        }
        ReadError::Io(e) => tracing::debug!(%addr, ?peer, error = %e, "raft transport: read failed"),
    }
}
