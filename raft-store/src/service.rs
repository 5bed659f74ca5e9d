//! A node process around a [`RaftStore`] with a small JSON-lines client API on TCP.
//!
//! This is what the multi-process tests and `nbos bench raft` run: one process per node, driven
//! from outside. The client API is unauthenticated and meant for loopback; the daemon embeds the
//! library directly instead. Each request is one JSON object on one line (at most
//! [`MAX_REQUEST_BYTES`]); each answer is one line `{"ok":true,"result":…}` or
//! `{"ok":false,"error":{"kind":…,"message":…,"leader":…}}`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::config::StoreConfig;
use crate::engine::request::MembershipChange;
use crate::error::Error;
use crate::store::RaftStore;

/// Longest request line accepted.
pub const MAX_REQUEST_BYTES: usize = 1 << 20;

/// Configuration of a node process.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeServiceConfig {
    /// The store.
    pub store: StoreConfig,
    /// Where the JSON client API listens (loopback).
    pub client_listen: SocketAddr,
    /// Groups to create at start (when absent) with `bootstrap_voters` as founding voters.
    #[serde(default)]
    pub bootstrap_groups: Vec<u64>,
    /// Founding voters of the bootstrap groups.
    #[serde(default)]
    pub bootstrap_voters: Vec<u64>,
}

/// A client request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Put a key.
    Put {
        /// Group.
        group: u64,
        /// Key.
        key: String,
        /// Value.
        value: String,
    },
    /// Get a key (linearizable unless `stale`).
    Get {
        /// Group.
        group: u64,
        /// Key.
        key: String,
        /// Serve from local state.
        #[serde(default)]
        stale: bool,
    },
    /// Delete a key.
    Delete {
        /// Group.
        group: u64,
        /// Key.
        key: String,
    },
    /// Compare and swap.
    Cas {
        /// Group.
        group: u64,
        /// Key.
        key: String,
        /// Expected current value (`null` = absent).
        expected: Option<String>,
        /// New value.
        value: String,
    },
    /// Atomic transaction: if every compare holds apply `success`, else `failure`.
    Txn {
        /// Group.
        group: u64,
        /// Conditions.
        #[serde(default)]
        compares: Vec<TxnCompare>,
        /// Operations when every compare holds.
        #[serde(default)]
        success: Vec<TxnStep>,
        /// Operations otherwise.
        #[serde(default)]
        failure: Vec<TxnStep>,
    },
    /// Prefix range (linearizable unless `stale`).
    Range {
        /// Group.
        group: u64,
        /// Prefix.
        prefix: String,
        /// Maximum keys (0 = all).
        #[serde(default)]
        limit: usize,
        /// Serve from local state.
        #[serde(default)]
        stale: bool,
    },
    /// Raft status of a group on this node.
    Status {
        /// Group.
        group: u64,
    },
    /// Create groups `first..first+count` with the given voters.
    CreateGroups {
        /// First id.
        first: u64,
        /// How many.
        count: u64,
        /// Founding voters.
        voters: Vec<u64>,
    },
    /// Create an empty replica that waits to be added.
    JoinGroup {
        /// Group.
        group: u64,
    },
    /// Membership change (leader only).
    ChangeMembership {
        /// Group.
        group: u64,
        /// Changes (joint consensus when more than one).
        changes: Vec<MembershipChange>,
    },
    /// Leader transfer.
    TransferLeader {
        /// Group.
        group: u64,
        /// Target node.
        to: u64,
    },
    /// Add a peer address.
    AddPeer {
        /// Node id.
        node: u64,
        /// Its transport address.
        addr: SocketAddr,
    },
    /// Test seam: drop traffic to and from a peer.
    SetBlocked {
        /// Peer.
        peer: u64,
        /// Drop or restore.
        blocked: bool,
    },
    /// Prometheus text of the store's metrics.
    Metrics,
    /// Resident set size of this process in bytes.
    Rss,
    /// Serve `request` on this node, forwarding it to the group's leader when this node is not
    /// (the library's default). Every other request is served as a leader-only client expects:
    /// `not_leader` with a hint on a follower.
    Routed {
        /// The request.
        request: Box<Request>,
    },
}

