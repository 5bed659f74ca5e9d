//! The benches' loopback clusters (`nbos bench election`, `kernel-start`, `migration` and
//! `nbos replay` without `--url`): the test-support crate's [`TestCluster`] with the
//! options the benches share, and creating a kernel through one of its gateways.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use nbos_test_support::{Options, TestCluster};

/// How the benches' loopback clusters are configured unless a bench says otherwise: one
/// simulated GPU per host, a 3 s host TTL, the daemon's own subscription ratio and idle
/// release, random tokens, fixed HTTP ports, and the `notebookosd` next to `nbos`.
pub fn options(python: &Path, log_level: &str, keep: bool) -> anyhow::Result<Options> {
    let exe = std::env::current_exe().context("finding nbos")?;
    Ok(Options {
        fake_gpus: 1,
        gateway_hosts: 0,
        host_ttl: Duration::from_secs(3),
        subscription_ratio: None,
        idle_release: None,
        python: vec![python.to_owned()],
        log_level: Some(log_level.to_owned()),
        log_env: None,
        token: None,
        operator_token: None,
        fixed_http_ports: true,
        keep,
        daemon: Some(exe.with_file_name("notebookosd")),
        ..Options::default()
    })
}

/// Creates a kernel through host `node_id`'s gateway.
pub async fn create_kernel(cluster: &TestCluster, node_id: u64, gpus: u32) -> anyhow::Result<String> {
    let g = cluster.client(node_id)?;
    let model =
        tokio::task::spawn_blocking(move || g.create_kernel(notebookosd::kernel::spec::DEFAULT_SPEC, Some(gpus)))
            .await??;
    Ok(model.id)
}
