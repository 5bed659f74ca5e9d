//! The loopback cluster a trace replay runs on: `notebookosd` at the daemon's own defaults
//! (what `packaging/notebookosd.toml` ships), with the `exec` autoscale provider of
//! `examples/autoscale/local-dev-provider.py` adding and releasing hosts. Changed from the
//! defaults, and only these:
//!
//! - what any loopback cluster must: ports, directories, tokens, a file object store,
//!   `gpu.driver = "fake"` with `--fake-gpus`, the `procfs` observer, a 3 s host TTL (the
//!   benches' launcher, [`crate::loopback::options`]);
//! - `autoscale.provider = "exec"` and its `command` (the example provider);
//! - the policy's time constants divided by K, because the workload runs K times faster:
//!   `gpu.idle_release`, `autoscale.interval` and `autoscale.peak_window`. The rest are
//!   real costs or safety limits of the machinery (`boot_timeout`, `command_timeout`,
//!   `placement_wait`, `host_ttl`): a host still takes its real seconds to boot, so those
//!   stay as they are.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;

use nbos_test_support::{Options, TestCluster};
use notebookosd::config::{AutoscaleConfig, AutoscaleProvider, Config};

/// A loopback host's boot through the example provider (start a daemon, wait for its HTTP
/// endpoint, `nbos cluster join`; one host after another), real seconds: three hosts took
/// 11.6 s, 3.9 s each, on the 2-core VM at a load average of 30. The simulator's
/// `--provision-s` is this × K.
pub const BOOT_REAL_S: f64 = 4.0;

/// The autoscaler's time constants, compressed (`gpu.idle_release` ÷ K is set through the
/// launcher's options, as for a template replay).
#[derive(Debug, Clone, Copy)]
pub struct Compressed {
    /// `autoscale.interval` ÷ K.
    pub interval: Duration,
    /// `autoscale.peak_window` ÷ K.
    pub peak_window: Duration,
}

impl Compressed {
    /// The defaults' constants at speedup `k`.
    pub fn of(defaults: &Config, k: f64) -> Self {
        let div = |d: Duration| Duration::from_secs_f64(d.as_secs_f64() / k);
        Self { interval: div(defaults.autoscale.interval), peak_window: div(defaults.autoscale.peak_window) }
    }
}

/// The started cluster and the configuration its hosts run.
pub struct Autoscaled {
    /// The founding hosts (the provider's are stopped by [`Autoscaled`]'s drop).
    pub cluster: TestCluster,
    /// Host 1's `notebookosd.toml` as it ran (every host's differs only in its own node
    /// id, name, ports and directories).
    pub config_toml: String,
    /// The provider's template for the hosts it starts.
    pub provider_template: String,
    /// The same configuration in trace time (the compressed constants at their
    /// defaults): what `nbos sim --config` simulates.
    pub sim_toml: String,
    provided: PathBuf,
}

