//! The HTTP listener, plain or TLS: accepted connections with their [`Peer`] (address and
//! verified client certificate, which [`super::serve`] hands the handlers as
//! `ConnectInfo<Peer>`) and their [`ConnSlot`] in the connection caps.
//!
//! A connection takes its slot at TCP accept, before any byte is read: one over
//! `http.max_connections` or `http.max_connections_per_source` is closed there. TLS
//! handshakes run in their own tasks, bounded by `http.header_read_timeout`, so a client
//! that stalls mid-handshake holds neither the accept loop nor other clients.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::conn_caps::{ConnCaps, ConnSlot};
use crate::link::tls::{ClientCertificate, Peer};

/// Handshaken connections waiting for the server to take them.
const READY_QUEUE: usize = 64;

/// A connection's byte stream, plain or TLS.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}

/// An accepted connection.
pub struct Accepted {
    /// Its bytes (after the TLS handshake on an HTTPS listener).
    pub io: Box<dyn Io>,
    /// Who is at the other end.
    pub peer: Peer,
    /// Its place in the connection caps.
    pub slot: ConnSlot,
}

/// The host's HTTP listener.
pub struct HttpListener {
    kind: Kind,
    caps: Arc<ConnCaps>,
}

enum Kind {
    Plain(TcpListener),
    /// Handshakes run in tasks fed by an accept task; finished ones come through the channel.
    Tls(mpsc::Receiver<Accepted>, tokio::task::JoinHandle<()>),
}

impl Drop for HttpListener {
    fn drop(&mut self) {
        if let Kind::Tls(_, accept) = &self.kind {
            accept.abort();
        }
    }
}

impl HttpListener {
    /// Plain HTTP on `listener`, within `caps`.
    pub fn plain(listener: TcpListener, caps: Arc<ConnCaps>) -> Self {
        Self { kind: Kind::Plain(listener), caps }
    }

    /// HTTPS on `listener` with `config`, within `caps`; a client has `handshake_timeout`
    /// to finish its TLS handshake.
    pub fn tls(
        listener: TcpListener,
        config: Arc<rustls::ServerConfig>,
        caps: Arc<ConnCaps>,
        handshake_timeout: Duration,
    ) -> Self {
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let (tx, rx) = mpsc::channel(READY_QUEUE);
        let accept_caps = caps.clone();
        let accept = tokio::spawn(async move {
            loop {
                let (tcp, addr, slot) = accept_within(&listener, &accept_caps).await;
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let client_cert = tls
                                .get_ref()
                                .1
                                .peer_certificates()
                                .and_then(|c| c.first())
                                .map(|c| ClientCertificate(Arc::new(c.clone().into_owned())));
                            let io = Box::new(tls) as Box<dyn Io>;
                            let _ = tx.send(Accepted { io, peer: Peer { addr, client_cert }, slot }).await;
                        }
                        // A client certificate from another CA ends here: refused in the handshake.
                        Ok(Err(e)) => {
                            crate::metrics::count_auth_refusal("tls_handshake");
                            tracing::info!(peer = %addr, error = %e, "TLS handshake refused");
                        }
                        Err(_) => {
                            crate::metrics::count_auth_refusal("tls_handshake_timeout");
                            tracing::info!(peer = %addr, "TLS handshake timed out");
                        }
                    }
                });
            }
        });
        Self { kind: Kind::Tls(rx, accept), caps }
    }

    /// The connection caps.
    pub fn caps(&self) -> &Arc<ConnCaps> {
        &self.caps
    }

    /// The next connection (handshaken, on an HTTPS listener) within the caps.
    pub async fn accept(&mut self) -> Accepted {
        match &mut self.kind {
            Kind::Plain(listener) => {
                let (tcp, addr, slot) = accept_within(listener, &self.caps).await;
                Accepted { io: Box::new(tcp), peer: Peer { addr, client_cert: None }, slot }
            }
            Kind::Tls(rx, _) => match rx.recv().await {
                Some(conn) => conn,
                // The accept task never ends on its own; if it did, stop accepting.
                None => std::future::pending().await,
            },
        }
    }
}

/// The next TCP connection that fits the caps; the others are closed at once (counted by
/// [`ConnCaps::open`]).
async fn accept_within(listener: &TcpListener, caps: &Arc<ConnCaps>) -> (TcpStream, SocketAddr, ConnSlot) {
    loop {
        let (tcp, addr) = match listener.accept().await {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!(error = %e, "accept failed");
                // EMFILE and the like: let the system breathe (as axum's listener does).
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        match caps.open(addr.ip()) {
            Ok(slot) => {
                nodelay(&tcp);
                return (tcp, addr, slot);
            }
            // Dropping the stream closes it.
            Err(_refused) => drop(tcp),
        }
    }
}

fn nodelay(tcp: &TcpStream) {
    // Small WebSocket frames (a cell's messages) must not wait for Nagle's algorithm.
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "could not set TCP_NODELAY");
    }
}