impl Request {
    /// The group the request addresses, if any.
    pub fn group(&self) -> Option<u64> {
        match self {
            Request::Put { group, .. }
            | Request::Get { group, .. }
            | Request::Delete { group, .. }
            | Request::Cas { group, .. }
            | Request::Txn { group, .. }
            | Request::Range { group, .. }
            | Request::Status { group }
            | Request::JoinGroup { group }
            | Request::ChangeMembership { group, .. }
            | Request::TransferLeader { group, .. } => Some(*group),
            Request::Routed { request } => request.group(),
            _ => None,
        }
    }
}

/// A transaction condition in the client API.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "is", rename_all = "snake_case", deny_unknown_fields)]
pub enum TxnCompare {
    /// The key exists with this value.
    Equals {
        /// Key.
        key: String,
        /// Value.
        value: String,
    },
    /// The key does not exist.
    Absent {
        /// Key.
        key: String,
    },
    /// The key exists.
    Present {
        /// Key.
        key: String,
    },
}

/// A transaction operation in the client API.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum TxnStep {
    /// Set a key.
    Put {
        /// Key.
        key: String,
        /// Value.
        value: String,
        /// Lease to attach it to.
        #[serde(default)]
        lease: Option<u64>,
    },
    /// Remove a key.
    Delete {
        /// Key.
        key: String,
    },
    /// Remove every key under a prefix.
    DeletePrefix {
        /// Prefix.
        prefix: String,
    },
}

impl From<TxnCompare> for crate::state_machine::Compare {
    fn from(c: TxnCompare) -> Self {
        match c {
            TxnCompare::Equals { key, value } => crate::state_machine::Compare::value_equals(key, value),
            TxnCompare::Absent { key } => crate::state_machine::Compare::absent(key),
            TxnCompare::Present { key } => crate::state_machine::Compare::present(key),
        }
    }
}

impl From<TxnStep> for crate::state_machine::TxnOp {
    fn from(s: TxnStep) -> Self {
        match s {
            TxnStep::Put { key, value, lease } => {
                crate::state_machine::TxnOp::Put { key: key.into_bytes(), value: value.into_bytes(), lease }
            }
            TxnStep::Delete { key } => crate::state_machine::TxnOp::delete(key),
            TxnStep::DeletePrefix { prefix } => crate::state_machine::TxnOp::delete_prefix(prefix),
        }
    }
}

/// An error as the client API reports it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ErrorBody {
    /// [`Error::kind`], or `bad_request`.
    pub kind: String,
    /// Human-readable message.
    pub message: String,
    /// Leader hint for `not_leader`.
    #[serde(default)]
    pub leader: Option<u64>,
}

/// A client API answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Response {
    /// Success.
    pub ok: bool,
    /// The result on success.
    #[serde(default)]
    pub result: Value,
    /// The error otherwise.
    #[serde(default)]
    pub error: Option<ErrorBody>,
}

impl Response {
    fn ok(result: Value) -> Self {
        Response { ok: true, result, error: None }
    }

    fn err(e: &Error) -> Self {
        let leader = match e {
            Error::NotLeader { hint, .. } => *hint,
            _ => None,
        };
        Response {
            ok: false,
            result: Value::Null,
            error: Some(ErrorBody { kind: e.kind().to_owned(), message: e.to_string(), leader }),
        }
    }

    fn bad_request(message: String) -> Self {
        Response {
            ok: false,
            result: Value::Null,
            error: Some(ErrorBody { kind: "bad_request".into(), message, leader: None }),
        }
    }

    /// The error kind, if failed.
    pub fn error_kind(&self) -> Option<&str> {
        self.error.as_ref().map(|e| e.kind.as_str())
    }
}

