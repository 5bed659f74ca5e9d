//! Starts the GPU activity observer (`[observer]`).

use std::sync::Arc;

use anyhow::Context;

use crate::config::Config;
use crate::kernel::shim_env::ShimEnvironment;
use crate::lease::LeaseServer;

/// Starts the GPU activity observer (`[observer]`); `auto` falls back to procfs
/// with a log line. Without GPUs there is nothing to observe.
pub(super) fn start_observer(
    config: &Config,
    leasing: Option<&(Arc<LeaseServer>, ShimEnvironment)>,
    registry: &mut prometheus_client::registry::Registry,
) -> anyhow::Result<Option<Arc<nbos_ebpf::Observer>>> {
    use crate::config::ObserverMode;
    use nbos_ebpf::ModeRequest;
    let Some((server, shim)) = leasing else { return Ok(None) };
    let mode = match config.observer.mode {
        ObserverMode::Auto => ModeRequest::Auto,
        ObserverMode::Ebpf => ModeRequest::Ebpf,
        ObserverMode::Procfs => ModeRequest::Procfs,
    };
    // Probe the configured libraries, else the driver the shim forwards to.
    let libraries = if config.observer.probe_libraries.is_empty() {
        vec![shim.driver.clone()]
    } else {
        config.observer.probe_libraries.clone()
    };
    let cfg = nbos_ebpf::ObserverConfig {
        mode,
        libraries,
        // Kernels run under the shim, which writes NBOS_SHIM_COUNTERS_DIR/<pid> (exact launch
        // counts at a few ns each): no launch uprobes; copy/memset/sync probes stay on.
        launch_probes: false,
        counters_dir: Some(shim.counters_dir.clone()),
        ..nbos_ebpf::ObserverConfig::default()
    };
    let observer = nbos_ebpf::Observer::start(cfg).context("starting the GPU observer ([observer] mode)")?;
    observer.metrics().register(registry);
    tracing::info!(mode = observer.mode().as_str(), probes = observer.probe_count(), "GPU observer running");
    let observer = Arc::new(observer);
    // The shims' lease-protocol activity reports feed the observer too. A weak handle: the
    // observer's thread stops with its last strong handle, whatever the lease server does.
    let weak = Arc::downgrade(&observer);
    server.set_activity_hook(Arc::new(move |pid, calls| {
        if let Some(o) = weak.upgrade() {
            if let Err(e) = o.record_shim_activity(pid, calls) {
                tracing::debug!(pid, error = %e, "observer did not take a shim activity report");
            }
        }
    }));
    Ok(Some(observer))
}
