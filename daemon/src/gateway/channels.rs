//! `GET /api/kernels/{id}/channels`: the kernel's five channels over one WebSocket.
//!
//! Authentication: as every other route of the API, the token (header or `?token=`)
//! or a client certificate verified against `http.tls.client_ca`
//! ([`crate::link::credential`]). jupyter_server's `GatewayKernelClient` opens this
//! socket with `websocket.create_connection(url, sslopt=…)` and no headers: it
//! authenticates with its client certificate (`GatewayClient.client_cert`/`client_key`).
//! JupyterLab's path (`GatewayWebSocketConnection`) sends the token header. With users,
//! another user's kernel answers as an unknown one, before any upgrade.
//!
//! Cluster mode: the socket is served by this host's front-end of the kernel
//! (which elects a replica per cell). The cluster-internal socket onto this host's own
//! replica is an internal route ([`super::internal_router`]); both end in [`upgrade`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::ws::{close_code, CloseFrame, Message as WsFrame, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};

use super::calling::{source_of, Calling};
use super::cluster;
use super::error::ApiError;
use super::state::AppState;
use crate::cluster::cells::frontend::FrontendKernel;
use crate::cluster::cells::replica_host::ReplicaHost;
use crate::gateway::limits::{SocketSlot, INFLIGHT_WAIT};
use crate::jupyter::{ws, Channel, Message, WireError};
use crate::kernel::hub::{ClientId, Hub};
use crate::kernel::LocalKernel;
use crate::link::credential::Presented;
use crate::metrics::DropLabels;

/// The upgrade handler.
pub async fn channels(
    State(st): State<Arc<AppState>>,
    mode: Option<cluster::Mode>,
    Path(id): Path<String>,
    req: Request,
) -> Response {
    // First: a malformed id is no kernel, whatever the token (nothing to hide about it).
    if let Err(e) = ApiError::check_kernel_id(&id) {
        return e.into_response();
    }
    // Credentials before anything else: whether a kernel exists is not for strangers to learn.
    let caller = match st.credentials.caller(Presented::of(&req)).await {
        Ok(caller) => caller,
        Err(refusal) => return super::auth::refused(&st, refusal, &req),
    };
    let calling = Calling { caller, source: source_of(req.extensions()) };
    // Cluster mode: clients reach the kernel's front-end on this host (other hosts'
    // front-ends reach this host's replica through the internal router). The owner is
    // checked before a front-end is opened: another user's kernel is an unknown one.
    let target = match &mode {
        Some(mode) => match mode.cluster.kernel(&id).await {
            Ok(Some(record)) => {
                if let Err(hidden) = calling.may_see(&st, "channels", &id, record.owner.as_deref()) {
                    return hidden.into_response();
                }
                Some(ChannelsPeer::Front(mode.frontends.open(&record)))
            }
            Ok(None) => None,
            Err(e) => {
                return ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: format!("meta store: {e}") }
                    .into_response()
            }
        },
        None => match st.kernels.get(&id).await {
            Some(k) => {
                if let Err(hidden) = calling.may_see(&st, "channels", &id, k.owner().map(|u| u.name.as_str())) {
                    return hidden.into_response();
                }
                Some(ChannelsPeer::Local(k, None))
            }
            None => None,
        },
    };
    let Some(target) = target else { return ApiError::no_kernel(&id).into_response() };
    calling.audit(&st, "channels", Some(&id), "ok", None);
    upgrade(st, target, req).await
}

/// Upgrades `req` to the WebSocket of `target` (within the limits on sockets).
pub(super) async fn upgrade(st: Arc<AppState>, target: ChannelsPeer, req: Request) -> Response {
    let slot = match st.limits.open_socket(target.id()) {
        Ok(slot) => slot,
        Err(refused) => return ApiError::from(refused).into_response(),
    };
    let (mut parts, _body) = req.into_parts();
    let upgrade =
        match <WebSocketUpgrade as axum::extract::FromRequestParts<()>>::from_request_parts(&mut parts, &()).await {
            Ok(u) => u,
            Err(rejection) => return rejection.into_response(),
        };
    // One cap for a message and for a frame: browsers send a large message as one frame.
    let max = st.limits.config.websocket_max_message_bytes;
    let upgrade = upgrade.protocols([ws::V1_SUBPROTOCOL]).max_message_size(max).max_frame_size(max);
    let v1 = upgrade.selected_protocol().is_some();
    upgrade.on_upgrade(move |socket| serve(socket, target, st, v1, slot))
}

