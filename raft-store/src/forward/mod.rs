//! Transparent forwarding to a group's leader.
//!
//! A follower that is asked for a write or a linearizable read sends it to the leader over the
//! node-to-node transport (a FORWARD frame carrying a request id and a postcard body) and waits
//! for the ANSWER frame with the same id. This module holds both sides: the in-flight table of
//! requests this node forwarded (bounded per peer, failed when their connection breaks), and the
//! leader side that runs a forwarded request locally — never forwarding it again, so a request
//! makes at most one hop and the forwarding node follows leader hints itself.
//!
//! Forwarded frames travel on the connection they were sent on, never in the queue that outlives a
//! connection: a request is either sent on a connection that is up, or not sent at all, and when
//! that connection breaks its unanswered requests are known lost at once.

pub(crate) mod wire;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::oneshot;

use self::wire::{ForwardOp, ForwardReply, ForwardRequest, ForwardResponse, WireError};
use crate::engine::request::{Control, GroupRequest};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::transport::{frame, ForwardHandler, ServeFuture, Transport};

/// Requests this node may have forwarded to one peer and not yet had answered.
pub const MAX_IN_FLIGHT_PER_PEER: usize = 1024;
/// Forwarded requests from one peer this node runs at once; more are answered `Overloaded`.
pub const MAX_SERVED_PER_PEER: usize = 1024;
/// Longest a leader works on a forwarded request, whatever the request asks.
const MAX_SERVE_TIME: Duration = Duration::from_secs(60);

/// How a forwarded request ended on the forwarding side.
#[derive(Debug)]
pub(crate) enum Delivery {
    /// The leader answered.
    Answer(ForwardResponse),
    /// The connection it was sent on broke before an answer came.
    Lost,
}

/// Why a request could not be forwarded; nothing was sent.
#[derive(Debug)]
pub(crate) enum NotSent {
    /// No connection to the peer is up (or its queue is full).
    NoConnection,
    /// Too many requests to this peer are in flight.
    Overloaded,
    /// The request does not fit in one frame.
    TooLarge(usize),
    /// Encoding failed (a bug).
    Encode(String),
}

struct Pending {
    peer: u64,
    generation: u64,
    tx: oneshot::Sender<Delivery>,
}

/// Both sides of forwarding on one node.
pub(crate) struct Forwarder {
    control: crossbeam_channel::Sender<Control>,
    max_frame: usize,
    metrics: Arc<Metrics>,
    next_id: AtomicU64,
    pending: Mutex<HashMap<u64, Pending>>,
    in_flight: Mutex<HashMap<u64, usize>>,
    serving: Mutex<HashMap<u64, usize>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A forwarded request waiting for its answer. Dropping it forgets the request (a late answer is
/// then ignored) and frees its in-flight slot.
pub(crate) struct Ticket {
    id: u64,
    peer: u64,
    pub(crate) rx: oneshot::Receiver<Delivery>,
    fwd: Arc<Forwarder>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        lock(&self.fwd.pending).remove(&self.id);
        self.fwd.release(&self.fwd.in_flight, self.peer);
        self.fwd.metrics.forward_in_flight.dec();
    }
}

impl Forwarder {
    pub(crate) fn new(control: crossbeam_channel::Sender<Control>, max_frame: usize, metrics: Arc<Metrics>) -> Self {
        Forwarder {
            control,
            max_frame,
            metrics,
            next_id: AtomicU64::new(rand::random::<u64>() >> 1),
            pending: Mutex::new(HashMap::new()),
            in_flight: Mutex::new(HashMap::new()),
            serving: Mutex::new(HashMap::new()),
        }
    }

    fn acquire(&self, table: &Mutex<HashMap<u64, usize>>, peer: u64, max: usize) -> bool {
        let mut t = lock(table);
        let n = t.entry(peer).or_default();
        if *n >= max {
            return false;
        }
        *n += 1;
        true
    }

