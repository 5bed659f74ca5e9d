//! A client of a host's Kernel Gateway API: `nbos kernel-proxy`, `nbos bench`, and the
//! cluster front-end's internal WebSocket to another host's replica.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;

use super::endpoint::{Endpoint, ENDPOINT_FILE};
use super::peer_routes::{self, ReplicaCall};
use super::token::read_token_file;
use crate::kernel::KernelModel;

/// A connection's byte stream, plain or TLS.
pub trait ClientIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + std::fmt::Debug + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + std::fmt::Debug + 'static> ClientIo for T {}

/// A WebSocket to a kernel's channels.
pub type ChannelsSocket = tokio_tungstenite::WebSocketStream<Box<dyn ClientIo>>;

/// The largest cluster status the proxy reads (thousands of hosts fit in a few MiB).
const CLUSTER_STATUS_MAX_BYTES: u64 = 8 << 20;

/// Kernel start waits for the kernel to answer; allow for a slow machine.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// Where the gateway is and the credential it wants.
#[derive(Clone)]
pub struct GatewayClient {
    /// Base URL without a trailing slash.
    pub url: String,
    token: Option<String>,
    agent: ureq::Agent,
    /// TLS for https:// URLs (servers chain to its roots; its client certificate, if any, is presented).
    tls: Option<Arc<rustls::ClientConfig>>,
    /// Host-to-host calls: this host's node id, proved by the node certificate in `tls`.
    node_id: Option<u64>,
}

impl std::fmt::Debug for GatewayClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayClient").field("url", &self.url).field("node_id", &self.node_id).finish_non_exhaustive()
    }
}

impl GatewayClient {
    /// A client for `url` with `token`.
    pub fn new(url: &str, token: Option<String>) -> Self {
        let agent = ureq::AgentBuilder::new().timeout(REQUEST_TIMEOUT).build();
        Self { url: url.trim_end_matches('/').to_owned(), token, agent, tls: None, node_id: None }
    }

    /// Speaks TLS with `config` (https:// URLs, REST and WebSockets).
    pub fn with_tls(mut self, config: Arc<rustls::ClientConfig>) -> Self {
        self.agent = ureq::AgentBuilder::new().timeout(REQUEST_TIMEOUT).tls_config(config.clone()).build();
        self.tls = Some(config);
        self
    }

    /// Calls as host `node_id` of the cluster (its node certificate must be in the TLS config).
    pub fn as_node(mut self, node_id: u64) -> Self {
        self.node_id = Some(node_id);
        self
    }

    /// Resolves the URL and token: explicit values, then a token file, then the
    /// endpoint file a local daemon writes in `runtime_dir`.
    pub fn resolve(
        url: Option<&str>,
        token: Option<&str>,
        token_file: Option<&Path>,
        runtime_dir: &Path,
    ) -> anyhow::Result<Self> {
        let endpoint: Option<Endpoint> =
            std::fs::read_to_string(runtime_dir.join(ENDPOINT_FILE)).ok().and_then(|t| serde_json::from_str(&t).ok());
        let url = match (url, &endpoint) {
            (Some(u), _) => u.to_owned(),
            (None, Some(e)) => e.url.clone(),
            (None, None) => "http://127.0.0.1:8888".to_owned(),
        };
        let token = match (token, token_file, &endpoint) {
            (Some(t), _, _) => Some(t.to_owned()),
            (None, Some(f), _) => Some(read_token_file(f)?),
            (None, None, Some(Endpoint { token_file: Some(f), url: eurl, .. })) if *eurl == url => {
                Some(read_token_file(f)?)
            }
            _ => None,
        };
        let client = Self::new(&url, token);
        // The local daemon's own URL: verified against the CA its endpoint file names.
        match endpoint.as_ref().and_then(|e| e.ca_for(&url)) {
            Some(ca) => Ok(client.with_tls(super::tls::client_config(ca, None)?)),
            None => Ok(client),
        }
    }

    fn request(&self, method: &str, path: &str) -> ureq::Request {
        let mut r = self.agent.request(method, &format!("{}{path}", self.url));
        if let Some(t) = &self.token {
            r = r.set("Authorization", &format!("token {t}"));
        }
        if let Some(id) = self.node_id {
            r = r.set(super::credential::NODE_HEADER, &id.to_string());
        }
        r
    }

    fn call(&self, req: ureq::Request, body: Option<serde_json::Value>) -> anyhow::Result<ureq::Response> {
        let what = format!("{} {}", req.method(), req.url());
        let res = match body {
            Some(b) => req.send_json(b),
            None => req.call(),
        };
        res.map_err(|e| Self::error(&what, e))
    }

