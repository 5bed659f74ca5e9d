//! The HTTP API's listener (`[http]`: plain or TLS, with its connection caps) and its routes
//! (the gateway's, and the cluster's in cluster mode).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use tokio::net::TcpListener;

use super::cluster::ClusterNode;
use crate::config::HttpConfig;
use crate::gateway::conn_caps::ConnCaps;
use crate::gateway::listener::HttpListener;
use crate::gateway::{self, AppState};

/// Binds `http.listen`; returns the listener and the URL clients reach it at.
pub(super) async fn bind(config: &HttpConfig) -> anyhow::Result<(HttpListener, String)> {
    let listener =
        TcpListener::bind(config.listen).await.with_context(|| format!("binding http.listen = {}", config.listen))?;
    let addr: SocketAddr = listener.local_addr().context("reading the bound address")?;
    let caps = ConnCaps::new(config.max_connections, config.max_connections_per_source);
    let (listener, url) = match &config.tls {
        Some(tls) => {
            let server = crate::link::tls::server_config(&tls.cert, &tls.key, tls.client_ca.as_deref())
                .context("loading http.tls")?;
            (HttpListener::tls(listener, server, caps, config.header_read_timeout), format!("https://{addr}"))
        }
        None => (HttpListener::plain(listener, caps), format!("http://{addr}")),
    };
    Ok((listener, url))
}

/// The gateway's routes, and in cluster mode the cluster's.
pub(super) fn router(state: &Arc<AppState>, cluster: Option<&ClusterNode>) -> Router {
    let token = &state.token;
    let credentials = &state.credentials;
    let mut app = gateway::router(state.clone());
    if let Some(c) = cluster {
        app = gateway::cluster::enable(
            app,
            state.clone(),
            c.cluster.clone(),
            c.replicas.clone(),
            c.collector.clone(),
            token.clone(),
        );
        app = app.merge(crate::cluster::http::router(c.cluster.clone(), c.collector.clone(), credentials.clone()));
    }
    app
}