    fn release(&self, table: &Mutex<HashMap<u64, usize>>, peer: u64) {
        let mut t = lock(table);
        if let Some(n) = t.get_mut(&peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                t.remove(&peer);
            }
        }
    }

    /// Sends `req` to `peer` on the connection that is up now.
    pub(crate) fn start(
        self: &Arc<Self>,
        transport: &Transport,
        peer: u64,
        req: &ForwardRequest,
    ) -> std::result::Result<Ticket, NotSent> {
        if !self.acquire(&self.in_flight, peer, MAX_IN_FLIGHT_PER_PEER) {
            return Err(NotSent::Overloaded);
        }
        self.metrics.forward_in_flight.inc();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        // From here on, dropping the ticket undoes the registration.
        let ticket = Ticket { id, peer, rx, fwd: self.clone() };
        let payload = postcard::to_stdvec(req).map_err(|e| NotSent::Encode(e.to_string()))?;
        let bytes = frame::forward(id, &payload, self.max_frame).ok_or(NotSent::TooLarge(payload.len()))?;
        // Registered under the table lock, so a connection that closes right now either refuses
        // the frame or finds the entry and fails it.
        let sent = {
            let mut pending = lock(&self.pending);
            match transport.send_forward(peer, bytes) {
                Some(generation) => {
                    pending.insert(id, Pending { peer, generation, tx });
                    true
                }
                None => false,
            }
        };
        if sent {
            Ok(ticket)
        } else {
            Err(NotSent::NoConnection)
        }
    }

    /// An ANSWER arrived from `peer`. `Err` when its body does not decode (the caller closes the
    /// connection).
    pub(crate) fn on_answer(&self, peer: u64, request_id: u64, payload: &[u8]) -> std::result::Result<(), String> {
        let response: ForwardResponse = postcard::from_bytes(payload).map_err(|e| e.to_string())?;
        let mut pending = lock(&self.pending);
        match pending.get(&request_id) {
            Some(p) if p.peer == peer => {
                if let Some(p) = pending.remove(&request_id) {
                    let _ = p.tx.send(Delivery::Answer(response));
                }
            }
            Some(_) => {
                self.metrics.reject("wrong_sender");
                tracing::warn!(peer, request_id, "raft transport: answer to a request sent to another node; dropped");
            }
            None => {
                // The caller gave up (deadline) before the answer came.
                self.metrics.forward_outcome("any", "late_answer");
            }
        }
        Ok(())
    }

    /// The connection `generation` to `peer` ended: its unanswered requests are lost.
    pub(crate) fn on_connection_closed(&self, peer: u64, generation: u64) {
        let mut pending = lock(&self.pending);
        let lost: Vec<u64> =
            pending.iter().filter(|(_, p)| p.peer == peer && p.generation == generation).map(|(id, _)| *id).collect();
        for id in lost {
            if let Some(p) = pending.remove(&id) {
                let _ = p.tx.send(Delivery::Lost);
            }
        }
    }