    fn error(what: &str, e: ureq::Error) -> anyhow::Error {
        match e {
            ureq::Error::Status(401, _) => anyhow::anyhow!("{what}: the gateway refused the token (401)"),
            ureq::Error::Status(code, r) => {
                anyhow::anyhow!("{what}: HTTP {code}: {}", r.into_string().unwrap_or_default().trim())
            }
            e => anyhow::anyhow!(e).context(format!("{what}: cannot reach the gateway")),
        }
    }

    /// `POST /api/kernels` (blocking).
    pub fn create_kernel(&self, name: &str, gpus: Option<u32>) -> anyhow::Result<KernelModel> {
        let mut body = serde_json::json!({ "name": name });
        if let Some(g) = gpus {
            body["gpus"] = g.into();
        }
        self.call(self.request("POST", "/api/kernels"), Some(body))?.into_json().context("decoding the kernel model")
    }

    /// The same client (credential, TLS, identity) for the gateway at `url`.
    pub fn at(&self, url: &str) -> Self {
        Self { url: url.trim_end_matches('/').to_owned(), ..self.clone() }
    }

    /// The gateway URLs of the cluster's live hosts, from `GET /api/v1/cluster/status`
    /// (blocking); none when the gateway is not a cluster host (404).
    pub fn cluster_gateways(&self) -> anyhow::Result<Vec<String>> {
        let status: serde_json::Value = match self.request("GET", "/api/v1/cluster/status").call() {
            // Read to a cap: a gateway the proxy only learned of must not make it hold any size.
            Ok(r) => {
                use std::io::Read;
                serde_json::from_reader(r.into_reader().take(CLUSTER_STATUS_MAX_BYTES))
                    .context("decoding the cluster status (at most 8 MiB)")?
            }
            Err(ureq::Error::Status(404, _)) => return Ok(Vec::new()),
            Err(e) => return Err(Self::error("GET /api/v1/cluster/status", e)),
        };
        let members =
            status.get("members").and_then(serde_json::Value::as_array).map(Vec::as_slice).unwrap_or_default();
        Ok(members
            .iter()
            .filter(|m| m.get("up").and_then(serde_json::Value::as_bool) == Some(true))
            .filter_map(|m| m.pointer("/host/gateway_url").and_then(serde_json::Value::as_str))
            .map(|u| u.trim_end_matches('/').to_owned())
            .collect())
    }

    /// `GET /api/kernels` (blocking).
    pub fn list_kernels(&self) -> anyhow::Result<Vec<KernelModel>> {
        self.call(self.request("GET", "/api/kernels"), None)?.into_json().context("decoding the kernel list")
    }

    /// `DELETE /api/kernels/{id}` (blocking).
    pub fn delete_kernel(&self, id: &str) -> anyhow::Result<()> {
        self.call(self.request("DELETE", &format!("/api/kernels/{id}")), None).map(drop)
    }

    /// `DELETE /api/kernels/{id}` (blocking); `Ok(false)` when the kernel was already gone.
    pub fn delete_kernel_if_exists(&self, id: &str) -> anyhow::Result<bool> {
        let req = self.request("DELETE", &format!("/api/kernels/{id}"));
        let what = format!("DELETE {}", req.url());
        match req.call() {
            Ok(_) => Ok(true),
            Err(ureq::Error::Status(404, _)) => Ok(false),
            Err(e) => Err(Self::error(&what, e)),
        }
    }

    /// `POST /api/kernels/{id}/interrupt` (blocking).
    pub fn interrupt_kernel(&self, id: &str) -> anyhow::Result<()> {
        self.call(self.request("POST", &format!("/api/kernels/{id}/interrupt")), None).map(drop)
    }

    /// Opens `/api/kernels/{id}/channels`, offering the v1 binary subprotocol when `v1`.
    pub async fn connect_channels(&self, id: &str, v1: bool) -> anyhow::Result<ChannelsSocket> {
        self.open_channels(id, v1, "").await
    }

    /// Opens the channels of the kernel's replica on this host itself
    /// (`/internal/v1/replicas/{id}/channels`, or `?replica=local` on a host that predates
    /// it, see [`super::peer_routes`]): the cluster front-end's internal socket to a
    /// replica host.
    pub async fn connect_local_replica(&self, id: &str) -> anyhow::Result<ChannelsSocket> {
        let call = ReplicaCall::Channels;
        if peer_routes::speaks_internal(&self.url) {
            match self.open_ws(&call.internal_path(id), true).await {
                Err(e) if answered_without_internal_routes(&e) => peer_routes::remember_legacy(&self.url),
                opened => return opened,
            }
        }
        self.open_ws(&call.legacy_path(id), true).await
    }