/// A loopback address whose port is free now, chosen below Linux's ephemeral range (32768+) so
/// that outgoing connections of the same machine cannot take it between choosing and binding.
/// For tests and benchmarks that start node processes.
pub fn free_loopback_addr() -> std::io::Result<SocketAddr> {
    use std::sync::atomic::{AtomicU16, Ordering};
    // Start at a random place so that concurrent processes rarely probe the same ports.
    static NEXT: AtomicU16 = AtomicU16::new(0);
    const LOW: u16 = 20_000;
    const SPAN: u16 = 12_000;
    let _ = NEXT.compare_exchange(0, rand::random::<u16>() % SPAN + 1, Ordering::SeqCst, Ordering::SeqCst);
    for _ in 0..SPAN {
        let port = LOW + NEXT.fetch_add(1, Ordering::SeqCst) % SPAN;
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            return l.local_addr();
        }
    }
    Err(std::io::Error::new(std::io::ErrorKind::AddrInUse, "no free loopback port in 20000..32000"))
}

/// Resident set size of this process in bytes (Linux).
pub fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

async fn handle(store: &RaftStore, req: Request, forward: bool) -> Result<Value, Error> {
    let kv = |group: u64| if forward { store.kv(group) } else { store.kv(group).local_only() };
    Ok(match req {
        Request::Routed { request } => Box::pin(handle(store, *request, true)).await?,
        Request::Put { group, key, value } => {
            kv(group).put(key, value).await?;
            Value::Null
        }
        Request::Get { group, key, stale } => {
            let kv = kv(group);
            let (value, applied) = if stale {
                let out = kv.get_stale(key).await?;
                (out.kvs.first().map(|k| text(&k.value)), Some(out.applied_index))
            } else {
                (kv.get(key).await?.map(|k| text(&k.value)), None)
            };
            json!({ "value": value, "stale": stale, "applied_index": applied })
        }
        Request::Delete { group, key } => json!({ "existed": kv(group).delete(key).await? }),
        Request::Cas { group, key, expected, value } => {
            let out = kv(group).cas(key, expected.map(String::into_bytes), value).await?;
            json!({ "succeeded": out.succeeded, "previous": out.previous.map(|p| text(&p)) })
        }
        Request::Txn { group, compares, success, failure } => {
            let txn = crate::state_machine::Txn {
                compares: compares.into_iter().map(Into::into).collect(),
                success: success.into_iter().map(Into::into).collect(),
                failure: failure.into_iter().map(Into::into).collect(),
            };
            let r = kv(group).txn(txn).await?;
            json!({ "succeeded": r.succeeded, "revision": r.revision, "results": serde_json::to_value(&r.results).unwrap_or(Value::Null) })
        }
        Request::Range { group, prefix, limit, stale } => {
            let kv = kv(group);
            let kvs = if stale { kv.range_stale(prefix, limit).await?.kvs } else { kv.range(prefix, limit).await? };
            let pairs: Vec<Value> = kvs.iter().map(|k| json!([text(&k.key), text(&k.value)])).collect();
            Value::Array(pairs)
        }
        Request::Status { group } => serde_json::to_value(store.status(group).await?).unwrap_or(Value::Null),
        Request::CreateGroups { first, count, voters } => {
            for g in first..first.saturating_add(count) {
                match store.create_group(g, &voters).await {
                    Ok(()) | Err(Error::GroupExists(_)) => {}
                    Err(e) => return Err(e),
                }
            }
            Value::Null
        }
        Request::JoinGroup { group } => {
            store.join_group(group).await?;
            Value::Null
        }
        Request::ChangeMembership { group, changes } => {
            serde_json::to_value(store.change_membership(group, &changes).await?).unwrap_or(Value::Null)
        }
        Request::TransferLeader { group, to } => {
            store.transfer_leader(group, to).await?;
            Value::Null
        }
        Request::AddPeer { node, addr } => {
            store.add_peer(node, addr);
            Value::Null
        }
        Request::SetBlocked { peer, blocked } => {
            store.set_peer_blocked(peer, blocked);
            Value::Null
        }
        Request::Metrics => Value::String(store.metrics_text()),
        Request::Rss => json!(rss_bytes()),
    })
}