/// What a client socket talks to.
pub(super) enum ChannelsPeer {
    /// A kernel hosted here (single-host mode, or this host's replica of a cluster kernel).
    Local(Arc<LocalKernel>, Option<Arc<ReplicaHost>>),
    /// This host's front-end of a cluster kernel.
    Front(Arc<FrontendKernel>),
}

impl ChannelsPeer {
    fn id(&self) -> &str {
        match self {
            ChannelsPeer::Local(k, _) => &k.id,
            ChannelsPeer::Front(f) => &f.id,
        }
    }

    fn hub(&self) -> &Arc<Hub> {
        match self {
            ChannelsPeer::Local(k, _) => &k.hub,
            ChannelsPeer::Front(f) => &f.hub,
        }
    }
}

async fn serve(socket: WebSocket, target: ChannelsPeer, st: Arc<AppState>, v1: bool, _slot: SocketSlot) {
    let limits = st.limits.config.clone();
    let (client, mut outgoing, replayed) = target.hub().connect_with_queue(limits.websocket_queued_messages);
    let id = target.id().to_owned();
    tracing::info!(kernel = %id, client, v1, replayed, "client connected");
    let (mut sink, mut stream) = socket.split();
    // The reader asks the writer to close with a reason (a message over the cap).
    let (close_tx, mut close_rx) = tokio::sync::oneshot::channel::<CloseFrame>();
    let closing = Arc::new(AtomicBool::new(false));
    let writer_closing = closing.clone();
    let queued = limits.websocket_queued_messages;
    let hub = target.hub().clone();
    let mut writer = tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                biased;
                close = &mut close_rx => {
                    if let Ok(frame) = close {
                        let _ = sink.send(WsFrame::Close(Some(frame))).await;
                    }
                    break;
                }
                next = outgoing.recv() => next,
            };
            let Some((channel, msg)) = next else {
                if hub.is_closed() {
                    let reason = "the kernel was shut down";
                    let _ = sink
                        .send(WsFrame::Close(Some(CloseFrame { code: close_code::AWAY, reason: reason.into() })))
                        .await;
                } else if !writer_closing.load(Ordering::Acquire) {
                    // The hub let go of this client while it is connected: its queue was full.
                    crate::metrics::count_refusal(QUEUE_FULL);
                    let reason = format!("more than {queued} messages queued (limits.websocket_queued_messages)");
                    let _ = sink
                        .send(WsFrame::Close(Some(CloseFrame { code: close_code::POLICY, reason: reason.into() })))
                        .await;
                }
                break;
            };
            let frame = match encode(channel, &msg, v1) {
                Ok(f) => f,
                Err(e) => {
                    tracing::warn!(error = %e, "could not encode a kernel message for the client");
                    continue;
                }
            };
            if sink.send(frame).await.is_err() {
                break;
            }
        }
        let _ = sink.close().await;
    });
    let mut close_tx = Some(close_tx);
    while let Some(frame) = stream.next().await {
        // Room in limits.websocket_inflight_bytes while the message is decoded and forwarded.
        let size = match &frame {
            Ok(WsFrame::Text(t)) => t.len(),
            Ok(WsFrame::Binary(b)) => b.len(),
            _ => 0,
        };
        let _room = if size > 0 {
            match st.limits.reserve_message(size, INFLIGHT_WAIT).await {
                Ok(room) => Some(room),
                Err(refused) => {
                    tracing::warn!(kernel = %id, client, size, "closed a WebSocket: {refused}");
                    // A close reason holds at most 123 bytes: the short form.
                    let reason = format!(
                        "host busy: {} bytes in flight (limits.websocket_inflight_bytes); retry",
                        st.limits.config.websocket_inflight_bytes
                    );
                    if let Some(tx) = close_tx.take() {
                        let _ = tx.send(CloseFrame { code: close_code::AGAIN, reason: reason.into() });
                    }
                    break;
                }
            }
        } else {
            None
        };
        let decoded = match frame {
            Ok(WsFrame::Text(t)) => ws::from_json_text(t.as_str(), SystemTime::now()),
            Ok(WsFrame::Binary(b)) if v1 => ws::from_v1_binary(&b),
            Ok(WsFrame::Binary(b)) => ws::from_legacy_binary(&b, SystemTime::now()),
            Ok(WsFrame::Close(_)) => break,
            Ok(WsFrame::Ping(_) | WsFrame::Pong(_)) => continue,
            Err(e) if is_too_large(&e) => {
                crate::metrics::count_refusal(MESSAGE_TOO_LARGE);
                let max = limits.websocket_max_message_bytes;
                tracing::warn!(kernel = %id, client, max, "closed a WebSocket: message over limits.websocket_max_message_bytes");
                let reason = format!("message larger than {max} bytes (limits.websocket_max_message_bytes)");
                if let Some(tx) = close_tx.take() {
                    let _ = tx.send(CloseFrame { code: close_code::SIZE, reason: reason.into() });
                }
                break;
            }
            Err(e) => {
                tracing::debug!(kernel = %id, error = %e, "WebSocket read failed");
                break;
            }
        };
        match decoded {
            Ok((Channel::Hb | Channel::Iopub, _)) => {
                drop_message(&st, &id, &WireError::UnknownChannel("hb/iopub (receive-only)".into()))
            }
            Ok((channel, msg)) => {
                if let Some(reply) =
                    over_pending_cap(target.hub(), client, channel, &msg, limits.pending_requests_per_connection)
                {
                    target.hub().release(client, channel, reply, SystemTime::now());
                    continue;
                }
                let forwarded = match &target {
                    ChannelsPeer::Local(kernel, replicas) => {
                        super::cell::forward(&st, kernel, replicas.as_ref(), client, channel, msg).await
                    }
                    ChannelsPeer::Front(front) => front.on_client_message(client, channel, msg),
                };
                if let Err(e) = forwarded {
                    tracing::warn!(kernel = %id, error = format!("{e:#}"), "could not forward a message to the kernel");
                }
            }
            Err(e) => drop_message(&st, &id, &e),
        }
    }
    closing.store(true, Ordering::Release);
    if close_tx.is_none() {
        // The close frame is on its way: let the writer send it.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), &mut writer).await;
    }
    target.hub().disconnect(client);
    writer.abort();
    tracing::info!(kernel = %id, client, "client disconnected");
}

