//! `[http]`: the one HTTP listener (address, credentials, TLS, connection limits).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// `[http]`: the one HTTP listener.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Address and port to listen on.
    pub listen: SocketAddr,
    /// File holding the API token clients must present. Required unless `listen`
    /// is a loopback address and `allow_unauthenticated_loopback` is true.
    pub token_file: Option<PathBuf>,
    /// Permit a token-less API on a loopback listener (what `--dev` does).
    pub allow_unauthenticated_loopback: bool,
    /// Serve HTTPS with this certificate (and accept client certificates from `client_ca`).
    pub tls: Option<HttpTlsConfig>,
    /// Permit plain HTTP on a non-loopback listener: only behind a TLS-terminating proxy.
    pub allow_plaintext: bool,
    /// File holding the operator token: membership, drain and re-placement need it.
    pub operator_token_file: Option<PathBuf>,
    /// Time a client has for its TLS handshake, and for each request's head (line and headers).
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// A connection that moves no byte this long with no request being handled is closed
    /// (an open WebSocket is not: it counts under `limits.websocket_connections`).
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Open HTTP connections (not yet WebSockets), all clients together; more are closed at accept.
    pub max_connections: usize,
    /// Open HTTP connections from one source address (an IPv6 /64); more are closed at accept.
    pub max_connections_per_source: usize,
}

/// `[http].tls`: the HTTPS listener's material (PEM files).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpTlsConfig {
    /// Server certificate chain.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// CA whose client certificates are accepted as credentials (users' API; and for
    /// cluster-internal routes, a certificate naming `node-<id>`).
    pub client_ca: Option<PathBuf>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8888)),
            token_file: None,
            allow_unauthenticated_loopback: false,
            tls: None,
            allow_plaintext: false,
            operator_token_file: None,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 4096,
            max_connections_per_source: 256,
        }
    }
}
