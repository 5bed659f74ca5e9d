//! The Jupyter client's side of `nbos kernel-proxy`: routes what the gateway sends to the
//! client's ZMQ sockets (replies to the requester's identities, IOPub published), and answers
//! the requests a lost gateway socket abandoned, as a kernel answers a failed request.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::SystemTime;

use bytes::Bytes;
use zeromq::{PubSocket, SocketSend, ZmqMessage};

use notebookosd::jupyter::{wire, Channel, Message, Signer};

/// Requests abandoned on a lost socket whose late messages are still dropped.
const MAX_ABANDONED: usize = 4096;

/// Where a request came from, to route its reply (or answer it when its socket is lost).
pub(super) struct Route {
    pub(super) ids: Vec<Bytes>,
    pub(super) channel: Channel,
    pub(super) request: Message,
}

/// Msg ids of requests answered as abandoned (bounded, oldest forgotten first).
#[derive(Default)]
pub(super) struct Abandoned {
    set: HashSet<String>,
    order: VecDeque<String>,
}

impl Abandoned {
    pub(super) fn insert(&mut self, id: String) {
        if self.set.insert(id.clone()) {
            self.order.push_back(id);
        }
        while self.order.len() > MAX_ABANDONED {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }

    pub(super) fn contains(&self, msg: &Message) -> bool {
        parent_msg_id(msg).is_some_and(|p| self.set.contains(&p))
    }
}

pub(super) struct Routers {
    pub(super) shell: zeromq::RouterSendHalf,
    pub(super) control: zeromq::RouterSendHalf,
    pub(super) stdin: zeromq::RouterSendHalf,
    pub(super) iopub: PubSocket,
}

impl Routers {
    /// Sends a gateway message to the client; true when it was the reply to the
    /// client's shutdown request.
    pub(super) async fn deliver_to_client(
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
    pub(super) async fn abandon_in_flight(
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
    pub(super) async fn publish_status(
        &mut self,
        state: &str,
        parent: Option<&Message>,
        signer: &Signer,
        kernel_id: &str,
    ) {
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
