//! The path of one client message into a kernel; `execute_request`s are cells,
//! which per-cell GPU binding may hold back until their GPUs are committed. On a
//! cluster replica host, a front-end's `execute_request` carrying
//! `metadata.nbos_election` goes to the replica host's election first.

use std::sync::Arc;
use std::time::Instant;

use super::state::AppState;
use crate::cluster::cells::replica_host::{Handled, ReplicaHost};
use crate::jupyter::{Channel, Message};
use crate::kernel::hub::ClientId;
use crate::kernel::LocalKernel;

/// Forwards a client message to the kernel's executing replica (or to binding).
pub async fn forward(
    st: &AppState,
    kernel: &Arc<LocalKernel>,
    replicas: Option<&Arc<ReplicaHost>>,
    client: ClientId,
    channel: Channel,
    msg: Message,
) -> anyhow::Result<()> {
    let msg = match replicas {
        Some(host) if channel == Channel::Shell => match host.handle_execute(kernel, client, msg).await {
            Handled::Handled => return Ok(()),
            Handled::PassThrough(m) => m,
        },
        _ => msg,
    };
    if channel == Channel::Shell {
        if let Ok(h) = msg.header() {
            if h.msg_type == "execute_request" {
                kernel.hub.note_submitted(&h.msg_id, Instant::now());
            }
        }
    }
    match st.kernels.binder().on_client_message(kernel, client, channel, msg) {
        Some(msg) => kernel.send_from_client(client, channel, msg).await,
        None => Ok(()),
    }
}