    /// Leader side: runs a forwarded request from `peer` locally and returns the ANSWER frame.
    pub(crate) async fn serve(self: Arc<Self>, peer: u64, request_id: u64, req: ForwardRequest) -> Option<Bytes> {
        let mut outsider = false;
        let response = if self.acquire(&self.serving, peer, MAX_SERVED_PER_PEER) {
            let timeout = Duration::from_millis(req.timeout_ms).min(MAX_SERVE_TIME);
            // A node may write only to groups it belongs to (`peer` is the id its TLS
            // certificate proved): a host of one kernel must not rewrite another's state.
            let r = match membership_of(&self.control, req.group, peer).await {
                Ok(true) => execute_local(&self.control, req.group, req.op, timeout)
                    .await
                    .map_err(|e| WireError::from_error(&e)),
                Ok(false) => {
                    outsider = true;
                    tracing::warn!(
                        peer,
                        group = req.group,
                        "raft transport: forwarded request from a node outside the group; refused"
                    );
                    Err(WireError::InvalidArgument(format!(
                        "node {peer} is not a member of group {}; it may not propose to it",
                        req.group
                    )))
                }
                // Fail closed: a request is never run on a group whose members are not known.
                Err(e) => Err(WireError::from_error(&e)),
            };
            self.release(&self.serving, peer);
            r
        } else {
            Err(WireError::Overloaded)
        };
        let outcome = match &response {
            _ if outsider => "not_a_member",
            Ok(_) => "ok",
            Err(WireError::NotLeader { .. }) => "not_leader",
            Err(WireError::Overloaded) => "overloaded",
            Err(_) => "error",
        };
        self.metrics.forward_served(outcome);
        let encode = |r: &ForwardResponse| postcard::to_stdvec(r).ok();
        let payload = encode(&response)?;
        if let Some(f) = frame::answer(request_id, &payload, self.max_frame) {
            return Some(f);
        }
        let too_large: ForwardResponse = Err(WireError::InvalidArgument(format!(
            "the answer of {} bytes exceeds the transport frame cap of {} bytes; read with a limit, or at the leader",
            payload.len(),
            self.max_frame
        )));
        frame::answer(request_id, &encode(&too_large)?, self.max_frame)
    }
}

impl ForwardHandler for Forwarder {
    fn queue_frames(&self) -> usize {
        // Every request this node may have in flight to the peer, as many answers owed, and slack.
        MAX_IN_FLIGHT_PER_PEER + MAX_SERVED_PER_PEER + 256
    }

    fn on_request(
        self: Arc<Self>,
        peer: u64,
        request_id: u64,
        payload: Bytes,
    ) -> std::result::Result<ServeFuture, String> {
        let req = postcard::from_bytes::<ForwardRequest>(&payload).map_err(|e| e.to_string())?;
        Ok(Box::pin(self.serve(peer, request_id, req)))
    }

    fn on_answer(&self, peer: u64, request_id: u64, payload: &[u8]) -> std::result::Result<(), String> {
        Forwarder::on_answer(self, peer, request_id, payload)
    }

    fn on_connection_closed(&self, peer: u64, generation: u64) {
        Forwarder::on_connection_closed(self, peer, generation);
    }
}

/// Sends a control message to the engine and waits up to `timeout` for its answer.
pub(crate) async fn call<T>(
    control: &crossbeam_channel::Sender<Control>,
    group: u64,
    timeout: Duration,
    make: impl FnOnce(oneshot::Sender<Result<T>>) -> Control,
) -> Result<T> {
    let (tx, rx) = oneshot::channel();
    control.try_send(make(tx)).map_err(|e| match e {
        crossbeam_channel::TrySendError::Full(_) => Error::Overloaded,
        crossbeam_channel::TrySendError::Disconnected(_) => Error::Stopped,
    })?;
    match tokio::time::timeout(timeout, rx).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err(Error::Stopped),
        Err(_) => Err(Error::Timeout { group, after: timeout }),
    }
}

/// Runs `op` on this node's replica of `group` (no forwarding).
pub(crate) async fn execute_local(
    control: &crossbeam_channel::Sender<Control>,
    group: u64,
    op: ForwardOp,
    timeout: Duration,
) -> Result<ForwardReply> {
    let req = |req: GroupRequest| Control::Group { group, req };
    match op {
        ForwardOp::Propose(cmd) => call(control, group, timeout, |reply| req(GroupRequest::Propose { cmd, reply }))
            .await
            .map(ForwardReply::Command),
        ForwardOp::Read(query) => {
            call(control, group, timeout, |reply| req(GroupRequest::Read { query, linearizable: true, reply }))
                .await
                .map(ForwardReply::Read)
        }
        ForwardOp::LeaseKeepAlive(id) => {
            call(control, group, timeout, |reply| req(GroupRequest::LeaseKeepAlive { id, reply }))
                .await
                .map(ForwardReply::LeaseTtl)
        }
    }
}

