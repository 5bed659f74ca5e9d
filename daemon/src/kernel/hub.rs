//! Where a kernel's messages meet its clients: replies go to the client that
//! asked, IOPub to every client, and whatever arrives while no client is
//! connected is kept (bounded) and replayed to the next one.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::SystemTime;

use tokio::sync::{mpsc, oneshot};

use crate::jupyter::{Channel, Message};

/// A message on its way to a client.
pub type Outgoing = (Channel, Message);

/// Messages kept for replay while no client is connected.
const MAX_BUFFERED_MESSAGES: usize = 10_000;
/// Bytes kept for replay while no client is connected.
const MAX_BUFFERED_BYTES: usize = 64 * 1024 * 1024;
/// Messages queued to one client before it is considered stuck and dropped
/// (it reconnects and gets the replay buffer from then on).
pub const CLIENT_QUEUE: usize = 4096;
/// Silent requests remembered at once (each is forgotten at its `idle` status).
const MAX_SILENT: usize = 10_000;
/// Requests whose reply came, remembered so a `busy` status that arrives after its
/// reply (IOPub lagging behind shell) does not mark an idle kernel busy again.
const MAX_REPLIED: usize = 1_024;
/// IOPub quiet this long after the reply to the request the kernel was busy with: its
/// `idle` status was dropped (it would have come after the output before it).
const IDLE_LOST_AFTER: std::time::Duration = std::time::Duration::from_secs(2);

/// Identifies one connected client of a kernel.
pub type ClientId = u64;

/// Where a request's replies go.
enum ReplyTo {
    Client(ClientId),
    Internal(oneshot::Sender<Message>),
}

#[derive(Default)]
struct Inner {
    next_client: ClientId,
    clients: Vec<(ClientId, mpsc::Sender<Outgoing>)>,
    pending: HashMap<String, ReplyTo>,
    buffer: VecDeque<Outgoing>,
    buffered_bytes: usize,
    dropped_from_buffer: u64,
    execution_state: String,
    /// The request the kernel's last `busy` status was for (while busy).
    busy_with: Option<String>,
    /// The latest requests whose shell or control reply came (at most [`MAX_REPLIED`]).
    replied: VecDeque<String>,
    /// The request the kernel is busy with got its reply, and no other waits for one.
    busy_replied: bool,
    /// When the kernel's last IOPub message came.
    last_iopub: Option<SystemTime>,
    last_activity: Option<SystemTime>,
    /// When each execute_request reached the daemon (for the interactivity delay).
    submitted: HashMap<String, std::time::Instant>,
    /// The daemon's own silent requests: their IOPub reaches no client and changes no state.
    /// Forgotten once both the reply and the `idle` status came (they travel on different
    /// sockets, so either may come first): (reply seen, idle seen).
    silent: HashMap<String, (bool, bool)>,
    /// Replies the daemon holds back from the client (the replica host commits the
    /// cell's namespace first), by request msg_id.
    held: HashMap<String, oneshot::Sender<Message>>,
    /// The kernel was shut down: no client stays connected ([`Hub::close`]).
    closed: bool,
}

/// Sees every message from the kernel: (channel, msg_type, parent msg_id, message).
pub type Observer = Box<dyn Fn(Channel, &str, Option<&str>, &Message) + Send + Sync>;

/// The hub of one kernel.
#[derive(Default)]
pub struct Hub {
    inner: Mutex<Inner>,
    observer: std::sync::OnceLock<Observer>,
}

/// What a kernel looks like from outside right now.
#[derive(Debug, Clone)]
pub struct Activity {
    /// `starting`, `idle`, `busy`, `restarting`, `dead`…
    pub execution_state: String,
    /// Last message in either direction.
    pub last_activity: SystemTime,
    /// Clients connected.
    pub connections: usize,
}

impl Hub {
    /// A hub for a kernel in `state`.
    pub fn new(state: &str, now: SystemTime) -> Self {
        let inner = Inner { execution_state: state.to_owned(), last_activity: Some(now), ..Default::default() };
        Self { inner: Mutex::new(inner), observer: std::sync::OnceLock::new() }
    }