    async fn open_channels(&self, id: &str, v1: bool, query: &str) -> anyhow::Result<ChannelsSocket> {
        self.open_ws(&format!("/api/kernels/{id}/channels{query}"), v1).await
    }

    /// Opens a WebSocket on `path_and_query` of the gateway.
    async fn open_ws(&self, path_and_query: &str, v1: bool) -> anyhow::Result<ChannelsSocket> {
        let ws_url = format!("{}{path_and_query}", self.url.replacen("http", "ws", 1));
        let mut req = ws_url.as_str().into_client_request().with_context(|| format!("bad WebSocket URL {ws_url}"))?;
        if let Some(t) = &self.token {
            req.headers_mut()
                .insert("Authorization", HeaderValue::from_str(&format!("token {t}")).context("token is not ASCII")?);
        }
        if let Some(id) = self.node_id {
            req.headers_mut().insert(super::credential::NODE_HEADER, HeaderValue::from(id));
        }
        if v1 {
            req.headers_mut()
                .insert("Sec-WebSocket-Protocol", HeaderValue::from_static(crate::jupyter::ws::V1_SUBPROTOCOL));
        }
        let stream = self.connect_stream().await.with_context(|| format!("opening WebSocket {ws_url}"))?;
        let (socket, _resp) = tokio_tungstenite::client_async_with_config(req, stream, None)
            .await
            .with_context(|| format!("opening WebSocket {ws_url}"))?;
        Ok(socket)
    }

    /// A TCP (and for https://, TLS) connection to the gateway.
    async fn connect_stream(&self) -> anyhow::Result<Box<dyn ClientIo>> {
        let url = url::Url::parse(&self.url).with_context(|| format!("bad gateway URL {}", self.url))?;
        let host = url.host_str().context("the gateway URL has no host")?.to_owned();
        let port = url.port_or_known_default().context("the gateway URL has no port")?;
        let tcp = tokio::net::TcpStream::connect((host.trim_matches(['[', ']']), port)).await?;
        // Small WebSocket frames (a cell's messages) must not wait for Nagle's algorithm.
        tcp.set_nodelay(true)?;
        if url.scheme() != "https" {
            return Ok(Box::new(tcp));
        }
        let config = self.tls.clone().context("an https:// gateway needs a CA certificate (--ca-cert)")?;
        let name = rustls::pki_types::ServerName::try_from(host.trim_matches(['[', ']']).to_owned())
            .with_context(|| format!("{host} is not a valid TLS server name"))?;
        let tls = tokio_rustls::TlsConnector::from(config).connect(name, tcp).await?;
        Ok(Box::new(tls))
    }
}

/// True when `err` (from opening an internal route's WebSocket) is a host without internal
/// routes answering (see [`peer_routes::predates_internal_routes`]).
fn answered_without_internal_routes(err: &anyhow::Error) -> bool {
    use tokio_tungstenite::tungstenite::Error as WsError;
    err.chain().any(|e| {
        e.downcast_ref::<WsError>().is_some_and(|w| {
            matches!(w, WsError::Http(r) if peer_routes::predates_internal_routes(
                r.status().as_u16(),
                r.headers().contains_key(peer_routes::INTERNAL_MARKER),
            ))
        })
    })
}

/// True when `err` (from [`GatewayClient::connect_channels`]) is the gateway saying
/// the kernel does not exist there (HTTP 404), as opposed to the gateway being unreachable.
pub fn is_not_found(err: &anyhow::Error) -> bool {
    use tokio_tungstenite::tungstenite::Error as WsError;
    err.chain().any(|e| {
        e.downcast_ref::<WsError>().is_some_and(|w| matches!(w, WsError::Http(r) if r.status().as_u16() == 404))
    })
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    /// A gateway answering the cluster status with `body_len` bytes of a JSON string.
    fn serve_status(body_len: usize) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        std::thread::spawn(move || {
            let Ok((mut s, _)) = listener.accept() else { return };
            let mut head = [0u8; 1024];
            let _ = s.read(&mut head);
            let body = format!("{{\"members\": [], \"pad\": \"{}\"}}", "x".repeat(body_len));
            let _ = write!(s, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
            let _ = s.write_all(body.as_bytes());
        });
        url
    }

    #[test]
    fn a_cluster_status_past_the_cap_is_refused_and_one_within_it_read() {
        assert_eq!(
            GatewayClient::new(&serve_status(1000), None).cluster_gateways().expect("small"),
            Vec::<String>::new()
        );
        let big = usize::try_from(CLUSTER_STATUS_MAX_BYTES).expect("fits") + 1;
        let e = GatewayClient::new(&serve_status(big), None).cluster_gateways().expect_err("over the cap");
        assert!(format!("{e:#}").contains("at most 8 MiB"), "{e:#}");
    }
}
