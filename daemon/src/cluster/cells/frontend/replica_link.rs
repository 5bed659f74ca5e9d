//! The link from a front-end kernel to one replica host, kept up (with backoff) while the
//! kernel lives: in-process to this host's own replica ([`crate::cluster::cells::local_link`]),
//! else the internal WebSocket to the other host's gateway (`/internal/v1/replicas/{id}/channels`, [`crate::link::peer_routes`]).

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::tungstenite::Message as WsFrame;

use super::events::Event;
use super::kernel::{FrontendKernel, Link};
use super::shared::Shared;
use crate::cluster::cells::local_link::LocalLink;
use crate::jupyter::{ws, Channel, Message};
use crate::link::client::ChannelsSocket;

/// Reconnect backoff of an internal WebSocket.
const LINK_BACKOFF_MIN: Duration = Duration::from_millis(50);
const LINK_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Starts (once) the link to `node`'s replica of `k`'s kernel.
pub(super) fn ensure_link(k: &Arc<FrontendKernel>, node: u64) {
    let mut links = k.links();
    if links.contains_key(&node) {
        return;
    }
    let (out_tx, out_rx) = mpsc::unbounded_channel();
    let (conn_tx, conn_rx) = watch::channel(false);
    let task = tokio::spawn(run_link(Arc::downgrade(k), node, out_rx, conn_tx));
    links.insert(node, Link { out: out_tx, connected: conn_rx, task });
}

/// Makes `k`'s links those to `hosts` (the record's replica hosts and a move's target):
/// starts missing ones, and stops the links to hosts that no longer hold a replica. A
/// replica that moves back to a host later gets a fresh link: the old one's WebSocket was
/// attached to the replica that host stopped.
pub(super) fn keep_links(k: &Arc<FrontendKernel>, hosts: &[u64]) {
    let stale: Vec<Link> = {
        let mut links = k.links();
        let gone: Vec<u64> = links.keys().filter(|n| !hosts.contains(n)).copied().collect();
        gone.iter().filter_map(|n| links.remove(n)).collect()
    };
    for l in stale {
        l.task.abort();
    }
    for &node in hosts {
        ensure_link(k, node);
    }
}

/// Keeps the link to one replica host up while the kernel lives.
async fn run_link(
    kernel: Weak<FrontendKernel>,
    node: u64,
    mut out: mpsc::UnboundedReceiver<(Channel, Message)>,
    connected: watch::Sender<bool>,
) {
    let mut backoff = LINK_BACKOFF_MIN;
    loop {
        let Some(k) = kernel.upgrade() else { return };
        let (id, shared, events) = (k.id.clone(), k.shared.clone(), k.events.clone());
        drop(k);
        // This host's own replica in-process; another host's through its gateway.
        let local = shared.local.get().filter(|(me, _)| *me == node).map(|(_, l)| l.clone());
        let session = match local {
            Some(local) => local.connect(&id).await.map(Session::Local),
            None => connect_remote(&shared, node, &id).await.map(|s| Session::Remote(Box::new(s))),
        };
        let Some(session) = session else {
            if shared.kernel(&id).await.is_none() {
                tracing::info!(kernel = %id, node, "kernel deleted; replica link stops");
                return;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(LINK_BACKOFF_MAX);
            continue;
        };
        backoff = LINK_BACKOFF_MIN;
        let how = session.name();
        tracing::info!(kernel = %id, node, how, "replica link connected");
        // Whatever was queued for the previous connection belongs to rounds already decided.
        while out.try_recv().is_ok() {}
        connected.send_replace(true);
        let _ = events.send(Event::Link { node, up: true });
        let gone = match session {
            Session::Local(link) => run_local_link(&kernel, node, &id, link, &mut out).await,
            Session::Remote(socket) => run_remote_link(&kernel, node, &id, *socket, &mut out).await,
        };
        if gone {
            return;
        }
        tracing::warn!(kernel = %id, node, how, "replica link lost");
        connected.send_replace(false);
        let _ = events.send(Event::Link { node, up: false });
    }
}

/// One connection of a replica link.
enum Session {
    /// This host's replica, in-process.
    Local(LocalLink),
    /// Another host's replica, by WebSocket to its gateway (`/internal/v1/replicas/{id}/channels`, [`crate::link::peer_routes`]).
    Remote(Box<ChannelsSocket>),
}

impl Session {
    fn name(&self) -> &'static str {
        match self {
            Session::Local(_) => "in-process",
            Session::Remote(_) => "websocket",
        }
    }
}

/// Opens the internal WebSocket to `node`'s replica of kernel `id` (`None`: not now).
async fn connect_remote(shared: &Shared, node: u64, id: &str) -> Option<ChannelsSocket> {
    let url = shared.hosts().await.get(&node).map(|h| h.gateway_url.clone())?;
    let client = crate::link::host::gateway_client(&url);
    match tokio::time::timeout(Duration::from_secs(5), client.connect_local_replica(id)).await {
        Ok(Ok(s)) => Some(s),
        Ok(Err(e)) => {
            tracing::debug!(kernel = %id, node, error = format!("{e:#}"), "replica link not up yet");
            None
        }
        Err(_) => None,
    }
}

/// Carries one WebSocket link until it breaks (`false`) or the front-end is gone (`true`).
async fn run_remote_link(
    kernel: &Weak<FrontendKernel>,
    node: u64,
    id: &str,
    socket: ChannelsSocket,
    out: &mut mpsc::UnboundedReceiver<(Channel, Message)>,
) -> bool {
    let (mut tx, mut rx) = socket.split();
    loop {
        tokio::select! {
            m = out.recv() => {
                let Some((channel, msg)) = m else { return true };
                if let Err(e) = tx.send(WsFrame::Binary(ws::to_v1_binary(channel, &msg).into())).await {
                    tracing::debug!(kernel = %id, node, error = %e, "replica link send failed");
                    return false;
                }
            }
            f = rx.next() => match f {
                Some(Ok(WsFrame::Binary(b))) => match ws::from_v1_binary(&b) {
                    Ok((channel, msg)) => match kernel.upgrade() {
                        Some(k) => k.on_replica_message(node, channel, msg),
                        None => return true,
                    },
                    Err(e) => tracing::warn!(kernel = %id, node, error = %e, "undecodable message from a replica host"),
                },
                Some(Ok(WsFrame::Close(_))) | None => return false,
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::debug!(kernel = %id, node, error = %e, "replica link failed");
                    return false;
                }
            },
        }
    }
}

/// Carries one in-process link until it breaks (`false`) or the front-end is gone (`true`).
async fn run_local_link(
    kernel: &Weak<FrontendKernel>,
    node: u64,
    id: &str,
    link: LocalLink,
    out: &mut mpsc::UnboundedReceiver<(Channel, Message)>,
) -> bool {
    let LocalLink { mut rx, send, close } = link;
    let gone = loop {
        tokio::select! {
            m = out.recv() => {
                let Some((channel, msg)) = m else { break true };
                // As the WebSocket handler does: a message the replica refuses is logged, the
                // link stays.
                if let Err(e) = send(channel, msg).await {
                    tracing::warn!(kernel = %id, node, error = format!("{e:#}"), "could not forward a message to the local replica");
                }
            }
            m = rx.recv() => match m {
                Some((channel, msg)) => match kernel.upgrade() {
                    Some(k) => k.on_replica_message(node, channel, msg),
                    None => break true,
                },
                None => break false,
            },
        }
    };
    close();
    gone
}
