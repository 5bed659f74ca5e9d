//! Tells the world the node is up: `endpoint.json` (where `nbos` finds it), the log line,
//! and the start-up lines on stdout.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::fs::write_file_atomically;
use crate::config::Config;
use crate::gateway::AppState;
use crate::link::endpoint::{Endpoint, ENDPOINT_FILE};

/// Writes `runtime_dir/endpoint.json` and the start-up lines; returns the endpoint file's
/// path (removed at shutdown).
pub(super) fn announce(config: &Config, state: &AppState, token_file: Option<&Path>) -> anyhow::Result<PathBuf> {
    let AppState { node, url, dev, token, inventory, .. } = state;
    let advertise = if config.cluster.enabled { config.cluster.advertise_url.as_str() } else { "" };
    // The cluster's CA (the node certificate serves HTTPS too), else the one clients are checked
    // against, which a site's own PKI shares with its servers.
    let ca_cert = match (&config.cluster.tls, &config.http.tls) {
        (Some(t), Some(_)) if config.cluster.enabled => Some(t.ca_cert.clone()),
        (_, Some(t)) => t.client_ca.clone(),
        (_, None) => None,
    };
    let endpoint = Endpoint {
        url: Endpoint::local_url(url, advertise),
        pid: std::process::id(),
        token_file: token_file.map(Path::to_path_buf),
        state_dir: config.node.state_dir.clone(),
        ca_cert,
    };
    let endpoint_path = config.node.runtime_dir.join(ENDPOINT_FILE);
    write_file_atomically(&endpoint_path, serde_json::to_string_pretty(&endpoint)?.as_bytes())?;
    // Every account may read it (no secret in it: the token file it names is the daemon's,
    // 0600), so that a user's Jupyter client finds the daemon through the packaged kernelspecs.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&endpoint_path, std::fs::Permissions::from_mode(0o644))
            .with_context(|| format!("opening {} to local clients", endpoint_path.display()))?;
    }

    tracing::info!(
        node = %node, %url, state_dir = %config.node.state_dir.display(),
        gpus = inventory.gpus.len(), gpu_source = %inventory.source, dev = *dev,
        "notebookosd listening"
    );
    // One plain line on stdout for people and scripts (the logs go to stderr).
    // One block, written at once: a reader that stops after the URL line must not
    // leave the later lines to a closed pipe. Stdout is informational: a closed
    // stdout is logged, never fatal.
    let mut block = String::new();
    {
        use std::fmt::Write as _;
        let _ = writeln!(block, "notebookosd {}: listening on {url}", env!("CARGO_PKG_VERSION"));
        let _ = writeln!(block, "notebookosd: state in {}", config.node.state_dir.display());
        match (&token, &token_file) {
            (None, _) => {
                let _ = writeln!(block, "notebookosd: API open without a token (loopback, dev mode)");
            }
            (Some(_), Some(f)) => {
                let _ = writeln!(block, "notebookosd: API token in {}", f.display());
            }
            (Some(_), None) => {}
        }
        if config.cluster.enabled {
            let _ = writeln!(
                block,
                "notebookosd: cluster node {}, raft on {}, seeds {}",
                config.cluster.node_id,
                config.cluster.raft_listen,
                config.cluster.seeds.join(",")
            );
        }
        let _ = writeln!(
            block,
            "notebookosd: {} GPU(s) ({}){}",
            inventory.gpus.len(),
            inventory.source,
            if inventory.source == "fake" { " — SIMULATED by the fake-cuda test double" } else { "" }
        );
    }
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(block.as_bytes()).and_then(|()| out.flush()) {
        tracing::warn!(error = %e, "could not write the start-up lines to stdout");
    }
    drop(out);

    Ok(endpoint_path)
}