impl Drop for Autoscaled {
    /// Stops the founding hosts first (so that no leader asks the provider for hosts to
    /// replace those going), then the daemons the provider started and did not release.
    fn drop(&mut self) {
        let ids: Vec<u64> = self.cluster.hosts.iter().map(|h| h.node_id).collect();
        for id in ids {
            self.cluster.stop(id);
        }
        // A provider command in flight when its leader stopped may still start a daemon:
        // look again for a few seconds.
        for _ in 0..5 {
            for (file, pid) in provider_pids(&self.provided) {
                // SAFETY: killpg(2) of a daemon the provider started for this replay (its
                // pid file under our own cluster directory; it leads its own session, so
                // its kernels go with it). The file is renamed so the pid is not signalled
                // twice (it could be another process's by then).
                unsafe { libc::killpg(pid, libc::SIGKILL) };
                let _ = std::fs::rename(&file, file.with_extension("killed"));
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}

/// The pid files of the provider's daemons that have not been released, with their pids.
fn provider_pids(dir: &Path) -> Vec<(PathBuf, i32)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .flatten()
        .map(|e| e.path().join("pid"))
        .filter_map(|f| Some((f.clone(), std::fs::read_to_string(&f).ok()?.trim().parse().ok()?)))
        .collect()
}

/// Placeholders of the provider's template (`str.format` fields), written first as values
/// the config types accept, then replaced in the TOML text.
const NODE_ID: u64 = 987_654_321;
const DIR: &str = "/nbos-replay-provider-host-dir";
const RAFT: &str = "127.0.0.1:1";

/// Starts `hosts` founding hosts of `options` with the exec provider, and waits until the
/// cluster is ready.
pub fn start(hosts: u64, options: Options, c: Compressed, python: &Path) -> anyhow::Result<Autoscaled> {
    let mut cluster = TestCluster::try_create(hosts, options)?;
    let dir = cluster.dir().to_owned();
    let provided = dir.join("provided");
    let layout = cluster.layout();
    let script = provider_script()?;
    let nbos = std::env::current_exe().context("finding nbos")?;
    let command: Vec<String> = [
        std::path::absolute(python)?,
        script,
        "--dir".into(),
        provided.clone(),
        "--template".into(),
        dir.join("provider-template.toml"),
        "--first-node-id".into(),
        PathBuf::from((hosts + 1).to_string()),
        "--notebookosd".into(),
        nbos.with_file_name("notebookosd"),
        "--nbos".into(),
        nbos,
        "--token-file".into(),
        layout.token_file.clone(),
        "--operator-token-file".into(),
        layout.operator_token_file.clone(),
    ]
    .iter()
    .map(|p| p.display().to_string())
    .collect();
    let autoscale = AutoscaleConfig {
        provider: AutoscaleProvider::Exec,
        command,
        interval: c.interval,
        peak_window: c.peak_window,
        ..Config::default().autoscale
    };
    for id in 1..=hosts {
        cluster.reconfigure(id, |d| d.config.autoscale = autoscale.clone());
    }
    let mut template = cluster.layout().hosts.first().context("no host")?.config.clone();
    template.config.node.name = format!("auto{NODE_ID}");
    template.config.node.state_dir = Path::new(DIR).join("state");
    template.config.node.runtime_dir = Path::new(DIR).join("run");
    template.config.http.listen = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    template.config.cluster.node_id = NODE_ID;
    template.config.cluster.raft_listen = RAFT.parse()?;
    let mut sim = cluster.layout().hosts[0].config.clone();
    let defaults = Config::default();
    sim.config.gpu.idle_release = defaults.gpu.idle_release;
    sim.config.autoscale.interval = defaults.autoscale.interval;
    sim.config.autoscale.peak_window = defaults.autoscale.peak_window;
    let sim_toml = sim.to_checked_toml()?;
    let text = template.to_checked_toml()?;
    let provider_template = text
        .replace('{', "{{")
        .replace('}', "}}")
        .replace(&NODE_ID.to_string(), "{node_id}")
        .replace(DIR, "{dir}")
        .replace(&format!("\"{RAFT}\""), "\"{raft_listen}\"");
    std::fs::write(dir.join("provider-template.toml"), &provider_template).context("writing the provider template")?;
    let config_path = cluster.layout().hosts[0].config_path.clone();
    let config_toml =
        std::fs::read_to_string(&config_path).with_context(|| format!("reading {}", config_path.display()))?;
    for id in 1..=hosts {
        cluster.try_restart(id)?;
    }
    let me = Autoscaled { cluster, config_toml, provider_template, sim_toml, provided };
    me.cluster.wait_all_ready(Duration::from_secs(60))?;
    Ok(me)
}

/// `examples/autoscale/local-dev-provider.py` of the source tree this `nbos` was built from.
fn provider_script() -> anyhow::Result<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/autoscale/local-dev-provider.py");
    anyhow::ensure!(p.exists(), "{} is missing (the exec provider a trace replay scales with)", p.display());
    Ok(std::path::absolute(p)?)
}