    /// Installs the observer (once; later calls are ignored).
    pub fn set_observer(&self, observer: Observer) {
        let _ = self.observer.set(observer);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock would be a bug in this file; keep serving.
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Connects a client: it first receives everything buffered, then live messages.
    pub fn connect(&self) -> (ClientId, mpsc::Receiver<Outgoing>, usize) {
        self.connect_with_queue(CLIENT_QUEUE)
    }

    /// [`Hub::connect`] with room for `queue` live messages to the client (past them it is
    /// dropped as stuck: its receiver ends).
    pub fn connect_with_queue(&self, queue: usize) -> (ClientId, mpsc::Receiver<Outgoing>, usize) {
        let mut g = self.lock();
        // Room for the whole replay plus live traffic, so replay never drops.
        let (tx, rx) = mpsc::channel(queue.max(1) + g.buffer.len());
        let id = g.next_client;
        g.next_client += 1;
        if g.closed {
            // Its sender dropped: the client's receiver ends at once.
            return (id, rx, 0);
        }
        let mut replayed = 0;
        while let Some(m) = g.buffer.pop_front() {
            if tx.try_send(m).is_err() {
                break;
            }
            replayed += 1;
        }
        g.buffer.clear();
        g.buffered_bytes = 0;
        g.clients.push((id, tx));
        (id, rx, replayed)
    }

    /// The kernel was shut down for good: every client's receiver ends (its socket is
    /// closed) and a client connecting later gets one that has ended. A socket left open
    /// would send its messages to a kernel that is gone, e.g. a cluster front-end's link to
    /// a replica stopped and started again on this host, which then never runs a cell.
    pub fn close(&self) {
        let mut g = self.lock();
        g.closed = true;
        g.clients.clear();
    }

    /// True once [`Hub::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Forgets a client.
    pub fn disconnect(&self, id: ClientId) {
        let mut g = self.lock();
        g.clients.retain(|(c, _)| *c != id);
        g.pending.retain(|_, r| !matches!(r, ReplyTo::Client(c) if *c == id));
    }

    /// Notes that `msg_id`, sent by `client`, expects replies.
    pub fn expect_reply(&self, msg_id: &str, client: ClientId, now: SystemTime) {
        let mut g = self.lock();
        g.pending.insert(msg_id.to_owned(), ReplyTo::Client(client));
        g.last_activity = Some(now);
    }

    /// Requests of `client` awaiting their reply.
    pub fn pending_for(&self, client: ClientId) -> usize {
        self.lock().pending.values().filter(|r| matches!(r, ReplyTo::Client(c) if *c == client)).count()
    }

    /// Notes a request the daemon itself sends; the reply comes back on the receiver.
    pub fn expect_internal_reply(&self, msg_id: &str) -> oneshot::Receiver<Message> {
        let (tx, rx) = oneshot::channel();
        self.lock().pending.insert(msg_id.to_owned(), ReplyTo::Internal(tx));
        rx
    }

    /// Notes a silent request the daemon itself sends (export, apply, digest): its
    /// reply comes back on the receiver, and its IOPub (status, streams) is dropped
    /// until its `idle` status, so clients never see it and the kernel's shown state
    /// does not flicker.
    pub fn expect_silent_reply(&self, msg_id: &str) -> oneshot::Receiver<Message> {
        let (tx, rx) = oneshot::channel();
        let mut g = self.lock();
        if g.silent.len() >= MAX_SILENT {
            // Ids whose idle never came (a killed kernel): forget them rather than grow.
            g.silent.clear();
        }
        g.silent.insert(msg_id.to_owned(), (false, false));
        g.pending.insert(msg_id.to_owned(), ReplyTo::Internal(tx));
        rx
    }

    /// Forgets a silent request whose reply will not be waited for (timeout).
    pub fn forget_silent(&self, msg_id: &str) {
        let mut g = self.lock();
        g.silent.remove(msg_id);
        g.pending.remove(msg_id);
    }

    /// Holds the reply to `msg_id` back from its client: it comes back on the receiver
    /// instead (after the observer saw it), and [`Hub::release`] delivers it later.
    pub fn hold_reply(&self, msg_id: &str) -> oneshot::Receiver<Message> {
        let (tx, rx) = oneshot::channel();
        self.lock().held.insert(msg_id.to_owned(), tx);
        rx
    }

    /// Stops holding the reply to `msg_id` (the cell was abandoned).
    pub fn unhold_reply(&self, msg_id: &str) {
        self.lock().held.remove(msg_id);
    }

    /// Delivers a reply that was held (or made by the daemon) to `client`, without
    /// showing it to the observer again.
    pub fn release(&self, client: ClientId, channel: Channel, msg: Message, now: SystemTime) {
        if let Some(parent) = parent_msg_id(&msg) {
            self.lock().pending.insert(parent, ReplyTo::Client(client));
        }
        self.route(channel, msg, now);
    }

    /// Notes when a cell was submitted (bounded: a cell never started is forgotten
    /// once 10 000 newer ones are waiting).
    pub fn note_submitted(&self, msg_id: &str, at: std::time::Instant) {
        let mut g = self.lock();
        if g.submitted.len() >= 10_000 {
            g.submitted.clear();
        }
        g.submitted.insert(msg_id.to_owned(), at);
    }

    /// How long ago the cell was submitted, forgetting it.
    pub fn take_submitted(&self, msg_id: &str) -> Option<std::time::Duration> {
        self.lock().submitted.remove(msg_id).map(|t| t.elapsed())
    }

    /// Sets the execution state (from IOPub `status`, or lifecycle events).
    pub fn set_state(&self, state: &str, now: SystemTime) {
        let mut g = self.lock();
        g.execution_state = state.to_owned();
        g.busy_with = None;
        g.busy_replied = false;
        g.last_activity = Some(now);
    }

    /// The current activity. A kernel shows `idle` once the request it was busy with got
    /// its reply and IOPub has been quiet for [`IDLE_LOST_AFTER`] since: ipykernel's IOPub is
    /// a PUB socket that drops messages past its high-water mark (1000) when the daemon
    /// reads slower than a cell prints, the `idle` status included, while shell drops
    /// nothing. Without this such a kernel would be `busy` for good.
    pub fn activity(&self) -> Activity {
        let g = self.lock();
        let idle_lost = g.execution_state == "busy"
            && g.busy_replied
            && g.last_iopub.is_none_or(|t| t.elapsed().unwrap_or_default() >= IDLE_LOST_AFTER);
        Activity {
            execution_state: if idle_lost { "idle".to_owned() } else { g.execution_state.clone() },
            last_activity: g.last_activity.unwrap_or(SystemTime::UNIX_EPOCH),
            connections: g.clients.len(),
        }
    }

    /// Messages dropped from the replay buffer because it was full.
    pub fn dropped_from_buffer(&self) -> u64 {
        self.lock().dropped_from_buffer
    }

    /// Delivers a message from the kernel.
    pub fn deliver(&self, channel: Channel, msg: Message, now: SystemTime) {
        let parent_id = parent_msg_id(&msg);
        if let Some(pid) = &parent_id {
            let mut g = self.lock();
            if let Some(&(reply_seen, idle_seen)) = g.silent.get(pid) {
                let (mut reply_seen, mut idle_seen) = (reply_seen, idle_seen);
                if channel == Channel::Iopub {
                    idle_seen |= status_of(&msg).as_deref() == Some("idle");
                } else if let Some(ReplyTo::Internal(tx)) = g.pending.remove(pid) {
                    let _ = tx.send(msg);
                    reply_seen = true;
                }
                if reply_seen && idle_seen {
                    g.silent.remove(pid);
                } else {
                    g.silent.insert(pid.clone(), (reply_seen, idle_seen));
                }
                return;
            }
        }
        if let Some(obs) = self.observer.get() {
            if let Ok(h) = msg.header() {
                obs(channel, &h.msg_type, parent_id.as_deref(), &msg);
            }
        }
        if matches!(channel, Channel::Shell | Channel::Control) {
            if let Some(pid) = &parent_id {
                let held = self.lock().held.remove(pid);
                if let Some(tx) = held {
                    if let Err(msg) = tx.send(msg) {
                        // Nobody waits any more: the client gets the reply as it is.
                        self.route(channel, msg, now);
                    }
                    return;
                }
            }
        }
        self.route(channel, msg, now);
    }

    /// Routes a message to its client(s), or buffers it.
    fn route(&self, channel: Channel, msg: Message, now: SystemTime) {
        let parent_id = parent_msg_id(&msg);
        let mut g = self.lock();
        g.last_activity = Some(now);
        match channel {
            Channel::Iopub => {
                g.last_iopub = Some(now);
                if let Some(state) = status_of(&msg) {
                    g.note_status(state, parent_id.as_deref());
                }
            }
            Channel::Shell | Channel::Control => {
                if let Some(pid) = &parent_id {
                    g.note_reply(pid);
                }
            }
            Channel::Stdin | Channel::Hb => {}
        }
        let mut target = None;
        if channel != Channel::Iopub {
            if let Some(pid) = &parent_id {
                // Stdin's input_request shares the execute_request's id, so keep the
                // route for it; shell and control get exactly one reply.
                let route = if channel == Channel::Stdin { None } else { g.pending.remove(pid) };
                match route {
                    Some(ReplyTo::Internal(tx)) => {
                        let _ = tx.send(msg);
                        return;
                    }
                    Some(ReplyTo::Client(c)) => target = Some(c),
                    None => {
                        if let Some(ReplyTo::Client(c)) = g.pending.get(pid) {
                            target = Some(*c);
                        }
                    }
                }
            }
        }
        let inner = &mut *g;
        inner.clients.retain(|(_, tx)| !tx.is_closed());
        let mut delivered = false;
        let mut stuck = Vec::new();
        for (id, tx) in &inner.clients {
            if target.is_some_and(|t| t != *id) {
                continue;
            }
            match tx.try_send((channel, msg.clone())) {
                Ok(()) => delivered = true,
                Err(_) => stuck.push(*id),
            }
        }
        if !stuck.is_empty() {
            tracing::warn!(clients = ?stuck, "dropping clients whose queues are full");
            inner.clients.retain(|(id, _)| !stuck.contains(id));
        }
        if !delivered {
            inner.buffered_bytes += msg.size();
            inner.buffer.push_back((channel, msg));
            while inner.buffer.len() > MAX_BUFFERED_MESSAGES || inner.buffered_bytes > MAX_BUFFERED_BYTES {
                let Some((_, old)) = inner.buffer.pop_front() else { break };
                inner.buffered_bytes -= old.size();
                inner.dropped_from_buffer += 1;
            }
        }
    }
}

impl Inner {
    /// An IOPub `status`. A `busy` for a request already answered is stale (IOPub lags
    /// behind shell under load) and ignored.
    fn note_status(&mut self, state: String, parent: Option<&str>) {
        if state == "busy" && parent.is_some_and(|p| self.replied.iter().any(|r| r == p)) {
            return;
        }
        self.busy_with = if state == "busy" { parent.map(str::to_owned) } else { None };
        self.busy_replied = false;
        self.execution_state = state;
    }

