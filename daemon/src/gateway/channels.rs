//! `GET /api/kernels/{id}/channels`: the kernel's five channels over one WebSocket.
//!
//! Authentication: the API token (header or `?token=`) as everywhere. One
//! exception, because jupyter_server's `GatewayKernelClient` opens this socket
//! with `websocket.create_connection(url)` and no headers at all (jupyter_server
//! 2.x, `gateway/managers.py`): a request that presents *no* token is accepted for
//! an *existing* kernel id. Kernel ids are random UUIDv4s (122 bits) that only a
//! token holder can learn (create or list), so the id works as a capability for
//! that one kernel. A *wrong* token is always refused. JupyterLab's path
//! (`GatewayWebSocketConnection`) does send the header.
//!
//! Cluster mode: the socket is served by this host's front-end of the kernel
//! (which elects a replica per cell); `?replica=local` (token required, no capability
//! access) is the cluster-internal socket onto this host's own replica.

use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::ws::{Message as WsFrame, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};

use super::cluster::{self, wants_local_replica};
use super::error::ApiError;
use super::state::AppState;
use crate::cluster::frontend::FrontendKernel;
use crate::cluster::replica_host::ReplicaHost;
use crate::jupyter::{ws, Channel, Message, WireError, MAX_CLIENT_MESSAGE_BYTES};
use crate::kernel::hub::Hub;
use crate::kernel::Kernel;
use crate::link::token::{presented_token, token_matches};
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
    let presented = presented_token(&req);
    let local_replica = wants_local_replica(req.uri().query());
    // Cluster mode: clients reach the kernel's front-end on this host; other hosts'
    // front-ends reach this host's replica with `?replica=local`.
    let target = match &mode {
        Some(mode) if !local_replica => match mode.cluster.kernel(&id).await {
            Ok(Some(record)) => Some(Target::Front(mode.frontends.open(&record))),
            Ok(None) => None,
            Err(e) => {
                return ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: format!("meta store: {e}") }
                    .into_response()
            }
        },
        Some(mode) => st.kernels.get(&id).await.map(|k| Target::Local(k, Some(mode.replicas.clone()))),
        None => st.kernels.get(&id).await.map(|k| Target::Local(k, None)),
    };
    if let Some(expected) = st.token.as_deref() {
        let ok = match &presented {
            Some(t) => token_matches(t, expected),
            // Capability access: see the module comment. Never for the cluster-internal socket.
            None => target.is_some() && !local_replica,
        };
        if !ok {
            tracing::warn!(path = %req.uri().path(), token_present = presented.is_some(), "refused WebSocket: bad or missing token");
            return (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "token")], "401: missing or wrong token\n")
                .into_response();
        }
        if presented.is_none() {
            tracing::debug!(kernel = %id, "WebSocket without a token admitted by kernel id");
        }
    }
    let Some(target) = target else { return ApiError::no_kernel(&id).into_response() };
    let (mut parts, _body) = req.into_parts();
    let upgrade =
        match <WebSocketUpgrade as axum::extract::FromRequestParts<()>>::from_request_parts(&mut parts, &()).await {
            Ok(u) => u,
            Err(rejection) => return rejection.into_response(),
        };
    let upgrade = upgrade.protocols([ws::V1_SUBPROTOCOL]).max_message_size(MAX_CLIENT_MESSAGE_BYTES);
    let v1 = upgrade.selected_protocol().is_some();
    upgrade.on_upgrade(move |socket| serve(socket, target, st, v1))
}

/// What a client socket talks to.
enum Target {
    /// A kernel hosted here (single-host mode, or this host's replica of a cluster kernel).
    Local(Arc<Kernel>, Option<Arc<ReplicaHost>>),
    /// This host's front-end of a cluster kernel.
    Front(Arc<FrontendKernel>),
}

impl Target {
    fn id(&self) -> &str {
        match self {
            Target::Local(k, _) => &k.id,
            Target::Front(f) => &f.id,
        }
    }

    fn hub(&self) -> &Arc<Hub> {
        match self {
            Target::Local(k, _) => &k.hub,
            Target::Front(f) => &f.hub,
        }
    }
}

async fn serve(socket: WebSocket, target: Target, st: Arc<AppState>, v1: bool) {
    let (client, mut outgoing, replayed) = target.hub().connect();
    let id = target.id().to_owned();
    tracing::info!(kernel = %id, client, v1, replayed, "client connected");
    let (mut sink, mut stream) = socket.split();
    let writer = tokio::spawn(async move {
        while let Some((channel, msg)) = outgoing.recv().await {
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
    while let Some(frame) = stream.next().await {
        let decoded = match frame {
            Ok(WsFrame::Text(t)) => ws::from_json_text(t.as_str(), SystemTime::now()),
            Ok(WsFrame::Binary(b)) if v1 => ws::from_v1_binary(&b),
            Ok(WsFrame::Binary(b)) => ws::from_legacy_binary(&b, SystemTime::now()),
            Ok(WsFrame::Close(_)) => break,
            Ok(WsFrame::Ping(_) | WsFrame::Pong(_)) => continue,
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
                let forwarded = match &target {
                    Target::Local(kernel, replicas) => {
                        super::cell::forward(&st, kernel, replicas.as_ref(), client, channel, msg).await
                    }
                    Target::Front(front) => front.on_client_message(client, channel, msg),
                };
                if let Err(e) = forwarded {
                    tracing::warn!(kernel = %id, error = format!("{e:#}"), "could not forward a message to the kernel");
                }
            }
            Err(e) => drop_message(&st, &id, &e),
        }
    }
    target.hub().disconnect(client);
    writer.abort();
    tracing::info!(kernel = %id, client, "client disconnected");
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
