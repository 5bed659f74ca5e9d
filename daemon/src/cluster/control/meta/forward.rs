//! Running a call on the meta leader: here when this host leads, else forwarded to the
//! leader's cluster API over HTTP (marked with [`FORWARDED_HEADER`] so that it is never
//! forwarded again), retried while the meta group has no leader or it changes.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::error::{ClusterError, Result};
use super::handle::Cluster;

/// Marks a request one host forwarded to another: the receiver runs it itself or fails,
/// never forwards again (no loops while leadership moves).
pub const FORWARDED_HEADER: &str = "x-nbos-forwarded";

impl Cluster {
    /// `NotLeader` unless this host leads the meta group.
    pub(in crate::cluster) async fn require_leader(&self) -> Result<()> {
        let leader = self.meta_leader().await;
        if leader == Some(self.settings.node_id) {
            Ok(())
        } else {
            Err(ClusterError::NotLeader { me: self.settings.node_id, leader })
        }
    }

    /// Runs `local` when this host leads the meta group, else sends the request to the
    /// leader's HTTP API with `authority`. Retries while there is no leader, or it
    /// changes, for up to two election timeouts.
    pub(in crate::cluster) async fn on_leader<B, T, F, Fut>(
        &self,
        method: HttpMethod,
        path: &str,
        body: Option<&B>,
        authority: Authority,
        local: F,
    ) -> Result<T>
    where
        B: Serialize + ?Sized,
        T: serde::de::DeserializeOwned,
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let deadline = Instant::now() + self.store.config().election_timeout() * 3;
        loop {
            let outcome = match self.meta_leader().await {
                Some(l) if l == self.settings.node_id => local().await,
                Some(l) => match self.host(l).await? {
                    Some(h) => self.forward(method, &h.gateway_url, path, body, authority).await,
                    None => Err(ClusterError::NotReady(format!("the meta leader (host {l}) has no host record yet"))),
                },
                None => Err(ClusterError::NotReady("the meta group has no leader".into())),
            };
            match outcome {
                Err(e @ (ClusterError::NotReady(_) | ClusterError::NotLeader { .. })) if Instant::now() < deadline => {
                    tracing::debug!(error = %e, path, "waiting for the meta leader");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(ClusterError::Remote { status: 503, .. }) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => return other,
            }
        }
    }

    /// One HTTP call to another host's cluster API.
    pub(in crate::cluster) async fn forward<B, T>(
        &self,
        method: HttpMethod,
        base: &str,
        path: &str,
        body: Option<&B>,
        authority: Authority,
    ) -> Result<T>
    where
        B: Serialize + ?Sized,
        T: serde::de::DeserializeOwned,
    {
        let url = format!("{}{path}", base.trim_end_matches('/'));
        let body = body.map(serde_json::to_string).transpose().map_err(|e| ClusterError::BadRequest(e.to_string()))?;
        let agent = self.http.clone();
        let base = base.to_owned();
        let res = tokio::task::spawn_blocking(move || {
            let req = agent.request(method.as_str(), &url).set(FORWARDED_HEADER, "1");
            let req = match authority {
                Authority::Host => crate::link::host::authorize(req),
                Authority::Operator => crate::link::host::authorize_as_operator(req),
            };
            let res = match body {
                Some(b) => req.set("Content-Type", "application/json").send_string(&b),
                None => req.call(),
            };
            match res {
                Ok(r) => {
                    r.into_string().map_err(|e| ClusterError::NotReady(format!("reading the answer of {url}: {e}")))
                }
                Err(ureq::Error::Status(status, r)) => {
                    let text = r.into_string().unwrap_or_default();
                    let message = serde_json::from_str::<serde_json::Value>(&text)
                        .ok()
                        .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned))
                        .unwrap_or(text);
                    Err(ClusterError::Remote { url: base, status, message })
                }
                Err(e) => Err(ClusterError::NotReady(format!("cannot reach {url}: {e}"))),
            }
        })
        .await
        .map_err(|e| ClusterError::NotReady(format!("forwarding task failed: {e}")))??;
        serde_json::from_str(&res).map_err(|e| ClusterError::Conflict(format!("undecodable answer from {path}: {e}")))
    }
}

/// Who a forwarded call acts for: this host (its node certificate), or an operator (the
/// node certificate and the operator token, so a stolen node key alone cannot change
/// membership).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::cluster) enum Authority {
    /// Work a host asks for itself (placing a kernel, re-placing a dead host's replicas).
    Host,
    /// Membership changes, which only operators start.
    Operator,
}

/// The HTTP methods forwarded calls use.
#[derive(Debug, Clone, Copy)]
pub(in crate::cluster) enum HttpMethod {
    /// `GET`.
    Get,
    /// `POST`.
    Post,
    /// `DELETE`.
    Delete,
}

impl HttpMethod {
    fn as_str(self) -> &'static str {
        match self {
            HttpMethod::Get => "GET",
            HttpMethod::Post => "POST",
            HttpMethod::Delete => "DELETE",
        }
    }
}
