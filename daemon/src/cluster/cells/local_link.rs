//! The front-end's link to this host's own replica of a kernel, in-process: the same
//! client connection the internal channels WebSocket handler makes, without the socket.
//! The cell path then skips two WebSocket hops (and their encoding) each way whenever a
//! kernel's executor runs on the host whose gateway the client uses.

use futures_util::future::BoxFuture;
use tokio::sync::mpsc;

use crate::jupyter::{Channel, Message};

/// This host's replicas, as the gateway serves them to front-ends.
pub trait LocalReplicas: Send + Sync {
    /// Connects to this host's replica of `kernel` as a client; `None` while there is none.
    fn connect(&self, kernel: &str) -> BoxFuture<'static, Option<LocalLink>>;
}

/// Sends one client message to the replica.
pub type SendToReplica = Box<dyn Fn(Channel, Message) -> BoxFuture<'static, anyhow::Result<()>> + Send + Sync>;

/// An in-process client connection to a local replica.
pub struct LocalLink {
    /// What the replica sends to this client (closed when the replica's kernel goes).
    pub rx: mpsc::Receiver<(Channel, Message)>,
    /// Sends a client message to the replica, as its WebSocket handler would.
    pub send: SendToReplica,
    /// Ends the connection (the replica's hub forgets the client).
    pub close: Box<dyn FnOnce() + Send>,
}

impl std::fmt::Debug for LocalLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalLink").finish_non_exhaustive()
    }
}
