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

use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::ws::{Message as WsFrame, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};
use subtle::ConstantTimeEq;

use super::auth::presented_token;
use super::error::ApiError;
use super::AppState;
use crate::jupyter::{ws, Channel, Message, WireError, MAX_CLIENT_MESSAGE_BYTES};
use crate::kernel::Kernel;
use crate::metrics::DropLabels;

/// The upgrade handler.
pub async fn channels(State(st): State<Arc<AppState>>, Path(id): Path<String>, req: Request) -> Response {
    let presented = presented_token(&req);
    let kernel = st.kernels.get(&id).await;
    if let Some(expected) = st.token.as_deref() {
        let ok = match &presented {
            Some(t) => bool::from(t.as_bytes().ct_eq(expected.as_bytes())),
            // Capability access: see the module comment.
            None => kernel.is_some(),
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
    let Some(kernel) = kernel else { return ApiError::no_kernel(&id).into_response() };
    let (mut parts, _body) = req.into_parts();
    let upgrade =
        match <WebSocketUpgrade as axum::extract::FromRequestParts<()>>::from_request_parts(&mut parts, &()).await {
            Ok(u) => u,
            Err(rejection) => return rejection.into_response(),
        };
    let upgrade = upgrade.protocols([ws::V1_SUBPROTOCOL]).max_message_size(MAX_CLIENT_MESSAGE_BYTES);
    let v1 = upgrade.selected_protocol().is_some();
    upgrade.on_upgrade(move |socket| serve(socket, kernel, st, v1))
}

async fn serve(socket: WebSocket, kernel: Arc<Kernel>, st: Arc<AppState>, v1: bool) {
    let (client, mut outgoing, replayed) = kernel.hub.connect();
    tracing::info!(kernel = %kernel.id, client, v1, replayed, "client connected");
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
                tracing::debug!(kernel = %kernel.id, error = %e, "WebSocket read failed");
                break;
            }
        };
        match decoded {
            Ok((Channel::Hb | Channel::Iopub, _)) => {
                drop_message(&st, &kernel.id, &WireError::UnknownChannel("hb/iopub (receive-only)".into()))
            }
            Ok((channel, msg)) => {
                if let Err(e) = super::cell::forward(&st, &kernel, client, channel, msg).await {
                    tracing::warn!(kernel = %kernel.id, error = format!("{e:#}"), "could not forward a message to the kernel");
                }
            }
            Err(e) => drop_message(&st, &kernel.id, &e),
        }
    }
    kernel.hub.disconnect(client);
    writer.abort();
    tracing::info!(kernel = %kernel.id, client, "client disconnected");
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