/// The leader of `group` as this node sees it now (`None`: unknown, or the status did not come).
pub(crate) async fn local_leader(control: &crossbeam_channel::Sender<Control>, group: u64) -> Option<u64> {
    let status = call(control, group, Duration::from_secs(1), |reply| Control::Group {
        group,
        req: GroupRequest::Status { reply },
    })
    .await
    .ok()?;
    status.leader
}

/// Whether `peer` is a member of `group` here (voter, outgoing voter or learner); an
/// error when the membership is not known (no such group here, no status in time), so
/// that the caller fails closed.
async fn membership_of(control: &crossbeam_channel::Sender<Control>, group: u64, peer: u64) -> Result<bool> {
    let s = call(control, group, Duration::from_secs(1), |reply| Control::Group {
        group,
        req: GroupRequest::Status { reply },
    })
    .await?;
    let m = &s.membership;
    Ok(m.voters.contains(&peer) || m.voters_outgoing.contains(&peer) || m.learners.contains(&peer))
}

/// Time left until `deadline`.
pub(crate) fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forwarder() -> (Arc<Forwarder>, crossbeam_channel::Receiver<Control>) {
        let (tx, rx) = crossbeam_channel::bounded(16);
        (Arc::new(Forwarder::new(tx, 64 << 10, Arc::new(Metrics::default()))), rx)
    }

    #[test]
    fn in_flight_requests_are_bounded_per_peer() {
        let (f, _rx) = forwarder();
        for _ in 0..MAX_IN_FLIGHT_PER_PEER {
            assert!(f.acquire(&f.in_flight, 2, MAX_IN_FLIGHT_PER_PEER));
        }
        assert!(!f.acquire(&f.in_flight, 2, MAX_IN_FLIGHT_PER_PEER), "the bound holds");
        assert!(f.acquire(&f.in_flight, 3, MAX_IN_FLIGHT_PER_PEER), "another peer has its own bound");
        f.release(&f.in_flight, 2);
        assert!(f.acquire(&f.in_flight, 2, MAX_IN_FLIGHT_PER_PEER), "a finished request frees its slot");
    }

    #[tokio::test]
    async fn a_peer_over_its_serving_bound_is_answered_overloaded() {
        let (f, rx) = forwarder();
        for _ in 0..MAX_SERVED_PER_PEER {
            assert!(f.acquire(&f.serving, 2, MAX_SERVED_PER_PEER));
        }
        let req = ForwardRequest { group: 1, timeout_ms: 1000, op: ForwardOp::LeaseKeepAlive(1) };
        let answer = f.clone().serve(2, 77, req).await.expect("an answer frame");
        let body = answer.slice(frame::HEADER_LEN..);
        let frame::Frame::Answer { request_id, payload } = frame::decode(body).expect("frame") else {
            panic!("not an answer frame");
        };
        assert_eq!(request_id, 77);
        let response: ForwardResponse = postcard::from_bytes(&payload).expect("decode");
        assert!(matches!(response, Err(WireError::Overloaded)), "{response:?}");
        assert!(rx.try_recv().is_err(), "nothing reached the engine");
    }

    /// Answers the engine's Status requests for group 1 with voters {1, 2}, and a
    /// LeaseKeepAlive with a TTL of 9.
    fn fake_engine(rx: crossbeam_channel::Receiver<Control>) -> std::thread::JoinHandle<usize> {
        std::thread::spawn(move || {
            let mut keepalives = 0;
            while let Ok(c) = rx.recv() {
                match c {
                    Control::Group { req: GroupRequest::Status { reply }, group } => {
                        let _ = reply.send(Ok(crate::engine::request::GroupStatus {
                            group,
                            node: 1,
                            role: "leader".into(),
                            leader: Some(1),
                            term: 1,
                            commit: 0,
                            applied: 0,
                            last_index: 0,
                            snapshot_index: 0,
                            membership: crate::engine::request::Membership { voters: vec![1, 2], ..Default::default() },
                            hibernating: false,
                        }));
                    }
                    Control::Group { req: GroupRequest::LeaseKeepAlive { reply, .. }, .. } => {
                        keepalives += 1;
                        let _ = reply.send(Ok(9));
                    }
                    _ => {}
                }
            }
            keepalives
        })
    }

    fn answer_of(frame_bytes: Bytes) -> ForwardResponse {
        let frame::Frame::Answer { payload, .. } =
            frame::decode(frame_bytes.slice(frame::HEADER_LEN..)).expect("frame")
        else {
            panic!("not an answer frame");
        };
        postcard::from_bytes(&payload).expect("decode")
    }

    #[tokio::test]
    async fn a_node_outside_the_group_may_not_propose_to_it() {
        let (tx, rx) = crossbeam_channel::bounded(16);
        let f = Arc::new(Forwarder::new(tx, 64 << 10, Arc::new(Metrics::default())));
        let engine = fake_engine(rx);
        let req = || ForwardRequest { group: 1, timeout_ms: 1000, op: ForwardOp::LeaseKeepAlive(1) };
        // Node 9 is not in group 1: refused with a clear error, counted, never run.
        let response = answer_of(f.clone().serve(9, 1, req()).await.expect("answer"));
        assert!(
            matches!(&response, Err(WireError::InvalidArgument(m)) if m.contains("node 9 is not a member of group 1")),
            "{response:?}"
        );
        assert_eq!(
            f.metrics
                .forward_served
                .get_or_create(&crate::metrics::OutcomeLabel { outcome: "not_a_member".into() })
                .get(),
            1
        );
        // Node 2 is: its request runs.
        let response = answer_of(f.clone().serve(2, 2, req()).await.expect("answer"));
        assert!(matches!(response, Ok(ForwardReply::LeaseTtl(9))), "{response:?}");
        drop(f);
        assert_eq!(engine.join().expect("engine"), 1, "only the member's request reached the engine");
    }

    #[tokio::test]
    async fn an_answer_from_the_wrong_peer_or_for_a_forgotten_request_is_ignored() {
        let (f, _rx) = forwarder();
        let (tx, mut rx) = oneshot::channel();
        lock(&f.pending).insert(5, Pending { peer: 2, generation: 1, tx });
        let ok: ForwardResponse = Ok(ForwardReply::LeaseTtl(9));
        let bytes = postcard::to_stdvec(&ok).expect("encode");
        f.on_answer(3, 5, &bytes).expect("decodes");
        assert!(rx.try_recv().is_err(), "node 3 cannot answer a request sent to node 2");
        assert_eq!(f.metrics.rejected_count("wrong_sender"), 1);
        f.on_answer(2, 6, &bytes).expect("decodes");
        assert_eq!(f.metrics.forwarded_count("any", "late_answer"), 1);
        assert!(f.on_answer(2, 5, &[0xff, 0xff, 0xff]).is_err(), "garbage is refused");
        f.on_answer(2, 5, &bytes).expect("decodes");
        assert!(matches!(rx.try_recv(), Ok(Delivery::Answer(Ok(ForwardReply::LeaseTtl(9))))));
        // A broken connection fails what was sent on it, and only that.
        let (tx1, mut rx1) = oneshot::channel();
        let (tx2, mut rx2) = oneshot::channel();
        lock(&f.pending).insert(10, Pending { peer: 2, generation: 1, tx: tx1 });
        lock(&f.pending).insert(11, Pending { peer: 2, generation: 2, tx: tx2 });
        f.on_connection_closed(2, 1);
        assert!(matches!(rx1.try_recv(), Ok(Delivery::Lost)));
        assert!(rx2.try_recv().is_err());
    }
}
