//! The path of one client message into a kernel; `execute_request`s are cells.

use std::sync::Arc;

use super::AppState;
use crate::jupyter::{Channel, Message};
use crate::kernel::hub::ClientId;
use crate::kernel::Kernel;

/// Forwards a client message to the kernel's executing replica.
pub async fn forward(
    _st: &AppState,
    kernel: &Arc<Kernel>,
    client: ClientId,
    channel: Channel,
    msg: Message,
) -> anyhow::Result<()> {
    kernel.send_from_client(client, channel, msg).await
}
