//! A client of a host's Kernel Gateway API: `nbos kernel-proxy`, `nbos bench`, and the
//! cluster front-end's internal WebSocket to another host's replica.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;

use super::endpoint::{Endpoint, ENDPOINT_FILE};
use super::token::read_token_file;
use crate::kernel::KernelModel;

/// A WebSocket to a kernel's channels.
pub type ChannelsSocket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Where the gateway is and the token it wants.
#[derive(Debug, Clone)]
pub struct GatewayClient {
    /// Base URL without a trailing slash.
    pub url: String,
    token: Option<String>,
    agent: ureq::Agent,
}

impl GatewayClient {
    /// A client for `url` with `token`.
    pub fn new(url: &str, token: Option<String>) -> Self {
        // Kernel start waits for the kernel to answer; allow for a slow machine.
        let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(120)).build();
        Self { url: url.trim_end_matches('/').to_owned(), token, agent }
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
        Ok(Self::new(&url, token))
    }

    fn request(&self, method: &str, path: &str) -> ureq::Request {
        let mut r = self.agent.request(method, &format!("{}{path}", self.url));
        if let Some(t) = &self.token {
            r = r.set("Authorization", &format!("token {t}"));
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
    /// (`?replica=local`): the cluster front-end's internal socket to a replica host.
    pub async fn connect_local_replica(&self, id: &str) -> anyhow::Result<ChannelsSocket> {
        self.open_channels(id, true, "?replica=local").await
    }

    async fn open_channels(&self, id: &str, v1: bool, query: &str) -> anyhow::Result<ChannelsSocket> {
        let ws_url = format!("{}/api/kernels/{id}/channels{query}", self.url.replacen("http", "ws", 1));
        let mut req = ws_url.as_str().into_client_request().with_context(|| format!("bad WebSocket URL {ws_url}"))?;
        if let Some(t) = &self.token {
            req.headers_mut()
                .insert("Authorization", HeaderValue::from_str(&format!("token {t}")).context("token is not ASCII")?);
        }
        if v1 {
            req.headers_mut()
                .insert("Sec-WebSocket-Protocol", HeaderValue::from_static(crate::jupyter::ws::V1_SUBPROTOCOL));
        }
        let (socket, _resp) = tokio_tungstenite::connect_async_with_config(req, None, true)
            .await
            .with_context(|| format!("opening WebSocket {ws_url}"))?;
        Ok(socket)
    }
}

/// True when `err` (from [`GatewayClient::connect_channels`]) is the gateway saying
/// the kernel does not exist there (HTTP 404), as opposed to the gateway being unreachable.
pub fn is_not_found(err: &anyhow::Error) -> bool {
    use tokio_tungstenite::tungstenite::Error as WsError;
    err.chain().any(|e| {
        e.downcast_ref::<WsError>().is_some_and(|w| matches!(w, WsError::Http(r) if r.status().as_u16() == 404))
    })
}
