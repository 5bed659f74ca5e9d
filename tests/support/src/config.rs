//! The one builder of a test daemon's configuration: it fills the daemon's own
//! [`notebookosd::config::Config`] and serialises it with `toml`, so a renamed or retyped
//! key fails to compile here rather than at a daemon's start. A test that needs a key the
//! builder has no method for edits [`DaemonConfig::config`] directly, or adds an
//! [`DaemonConfig::overlay`]: TOML text merged table by table over the serialised config.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use notebookosd::config::{ClusterConfig, ClusterTlsConfig, Config, GpuDriver, HttpTlsConfig, LogFormat, ObserverMode};

/// One daemon's configuration being built.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// The configuration as the daemon will parse it (before the overlay).
    pub config: Config,
    /// Merged over the serialised `config`: a table's keys replace or add to the table's.
    overlay: toml::Table,
}

impl DaemonConfig {
    /// A host whose state and runtime directories are `dir/state` and `dir/run`, on a
    /// loopback HTTP port the daemon picks (its `run/endpoint.json` names it).
    pub fn new(dir: &Path) -> Self {
        let mut config = Config::default();
        config.node.state_dir = dir.join("state");
        config.node.runtime_dir = dir.join("run");
        config.http.listen = SocketAddr::from(([127, 0, 0, 1], 0));
        Self { config, overlay: toml::Table::new() }
    }

    /// `node.name`.
    pub fn name(&mut self, name: &str) -> &mut Self {
        name.clone_into(&mut self.config.node.name);
        self
    }

    /// `http.listen`.
    pub fn listen(&mut self, addr: SocketAddr) -> &mut Self {
        self.config.http.listen = addr;
        self
    }

    /// `http.token_file` and, when given, `http.operator_token_file`.
    pub fn tokens(&mut self, token_file: &Path, operator_token_file: Option<&Path>) -> &mut Self {
        self.config.http.token_file = Some(token_file.to_owned());
        self.config.http.operator_token_file = operator_token_file.map(Path::to_owned);
        self
    }

    /// `kernel.python`.
    pub fn python(&mut self, python: &Path) -> &mut Self {
        python.clone_into(&mut self.config.kernel.python);
        self
    }

    /// `n` simulated GPUs (`gpu.driver = "fake"`); 0: `driver = "none"` (not "auto": on a
    /// machine with real GPUs it would find them).
    pub fn fake_gpus(&mut self, n: u32) -> &mut Self {
        if n == 0 {
            self.config.gpu.driver = GpuDriver::None;
        } else {
            self.config.gpu.driver = GpuDriver::Fake;
            self.config.gpu.fake_gpus = n;
        }
        self
    }

    /// `observer.mode`.
    pub fn observer(&mut self, mode: ObserverMode) -> &mut Self {
        self.config.observer.mode = mode;
        self
    }

    /// `gpu.subscription_ratio`.
    pub fn subscription_ratio(&mut self, ratio: f64) -> &mut Self {
        self.config.gpu.subscription_ratio = ratio;
        self
    }

    /// `gpu.idle_release`.
    pub fn idle_release(&mut self, after: Duration) -> &mut Self {
        self.config.gpu.idle_release = after;
        self
    }

    /// `log.level` with `log.format = "text"` (a log file read by people and tests).
    pub fn log_level(&mut self, level: &str) -> &mut Self {
        level.clone_into(&mut self.config.log.level);
        self.config.log.format = LogFormat::Text;
        self
    }

    /// HTTPS with client certificates from `client_ca` (`http.tls`).
    pub fn https(&mut self, cert: &Path, key: &Path, client_ca: &Path) -> &mut Self {
        self.config.http.tls =
            Some(HttpTlsConfig { cert: cert.to_owned(), key: key.to_owned(), client_ca: Some(client_ca.to_owned()) });
        self
    }

    /// `[cluster]`: member `node_id` with raft on `raft_listen`, founded by `seeds` (`"id=addr"`).
    pub fn cluster(&mut self, node_id: u64, raft_listen: SocketAddr, seeds: &[String]) -> &mut Self {
        let c: &mut ClusterConfig = &mut self.config.cluster;
        c.enabled = true;
        c.node_id = node_id;
        c.raft_listen = raft_listen;
        c.seeds = seeds.to_vec();
        self
    }

    /// `cluster.host_ttl`.
    pub fn host_ttl(&mut self, ttl: Duration) -> &mut Self {
        self.config.cluster.host_ttl = ttl;
        self
    }

    /// `cluster.object_store`.
    pub fn object_store(&mut self, url: &str) -> &mut Self {
        url.clone_into(&mut self.config.cluster.object_store);
        self
    }

    /// Mutual TLS on the raft transport (`cluster.tls`).
    pub fn raft_tls(&mut self, ca_cert: &Path, cert: &Path, key: &Path) -> &mut Self {
        self.config.cluster.tls =
            Some(ClusterTlsConfig { ca_cert: ca_cert.to_owned(), cert: cert.to_owned(), key: key.to_owned() });
        self
    }

