//! The HTTP listener, plain or TLS, as an [`axum::serve::Listener`]. Each connection's
//! [`Peer`] (address and verified client certificate) reaches the handlers as
//! `ConnectInfo<Peer>` (serve the router with `into_make_service_with_connect_info::<Peer>()`).
//!
//! TLS handshakes run in their own tasks, bounded by [`HANDSHAKE_TIMEOUT`], so a client
//! that stalls mid-handshake holds neither the accept loop nor other clients.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::IncomingStream;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::link::tls::{ClientCertificate, Peer};

/// How long a client may take to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshaken connections waiting for the server to take them.
const READY_QUEUE: usize = 64;

/// A connection's byte stream, plain or TLS.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}

impl Connected<IncomingStream<'_, HttpListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, HttpListener>) -> Self {
        stream.remote_addr().clone()
    }
}

/// The host's HTTP listener.
pub struct HttpListener {
    local: SocketAddr,
    kind: Kind,
}

enum Kind {
    Plain(TcpListener),
    /// Handshakes run in tasks fed by an accept task; finished ones come through the channel.
    Tls(mpsc::Receiver<(Box<dyn Io>, Peer)>, tokio::task::JoinHandle<()>),
}

impl Drop for HttpListener {
    fn drop(&mut self) {
        if let Kind::Tls(_, accept) = &self.kind {
            accept.abort();
        }
    }
}

impl HttpListener {
    /// Plain HTTP on `listener`.
    pub fn plain(listener: TcpListener) -> std::io::Result<Self> {
        Ok(Self { local: listener.local_addr()?, kind: Kind::Plain(listener) })
    }

    /// HTTPS on `listener` with `config`.
    pub fn tls(listener: TcpListener, config: Arc<rustls::ServerConfig>) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let (tx, rx) = mpsc::channel(READY_QUEUE);
        let accept = tokio::spawn(async move {
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
                nodelay(&tcp);
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let client_cert = tls
                                .get_ref()
                                .1
                                .peer_certificates()
                                .and_then(|c| c.first())
                                .map(|c| ClientCertificate(Arc::new(c.clone().into_owned())));
                            let _ = tx.send((Box::new(tls) as Box<dyn Io>, Peer { addr, client_cert })).await;
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
        Ok(Self { local, kind: Kind::Tls(rx, accept) })
    }
}

fn nodelay(tcp: &TcpStream) {
    // Small WebSocket frames (a cell's messages) must not wait for Nagle's algorithm.
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "could not set TCP_NODELAY");
    }
}

impl axum::serve::Listener for HttpListener {
    type Io = Box<dyn Io>;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match &mut self.kind {
            Kind::Plain(listener) => loop {
                match TcpListener::accept(listener).await {
                    Ok((tcp, addr)) => {
                        nodelay(&tcp);
                        return (Box::new(tcp), Peer { addr, client_cert: None });
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            },
            Kind::Tls(rx, _) => match rx.recv().await {
                Some(conn) => conn,
                // The accept task never ends on its own; if it did, stop accepting.
                None => std::future::pending().await,
            },
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(Peer { addr: self.local, client_cert: None })
    }
}
