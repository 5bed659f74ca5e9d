//! The gateway's side of `nbos kernel-proxy`: creating the kernel on the first gateway that
//! answers, learning the cluster's other gateways, taking its channels back from any gateway
//! after the WebSocket is lost, and deleting it when the proxy ends.

use std::time::{Duration, Instant};

use notebookosd::link::client::{is_not_found, ChannelsSocket, GatewayClient};

/// Creates the kernel on the first gateway that answers; returns its index and the model.
pub(super) async fn create_on_first(
    gateways: &[GatewayClient],
    name: &str,
    gpus: Option<u32>,
) -> anyhow::Result<(usize, notebookosd::kernel::KernelModel)> {
    let mut errors = Vec::new();
    for (i, g) in gateways.iter().enumerate() {
        let (g, name) = (g.clone(), name.to_owned());
        match tokio::task::spawn_blocking(move || g.create_kernel(&name, gpus)).await? {
            Ok(m) => return Ok((i, m)),
            Err(e) => {
                tracing::warn!(gateway = %gateways[i].url, error = format!("{e:#}"), "could not create the kernel");
                errors.push(format!("{e:#}"));
            }
        }
    }
    anyhow::bail!("no gateway could create the kernel: {}", errors.join("; "))
}

/// Adds the gateways of the cluster's live hosts, as `gateways[from]` lists them, to the
/// ones the proxy knows (the configured ones stay first): a kernelspec that names one
/// gateway (the packaged one names the local daemon's) still follows its kernel when that
/// host dies. Returns how many were new; a gateway that cannot say is logged and skipped.
pub(super) async fn learn(gateways: &mut Vec<GatewayClient>, from: usize) -> usize {
    let Some(g) = gateways.get(from).cloned() else { return 0 };
    let urls = match tokio::task::spawn_blocking(move || g.cluster_gateways()).await {
        Ok(Ok(urls)) => urls,
        Ok(Err(e)) => {
            tracing::debug!(gateway = %gateways[from].url, error = format!("{e:#}"), "could not list the cluster's gateways");
            return 0;
        }
        Err(e) => {
            tracing::debug!(error = %e, "listing the cluster's gateways failed");
            return 0;
        }
    };
    let before = gateways.len();
    let scheme = scheme_of(&gateways[from].url);
    for url in urls {
        // The proxy's credential goes with it: never to a gateway that would take it over
        // another scheme than the configured one (a member advertising http:// where the
        // cluster speaks https:// would read the users' token in clear).
        if scheme_of(&url) != scheme {
            tracing::warn!(gateway = %url, "a cluster gateway with another scheme than the configured one; not used");
            continue;
        }
        if !gateways.iter().any(|g| g.url == url) {
            let g = gateways[from].at(&url);
            gateways.push(g);
        }
    }
    gateways.len() - before
}

/// The scheme of `url` (`https`, `http`), lower case; empty when it has none.
fn scheme_of(url: &str) -> String {
    url.split_once("://").map(|(s, _)| s.to_ascii_lowercase()).unwrap_or_default()
}

/// Finds a gateway (starting after `from`) whose channels socket for `id` opens.
pub(super) async fn reconnect(
    gateways: &[GatewayClient],
    from: usize,
    id: &str,
    timeout: Duration,
) -> anyhow::Result<(usize, ChannelsSocket)> {
    let deadline = Instant::now() + timeout;
    let mut backoff = Duration::from_millis(50);
    let n = gateways.len();
    loop {
        let mut not_found = 0;
        for step in 1..=n {
            let i = (from + step) % n;
            let attempt = tokio::time::timeout(Duration::from_secs(5), gateways[i].connect_channels(id, true)).await;
            match attempt {
                Ok(Ok(socket)) => return Ok((i, socket)),
                Ok(Err(e)) => {
                    if is_not_found(&e) {
                        not_found += 1;
                    }
                    tracing::debug!(gateway = %gateways[i].url, error = format!("{e:#}"), "reconnect attempt failed");
                }
                Err(_) => tracing::debug!(gateway = %gateways[i].url, "reconnect attempt timed out"),
            }
        }
        // Every gateway answered and none knows the kernel: it is gone, waiting will not help.
        anyhow::ensure!(not_found < n, "no gateway knows kernel {id} any more (deleted or lost)");
        anyhow::ensure!(
            Instant::now() + backoff < deadline,
            "lost the kernel's WebSocket and no gateway took it back within {timeout:?}"
        );
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

/// Deletes the remote kernel when the proxy ends, however it ends: through the
/// gateway in use, else any other.
pub(super) struct DeleteOnDrop {
    pub(super) gateways: Vec<GatewayClient>,
    pub(super) current: usize,
    pub(super) id: String,
    pub(super) armed: bool,
}

impl Drop for DeleteOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let n = self.gateways.len();
        for step in 0..n {
            let g = &self.gateways[(self.current + step) % n];
            // Already gone is fine: a client's shutdown_request deletes a replicated kernel itself.
            match g.delete_kernel_if_exists(&self.id) {
                Ok(_) => return,
                Err(e) => {
                    tracing::warn!(kernel = %self.id, gateway = %g.url, error = format!("{e:#}"), "could not delete the remote kernel");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::scheme_of;

    #[test]
    fn a_learned_gateway_must_speak_the_configured_scheme() {
        assert_eq!(scheme_of("HTTPS://h1:8888"), "https");
        assert_ne!(scheme_of("http://h2:8888"), scheme_of("https://h1:8888"));
        assert_eq!(scheme_of("h3:8888"), "");
    }
}