async fn serve_client(store: RaftStore, sock: TcpStream) {
    let (r, mut w) = sock.into_split();
    let mut r = BufReader::new(r);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = match (&mut r).take(MAX_REQUEST_BYTES as u64 + 1).read_until(b'\n', &mut line).await {
            Ok(n) => n,
            Err(_) => return,
        };
        if n == 0 {
            return;
        }
        let resp = if line.len() > MAX_REQUEST_BYTES {
            let resp = Response::bad_request(format!("request longer than {MAX_REQUEST_BYTES} bytes"));
            let _ = write_line(&mut w, &resp).await;
            return;
        } else {
            match serde_json::from_slice::<Request>(&line) {
                Ok(req) => match handle(&store, req, false).await {
                    Ok(v) => Response::ok(v),
                    Err(e) => Response::err(&e),
                },
                Err(e) => Response::bad_request(format!("cannot parse request: {e}")),
            }
        };
        if write_line(&mut w, &resp).await.is_err() {
            return;
        }
    }
}

async fn write_line(w: &mut tokio::net::tcp::OwnedWriteHalf, resp: &Response) -> std::io::Result<()> {
    let mut out = serde_json::to_vec(resp).map_err(std::io::Error::other)?;
    out.push(b'\n');
    w.write_all(&out).await
}

/// Runs a node until the process is killed: opens the store, creates the bootstrap groups and
/// serves the client API. Prints `READY <client addr>` on stdout once serving.
pub async fn run_node(cfg: NodeServiceConfig) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let store = RaftStore::open(cfg.store.clone()).context("open raft store")?;
    for g in &cfg.bootstrap_groups {
        match store.create_group(*g, &cfg.bootstrap_voters).await {
            Ok(()) | Err(Error::GroupExists(_)) => {}
            Err(e) => return Err(e).with_context(|| format!("create bootstrap group {g}")),
        }
    }
    let listener = TcpListener::bind(cfg.client_listen)
        .await
        .with_context(|| format!("bind client API on {}", cfg.client_listen))?;
    println!("READY {}", cfg.client_listen);
    loop {
        let (sock, _) = listener.accept().await.context("accept client")?;
        let _ = sock.set_nodelay(true);
        tokio::spawn(serve_client(store.clone(), sock));
    }
}

/// A connection to one node's client API.
#[derive(Debug)]
pub struct NodeClient {
    stream: BufReader<TcpStream>,
}

/// Why a client call failed without an answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// Could not connect: the request was not sent.
    #[error("connect: {0}")]
    Connect(std::io::Error),
    /// The connection broke after the request was sent: outcome unknown.
    #[error("connection lost after sending: {0}")]
    Lost(std::io::Error),
    /// No answer in time: outcome unknown.
    #[error("no answer in time")]
    Timeout,
}

impl CallError {
    /// True when the request may have taken effect.
    pub fn outcome_unknown(&self) -> bool {
        !matches!(self, CallError::Connect(_))
    }
}

impl NodeClient {
    /// Connects.
    pub async fn connect(addr: SocketAddr) -> Result<Self, CallError> {
        let s = TcpStream::connect(addr).await.map_err(CallError::Connect)?;
        let _ = s.set_nodelay(true);
        Ok(NodeClient { stream: BufReader::new(s) })
    }