    /// Merges `toml_text` (whole sections, e.g. `"[kernel]\nprewarm_max = 0\n"`) over the
    /// configuration; later overlays win.
    pub fn overlay(&mut self, toml_text: &str) -> anyhow::Result<&mut Self> {
        let table: toml::Table = toml_text.parse().with_context(|| format!("overlay {toml_text:?}"))?;
        merge(&mut self.overlay, table);
        Ok(self)
    }

    /// Merges a JSON object of sections (`{"kernel": {"prewarm_max": 0}}`) over the
    /// configuration, as [`DaemonConfig::overlay`] does: what `nbos-test-cluster config`
    /// takes from the Python test kit.
    pub fn overlay_json(&mut self, sections: &serde_json::Value) -> anyhow::Result<&mut Self> {
        let table = toml::Table::try_from(sections).with_context(|| format!("overlay {sections}"))?;
        merge(&mut self.overlay, table);
        Ok(self)
    }

    /// The configuration file's text, checked as the daemon checks it at start.
    pub fn to_checked_toml(&self) -> anyhow::Result<String> {
        let text = self.to_toml()?;
        Config::parse(&text, "the built config")?;
        Ok(text)
    }

    /// The configuration file's text: only the keys whose value differs from the daemon's
    /// default (then the overlay), as an operator writes one. So a test's file names what
    /// the test changes, and a daemon of an earlier version (a rolling upgrade's old hosts,
    /// which refuse keys they do not know) reads it as long as those keys are its own.
    pub fn to_toml(&self) -> anyhow::Result<String> {
        let table = toml::Table::try_from(&self.config).context("serialising the config")?;
        let defaults = toml::Table::try_from(Config::default()).context("serialising the defaults")?;
        let mut table = changed(table, &defaults);
        merge(&mut table, self.overlay.clone());
        toml::to_string(&table).context("serialising the config")
    }

    /// Writes the configuration file to `path`; returns `path`.
    pub fn write(&self, path: &Path) -> anyhow::Result<PathBuf> {
        std::fs::write(path, self.to_toml()?).with_context(|| format!("writing {}", path.display()))?;
        Ok(path.to_owned())
    }
}

/// The keys of `table` whose value differs from `defaults`' (tables compared key by key;
/// a table left empty is dropped).
fn changed(table: toml::Table, defaults: &toml::Table) -> toml::Table {
    let mut out = toml::Table::new();
    for (key, value) in table {
        match (value, defaults.get(&key)) {
            (toml::Value::Table(t), Some(toml::Value::Table(d))) => {
                let inner = changed(t, d);
                if !inner.is_empty() {
                    out.insert(key, toml::Value::Table(inner));
                }
            }
            (value, Some(d)) if &value == d => {}
            (value, _) => {
                out.insert(key, value);
            }
        }
    }
    out
}

/// `over`'s keys into `base`, tables merged recursively, anything else replaced.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_builder_writes_the_daemon_parses_back_unchanged() {
        let dir = Path::new("/tmp/nbos-config-test");
        let mut b = DaemonConfig::new(dir);
        b.name("h1")
            .fake_gpus(2)
            .observer(ObserverMode::Procfs)
            .subscription_ratio(3.0)
            .idle_release(Duration::from_millis(1500))
            .host_ttl(Duration::from_secs(1))
            .cluster(1, "127.0.0.1:7001".parse().expect("addr"), &["1=127.0.0.1:7001".to_owned()])
            .object_store("file:///tmp/nbos-config-test/objects")
            .log_level("info");
        let text = b.to_toml().expect("toml");
        let parsed = Config::parse(&text, "test").expect("parses");
        assert_eq!(parsed, b.config, "{text}");
    }

    #[test]
    fn only_what_differs_from_the_defaults_is_written() {
        let mut b = DaemonConfig::new(Path::new("/tmp/x"));
        b.fake_gpus(2);
        let text = b.to_toml().expect("toml");
        let table: toml::Table = text.parse().expect("toml");
        assert_eq!(table["gpu"]["fake_gpus"].as_integer(), Some(2), "{text}");
        // A default (and a key an earlier version does not know) is not written.
        assert!(!text.contains("object_gc_grace"), "{text}");
        assert!(!table.contains_key("autoscale"), "an all-default section is left out: {text}");
        assert_eq!(Config::parse(&text, "test").expect("parses"), b.config);
    }

    #[test]
    fn an_overlay_adds_and_replaces_keys_of_a_section_and_keeps_the_rest() {
        let mut b = DaemonConfig::new(Path::new("/tmp/x"));
        b.fake_gpus(1).overlay("[kernel]\nprewarm_max = 0\n[gpu]\nfake_gpu_memory_mib = 64\n").expect("overlay");
        let parsed = Config::parse(&b.to_toml().expect("toml"), "test").expect("parses");
        assert_eq!(parsed.kernel.prewarm_max, 0);
        assert_eq!(parsed.gpu.fake_gpu_memory_mib, 64);
        assert_eq!(parsed.gpu.driver, GpuDriver::Fake);
    }
}