/// `notebookos_refused_total` reasons of the WebSocket caps.
const MESSAGE_TOO_LARGE: &str = "websocket_message_too_large";
const QUEUE_FULL: &str = "websocket_queue_full";
const PENDING_REQUESTS: &str = "pending_requests";

/// Whether a read failed on `limits.websocket_max_message_bytes` (a frame or message over it).
fn is_too_large(e: &axum::Error) -> bool {
    use std::error::Error as _;
    e.source()
        .and_then(|s| s.downcast_ref::<tokio_tungstenite::tungstenite::Error>())
        .is_some_and(|t| matches!(t, tokio_tungstenite::tungstenite::Error::Capacity(_)))
}

/// The error reply to a shell or control request of `client` when it already has `cap`
/// requests awaiting their reply (`limits.pending_requests_per_connection`); `None` lets it through.
fn over_pending_cap(hub: &Hub, client: ClientId, channel: Channel, msg: &Message, cap: usize) -> Option<Message> {
    if !matches!(channel, Channel::Shell | Channel::Control) {
        return None;
    }
    let h = msg.header().ok()?;
    if !h.msg_type.ends_with("_request") || hub.pending_for(client) < cap {
        return None;
    }
    crate::metrics::count_refusal(PENDING_REQUESTS);
    tracing::warn!(client, cap, msg_type = %h.msg_type, "refused a request: too many awaiting their reply on this connection");
    let evalue = format!(
        "{cap} requests of this connection are awaiting their reply (limits.pending_requests_per_connection); wait for them"
    );
    let id = uuid::Uuid::new_v4().to_string();
    crate::jupyter::message::error_reply(msg, "TooManyPendingRequests", &evalue, &id, SystemTime::now())
        .ok()
        .map(|(_, r)| r)
}

fn drop_message(st: &AppState, kernel: &str, e: &WireError) {
    st.metrics
        .messages_dropped_total
        .get_or_create(&DropLabels { source: "websocket".into(), reason: e.kind().into() })
        .inc();
    tracing::warn!(kernel, error = %e, "dropped a WebSocket message");
}

fn encode(channel: Channel, msg: &Message, v1: bool) -> Result<WsFrame, WireError> {
    if v1 {
        return Ok(WsFrame::Binary(ws::to_v1_binary(channel, msg).into()));
    }
    if msg.buffers.is_empty() {
        Ok(WsFrame::Text(ws::to_json_text(channel, msg)?.into()))
    } else {
        Ok(WsFrame::Binary(ws::to_legacy_binary(channel, msg)?.into()))
    }
}