    /// Sends one request and waits for its answer.
    pub async fn call(&mut self, req: &Request, timeout: Duration) -> Result<Response, CallError> {
        let mut line = serde_json::to_vec(req).map_err(|e| CallError::Connect(std::io::Error::other(e)))?;
        line.push(b'\n');
        let fut = async {
            self.stream.get_mut().write_all(&line).await.map_err(CallError::Lost)?;
            let mut buf = String::new();
            let n = self.stream.read_line(&mut buf).await.map_err(CallError::Lost)?;
            if n == 0 {
                return Err(CallError::Lost(std::io::ErrorKind::UnexpectedEof.into()));
            }
            serde_json::from_str(&buf).map_err(|e| CallError::Lost(std::io::Error::other(e)))
        };
        tokio::time::timeout(timeout, fut).await.map_err(|_| CallError::Timeout)?
    }
}

/// A client of a whole cluster that finds and follows the leader of each group.
#[derive(Debug)]
pub struct ClusterClient {
    addrs: HashMap<u64, SocketAddr>,
    conns: HashMap<u64, NodeClient>,
    leaders: HashMap<u64, u64>,
    /// Round-robin cursor over the nodes when no leader is known. It persists across calls: a node
    /// that answers nothing (a leader cut off from its quorum still believes it leads) must not be
    /// every call's first pick.
    next_node: usize,
    /// Per-call deadline.
    pub call_timeout: Duration,
}

impl ClusterClient {
    /// A client for nodes `id → client address`.
    pub fn new(addrs: HashMap<u64, SocketAddr>) -> Self {
        ClusterClient {
            addrs,
            conns: HashMap::new(),
            leaders: HashMap::new(),
            next_node: 0,
            call_timeout: Duration::from_secs(5),
        }
    }

    /// Calls one node directly.
    pub async fn call_node(&mut self, node: u64, req: &Request) -> Result<Response, CallError> {
        let addr = *self
            .addrs
            .get(&node)
            .ok_or_else(|| CallError::Connect(std::io::Error::other(format!("unknown node {node}"))))?;
        let conn = match self.conns.entry(node) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(NodeClient::connect(addr).await?),
        };
        let r = conn.call(req, self.call_timeout).await;
        if r.is_err() {
            self.conns.remove(&node);
        }
        r
    }

    /// Sends a group request to its leader, following `not_leader` hints and skipping nodes that
    /// refuse connections, until `deadline`. Returns the first definite answer, or the first
    /// error whose outcome is unknown (never retried: the caller decides).
    pub async fn call_leader(&mut self, req: &Request, deadline: Instant) -> Result<Response, CallError> {
        let group = req.group().unwrap_or(0);
        let mut nodes: Vec<u64> = self.addrs.keys().copied().collect();
        nodes.sort_unstable();
        if nodes.is_empty() {
            return Err(CallError::Connect(std::io::Error::other("the cluster client knows no node")));
        }
        loop {
            let node = match self.leaders.get(&group) {
                Some(n) => *n,
                None => {
                    self.next_node = self.next_node.wrapping_add(1);
                    nodes[self.next_node % nodes.len()]
                }
            };
            let r = self.call_node(node, req).await;
            let retry = match &r {
                Ok(resp) => match resp.error.as_ref() {
                    Some(e) if e.kind == "not_leader" => {
                        match e.leader.filter(|l| *l != node && self.addrs.contains_key(l)) {
                            Some(l) => {
                                self.leaders.insert(group, l);
                            }
                            None => {
                                self.leaders.remove(&group);
                            }
                        }
                        true
                    }
                    Some(e) if e.kind == "group_not_found" => {
                        self.leaders.remove(&group);
                        true
                    }
                    // Outcome unknown: answered as is, but this node may be a leader cut off from
                    // its quorum, so the next call looks for the leader afresh.
                    Some(e) if e.kind == "timeout" || e.kind == "leadership_lost" => {
                        self.leaders.remove(&group);
                        false
                    }
                    _ => {
                        self.leaders.insert(group, node);
                        false
                    }
                },
                Err(e) if !e.outcome_unknown() => {
                    self.leaders.remove(&group);
                    true
                }
                Err(_) => {
                    self.leaders.remove(&group);
                    false
                }
            };
            if !retry || Instant::now() >= deadline {
                return r;
            }
            if !self.leaders.contains_key(&group) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}