    /// A shell or control reply to `parent` (see [`Hub::activity`] for what it ends). Only
    /// when no other request still waits for its reply: that one may be running, its own
    /// `busy` lost too.
    fn note_reply(&mut self, parent: &str) {
        if self.replied.len() >= MAX_REPLIED {
            self.replied.pop_front();
        }
        self.replied.push_back(parent.to_owned());
        let others_waiting = self.pending.keys().any(|k| k != parent && !self.silent.contains_key(k));
        if self.execution_state == "busy" && self.busy_with.as_deref().is_none_or(|b| b == parent) {
            // With others waiting it stays busy with one of them (IOPub or their replies say).
            self.busy_with = None;
            self.busy_replied = !others_waiting;
        }
    }
}

fn parent_msg_id(msg: &Message) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(&msg.parent_header).ok()?;
    v.get("msg_id")?.as_str().map(str::to_owned)
}

fn status_of(msg: &Message) -> Option<String> {
    if msg.header().ok()?.msg_type != "status" {
        return None;
    }
    let v = msg.content_json().ok()?;
    v.get("execution_state")?.as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn msg(id: &str, ty: &str, parent: Option<&str>, content: &str) -> Message {
        Message {
            header: Bytes::from(format!(r#"{{"msg_id":"{id}","msg_type":"{ty}"}}"#)),
            parent_header: Bytes::from(parent.map_or("{}".to_owned(), |p| format!(r#"{{"msg_id":"{p}"}}"#))),
            metadata: Bytes::from_static(b"{}"),
            content: Bytes::from(content.to_owned()),
            buffers: vec![],
        }
    }

    #[test]
    fn output_while_disconnected_is_replayed_in_order() {
        let hub = Hub::new("idle", SystemTime::UNIX_EPOCH);
        for i in 0..3 {
            hub.deliver(Channel::Iopub, msg(&format!("m{i}"), "stream", None, "{}"), SystemTime::UNIX_EPOCH);
        }
        let (_, mut rx, replayed) = hub.connect();
        assert_eq!(replayed, 3);
        for i in 0..3 {
            let (_, m) = rx.try_recv().expect("buffered");
            assert_eq!(m.header().expect("h").msg_id, format!("m{i}"));
        }
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn a_closed_hub_ends_every_client_and_keeps_none_connecting_later() {
        let hub = Hub::new("idle", SystemTime::UNIX_EPOCH);
        let (_, mut before, _) = hub.connect();
        hub.close();
        assert!(hub.is_closed());
        assert!(matches!(before.try_recv(), Err(mpsc::error::TryRecvError::Disconnected)));
        hub.deliver(Channel::Iopub, msg("late", "stream", None, "{}"), SystemTime::UNIX_EPOCH);
        let (_, mut after, replayed) = hub.connect();
        assert_eq!(replayed, 0);
        assert!(matches!(after.try_recv(), Err(mpsc::error::TryRecvError::Disconnected)));
        assert_eq!(hub.activity().connections, 0);
    }

    #[test]
    fn replies_go_to_the_requester_iopub_to_all() {
        let hub = Hub::new("idle", SystemTime::UNIX_EPOCH);
        let (a, mut ra, _) = hub.connect();
        let (_b, mut rb, _) = hub.connect();
        hub.expect_reply("req", a, SystemTime::UNIX_EPOCH);
        hub.deliver(Channel::Shell, msg("r", "execute_reply", Some("req"), "{}"), SystemTime::UNIX_EPOCH);
        hub.deliver(
            Channel::Iopub,
            msg("s", "status", Some("req"), r#"{"execution_state":"busy"}"#),
            SystemTime::UNIX_EPOCH,
        );
        assert_eq!(ra.try_recv().expect("reply").1.header().expect("h").msg_id, "r");
        assert_eq!(ra.try_recv().expect("status").1.header().expect("h").msg_id, "s");
        assert_eq!(rb.try_recv().expect("status").1.header().expect("h").msg_id, "s");
        assert!(rb.try_recv().is_err(), "b must not see a's reply");
        // The busy came after its own request's reply: stale, the kernel is idle.
        assert_eq!(hub.activity().execution_state, "idle");
    }

    #[test]
    fn internal_requests_do_not_reach_clients() {
        let hub = Hub::new("starting", SystemTime::UNIX_EPOCH);
        let (_, mut ra, _) = hub.connect();
        let mut rx = hub.expect_internal_reply("ki");
        hub.deliver(Channel::Shell, msg("r", "kernel_info_reply", Some("ki"), "{}"), SystemTime::UNIX_EPOCH);
        assert!(rx.try_recv().is_ok());
        assert!(ra.try_recv().is_err());
    }

    #[test]
    fn silent_requests_reach_no_client_and_keep_the_state() {
        let hub = Hub::new("idle", SystemTime::UNIX_EPOCH);
        let (_, mut ra, _) = hub.connect();
        let mut rx = hub.expect_silent_reply("sync");
        let t = SystemTime::UNIX_EPOCH;
        hub.deliver(Channel::Iopub, msg("b", "status", Some("sync"), r#"{"execution_state":"busy"}"#), t);
        hub.deliver(Channel::Iopub, msg("o", "stream", Some("sync"), r#"{"name":"stdout","text":"x"}"#), t);
        hub.deliver(Channel::Shell, msg("r", "execute_reply", Some("sync"), r#"{"status":"ok"}"#), t);
        hub.deliver(Channel::Iopub, msg("i", "status", Some("sync"), r#"{"execution_state":"idle"}"#), t);
        assert_eq!(rx.try_recv().expect("reply").header().expect("h").msg_id, "r");
        assert!(ra.try_recv().is_err(), "a client saw the daemon's silent request");
        assert_eq!(hub.activity().execution_state, "idle");
        // After its reply and idle status the id is forgotten: a later message with that parent is ordinary.
        hub.deliver(Channel::Iopub, msg("late", "stream", Some("sync"), "{}"), t);
        assert_eq!(ra.try_recv().expect("ordinary").1.header().expect("h").msg_id, "late");

        // The idle status may overtake the reply (another socket): the reply still comes back.
        let mut rx = hub.expect_silent_reply("sync2");
        hub.deliver(Channel::Iopub, msg("i2", "status", Some("sync2"), r#"{"execution_state":"idle"}"#), t);
        hub.deliver(Channel::Shell, msg("r2", "execute_reply", Some("sync2"), r#"{"status":"ok"}"#), t);
        assert_eq!(rx.try_recv().expect("reply").header().expect("h").msg_id, "r2");
        assert!(ra.try_recv().is_err(), "a client saw the daemon's silent request");
    }

    /// IOPub drops messages past its high-water mark when the daemon lags: the `idle`
    /// after a flood may never come, and the `busy` may come after the reply. The reply
    /// (on shell, which drops nothing) still ends the busy state, and only its own.
    #[test]
    fn a_reply_ends_the_busy_state_when_iopub_lost_the_idle() {
        let hub = Hub::new("idle", SystemTime::UNIX_EPOCH);
        // Messages stamped long ago: IOPub has been quiet since.
        let t = SystemTime::UNIX_EPOCH;
        let busy = |id: &str, parent: &str| msg(id, "status", Some(parent), r#"{"execution_state":"busy"}"#);
        hub.deliver(Channel::Iopub, busy("b1", "flood"), t);
        hub.deliver(Channel::Shell, msg("r1", "execute_reply", Some("flood"), "{}"), t);
        assert_eq!(hub.activity().execution_state, "idle", "the lost idle left the kernel busy");

        // While the cell's output still arrives (IOPub behind shell), it is busy until it ends.
        hub.deliver(Channel::Iopub, busy("b0", "flowing"), t);
        hub.deliver(Channel::Shell, msg("r0f", "execute_reply", Some("flowing"), "{}"), t);
        hub.deliver(Channel::Iopub, msg("o", "stream", Some("flowing"), "{}"), SystemTime::now());
        assert_eq!(hub.activity().execution_state, "busy", "idle while its output still arrives");
        hub.deliver(Channel::Iopub, msg("i", "status", Some("flowing"), r#"{"execution_state":"idle"}"#), t);
        assert_eq!(hub.activity().execution_state, "idle");

        // The busy of the next cell overtook the reply to the previous one: still busy.
        hub.deliver(Channel::Iopub, busy("b2", "second"), t);
        hub.deliver(Channel::Shell, msg("r0", "execute_reply", Some("earlier"), "{}"), t);
        assert_eq!(hub.activity().execution_state, "busy", "another request's reply ended this one");
        hub.deliver(Channel::Shell, msg("r2", "execute_reply", Some("second"), "{}"), t);
        assert_eq!(hub.activity().execution_state, "idle");

        // Two cells queued, IOPub lost the first's idle and the second's busy: the first's
        // reply leaves the kernel busy while the second waits for its reply.
        let (client, _rx, _) = hub.connect();
        hub.expect_reply("c1", client, t);
        hub.expect_reply("c2", client, t);
        hub.deliver(Channel::Iopub, busy("b4", "c1"), t);
        hub.deliver(Channel::Shell, msg("r4", "execute_reply", Some("c1"), "{}"), t);
        assert_eq!(hub.activity().execution_state, "busy", "idle while the second cell runs");
        hub.deliver(Channel::Shell, msg("r5", "execute_reply", Some("c2"), "{}"), t);
        assert_eq!(hub.activity().execution_state, "idle");

        // A busy restored by the daemon (after a missed heartbeat) ends with the next reply.
        hub.set_state("busy", t);
        hub.deliver(Channel::Shell, msg("r6", "execute_reply", Some("c6"), "{}"), t);
        assert_eq!(hub.activity().execution_state, "idle");

        // A busy that lagged behind its own reply is stale.
        hub.deliver(Channel::Shell, msg("r3", "execute_reply", Some("third"), "{}"), t);
        hub.deliver(Channel::Iopub, busy("b3", "third"), t);
        assert_eq!(hub.activity().execution_state, "idle", "a stale busy marked the kernel busy");
    }

    #[test]
    fn held_replies_wait_for_release() {
        let hub = Hub::new("idle", SystemTime::UNIX_EPOCH);
        let (a, mut ra, _) = hub.connect();
        let t = SystemTime::UNIX_EPOCH;
        hub.expect_reply("cell", a, t);
        let mut held = hub.hold_reply("cell");
        hub.deliver(Channel::Shell, msg("r", "execute_reply", Some("cell"), "{}"), t);
        assert!(ra.try_recv().is_err(), "the held reply reached the client");
        let reply = held.try_recv().expect("held reply");
        hub.release(a, Channel::Shell, reply, t);
        assert_eq!(ra.try_recv().expect("released").1.header().expect("h").msg_id, "r");
        // A hold nobody waits for any more lets the reply through.
        hub.expect_reply("cell2", a, t);
        drop(hub.hold_reply("cell2"));
        hub.deliver(Channel::Shell, msg("r2", "execute_reply", Some("cell2"), "{}"), t);
        assert_eq!(ra.try_recv().expect("unheld").1.header().expect("h").msg_id, "r2");
    }

    #[test]
    fn pending_requests_are_counted_per_client_until_replied() {
        let hub = Hub::new("idle", SystemTime::UNIX_EPOCH);
        let t = SystemTime::UNIX_EPOCH;
        let (a, _ra, _) = hub.connect();
        let (b, _rb, _) = hub.connect();
        hub.expect_reply("a1", a, t);
        hub.expect_reply("a2", a, t);
        hub.expect_reply("b1", b, t);
        drop(hub.expect_internal_reply("internal"));
        assert_eq!((hub.pending_for(a), hub.pending_for(b)), (2, 1));
        hub.deliver(Channel::Shell, msg("r", "kernel_info_reply", Some("a1"), "{}"), t);
        assert_eq!(hub.pending_for(a), 1);
        hub.disconnect(a);
        assert_eq!((hub.pending_for(a), hub.pending_for(b)), (0, 1));
    }

    #[test]
    fn a_client_whose_queue_is_full_is_dropped() {
        let hub = Hub::new("idle", SystemTime::UNIX_EPOCH);
        let (_, mut rx, _) = hub.connect_with_queue(2);
        for i in 0..3 {
            hub.deliver(Channel::Iopub, msg(&format!("m{i}"), "stream", None, "{}"), SystemTime::UNIX_EPOCH);
        }
        assert!(rx.try_recv().is_ok() && rx.try_recv().is_ok());
        assert!(matches!(rx.try_recv(), Err(mpsc::error::TryRecvError::Disconnected)), "the stuck client stays");
        assert_eq!(hub.activity().connections, 0);
    }

    #[test]
    fn replay_buffer_is_bounded() {
        let hub = Hub::new("idle", SystemTime::UNIX_EPOCH);
        for i in 0..(MAX_BUFFERED_MESSAGES + 5) {
            hub.deliver(Channel::Iopub, msg(&format!("m{i}"), "stream", None, "{}"), SystemTime::UNIX_EPOCH);
        }
        assert_eq!(hub.dropped_from_buffer(), 5);
        let (_, mut rx, replayed) = hub.connect();
        assert_eq!(replayed, MAX_BUFFERED_MESSAGES);
        assert_eq!(rx.try_recv().expect("first kept").1.header().expect("h").msg_id, "m5");
    }
}
