//! `notebookosd` configuration: a TOML file whose every field is documented in
//! `packaging/notebookosd.toml` (the shipped default) and `docs/configuration.md`.
//!
//! Unknown keys are errors, and every error names the offending field by its full
//! dotted path (`gpu.idle_release`), because a typo in a privileged daemon's config
//! that is silently ignored is worse than a refusal to start.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML, has an unknown key or a value of the wrong type.
    #[error("config {origin}: field `{field}`: {message}")]
    Parse {
        /// Where the text came from (a path, or `<string>`).
        origin: String,
        /// The full dotted path of the offending key.
        field: String,
        /// What is wrong, with the line and column when known.
        message: String,
    },
    /// The value parses but is not acceptable.
    #[error("config {origin}: field `{field}`: {reason}")]
    Invalid {
        /// Where the text came from.
        origin: String,
        /// The full dotted path of the offending key.
        field: &'static str,
        /// Why it is refused.
        reason: String,
    },
}

/// The whole daemon configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// This host.
    pub node: NodeConfig,
    /// The HTTP listener: Jupyter gateway API, `/metrics`, `/healthz`.
    pub http: HttpConfig,
    /// GPUs and the CUDA driver.
    pub gpu: GpuConfig,
    /// The GPU activity observer.
    pub observer: ObserverConfig,
    /// Notebook kernel processes.
    pub kernel: KernelConfig,
    /// Logging.
    pub log: LogConfig,
}

/// `[node]`: identity and directories of this host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeConfig {
    /// Host name in the cluster; empty means the machine's hostname.
    pub name: String,
    /// Durable state (Raft log, snapshots, large objects).
    pub state_dir: PathBuf,
    /// Sockets and other state that does not survive a reboot (the lease socket).
    pub runtime_dir: PathBuf,
}

/// `[http]`: the one HTTP listener.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Address and port to listen on.
    pub listen: SocketAddr,
    /// File holding the API token clients must present. Required unless `listen`
    /// is a loopback address and `allow_unauthenticated_loopback` is true.
    pub token_file: Option<PathBuf>,
    /// Permit a token-less API on a loopback listener (what `--dev` does).
    pub allow_unauthenticated_loopback: bool,
}

/// How the daemon reaches GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuDriver {
    /// Use the NVIDIA driver when it is present, else run with no GPUs.
    Auto,
    /// Require the NVIDIA driver; refuse to start without it.
    Nvidia,
    /// TEST DOUBLE: simulated GPUs from `tests/fake-cuda` (demos and tests).
    Fake,
    /// No GPUs (CPU-only host, e.g. a gateway-only node).
    None,
}

/// `[gpu]`: GPUs, the driver and per-cell binding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuConfig {
    /// Which driver to use.
    pub driver: GpuDriver,
    /// Full path of the real `libcuda.so.1`; empty means discover it. With
    /// `driver = "fake"`: the fake-cuda TEST DOUBLE library (`libfake_cuda.so`); empty
    /// means next to the daemon binary.
    pub cuda_driver_path: Option<PathBuf>,
    /// The built CUDA shim (`libnbos_cuda_shim.so`) that kernel processes load as
    /// `libcuda.so.1`; empty means next to the daemon binary, else
    /// `/usr/lib/notebookos/libnbos_cuda_shim.so`.
    pub shim_library: Option<PathBuf>,
    /// With `driver = "fake"`: how many simulated GPUs.
    pub fake_gpus: u32,
    /// With `driver = "fake"`: memory of each simulated GPU, MiB.
    pub fake_gpu_memory_mib: u64,
    /// How long a lease stays idle-held after a cell before the GPU is revoked.
    #[serde(with = "humantime_serde")]
    pub idle_release: Duration,
    /// Upper bound on (GPUs requested by kernels hosted here) / (GPUs on the host).
    pub subscription_ratio: f64,
}

/// Which mechanism observes GPU activity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ObserverMode {
    /// eBPF when it can be loaded, else procfs (logged and exported as a metric).
    Auto,
    /// eBPF only; refuse to start if it cannot be loaded.
    Ebpf,
    /// procfs and the shim's own counters only.
    Procfs,
}

/// `[observer]`: the GPU activity observer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ObserverConfig {
    /// Which mechanism to use.
    pub mode: ObserverMode,
    /// Driver libraries to attach uprobes to; empty means discover (`ldconfig -p`).
    pub probe_libraries: Vec<PathBuf>,
}

/// `[kernel]`: notebook kernel processes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KernelConfig {
    /// Python interpreter that runs ipykernel.
    pub python: PathBuf,
    /// Memory limit per kernel process tree in MiB (cgroup v2); 0 means none.
    pub memory_limit_mib: u64,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// JSON lines when stderr is not a terminal (journald, files), text otherwise.
    Auto,
    /// Human-readable text.
    Text,
    /// One JSON object per line.
    Json,
}

/// `[log]`: logging.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `tracing` filter directive, e.g. `info` or `notebookosd=debug,info`.
    /// The `NBOS_LOG` environment variable overrides it.
    pub level: String,
    /// Output format.
    pub format: LogFormat,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            state_dir: PathBuf::from("/var/lib/notebookos"),
            runtime_dir: PathBuf::from("/run/notebookos"),
        }
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8888)),
            token_file: None,
            allow_unauthenticated_loopback: false,
        }
    }
}

impl Default for GpuConfig {
    fn default() -> Self {
        Self {
            driver: GpuDriver::Auto,
            cuda_driver_path: None,
            shim_library: None,
            fake_gpus: 0,
            fake_gpu_memory_mib: 81_920,
            idle_release: Duration::from_secs(30),
            subscription_ratio: 3.0,
        }
    }
}

impl Default for ObserverConfig {
    fn default() -> Self {
        Self { mode: ObserverMode::Auto, probe_libraries: Vec::new() }
    }
}

impl Default for KernelConfig {
    fn default() -> Self {
        Self { python: PathBuf::from("python3"), memory_limit_mib: 0 }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { level: "info".to_owned(), format: LogFormat::Auto }
    }
}

/// Upper bound on the number of simulated GPUs: a fake host bigger than any real one is a typo.
const MAX_FAKE_GPUS: u32 = 64;

impl Config {
    /// Reads, parses and validates a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses and validates config text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let de = toml::Deserializer::new(text);
        let config: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            let field = e.path().to_string();
            let inner = e.into_inner();
            let message = match inner.span() {
                Some(span) => {
                    let (line, col) = line_col(text, span.start);
                    format!("{} (line {line}, column {col})", inner.message())
                }
                None => inner.message().to_owned(),
            };
            ConfigError::Parse { origin: origin.to_owned(), field, message }
        })?;
        config.validate(origin)?;
        Ok(config)
    }

    /// Checks what the types cannot: ranges, and combinations of fields.
    pub fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        let invalid =
            |field: &'static str, reason: String| ConfigError::Invalid { origin: origin.to_owned(), field, reason };
        if self.node.state_dir.as_os_str().is_empty() {
            return Err(invalid("node.state_dir", "must not be empty".into()));
        }
        if self.node.runtime_dir.as_os_str().is_empty() {
            return Err(invalid("node.runtime_dir", "must not be empty".into()));
        }
        if !self.http.listen.ip().is_loopback() && self.http.token_file.is_none() {
            return Err(invalid(
                "http.token_file",
                format!(
                    "required because http.listen = {} is not a loopback address \
                     (the API starts and stops GPU workloads)",
                    self.http.listen
                ),
            ));
        }
        if !self.http.listen.ip().is_loopback() && self.http.allow_unauthenticated_loopback {
            // Harmless but misleading: the flag only ever applies to loopback.
            tracing::warn!(listen = %self.http.listen, "http.allow_unauthenticated_loopback has no effect on a non-loopback listener");
        }
        if !(self.gpu.subscription_ratio.is_finite() && self.gpu.subscription_ratio >= 1.0) {
            return Err(invalid(
                "gpu.subscription_ratio",
                format!("must be a number >= 1.0, got {}", self.gpu.subscription_ratio),
            ));
        }
        if self.gpu.idle_release.is_zero() {
            return Err(invalid("gpu.idle_release", "must be longer than 0s".into()));
        }
        match self.gpu.driver {
            GpuDriver::Fake => {
                if self.gpu.fake_gpus == 0 || self.gpu.fake_gpus > MAX_FAKE_GPUS {
                    return Err(invalid(
                        "gpu.fake_gpus",
                        format!("must be 1..={MAX_FAKE_GPUS} with driver = \"fake\", got {}", self.gpu.fake_gpus),
                    ));
                }
                if self.gpu.fake_gpu_memory_mib == 0 {
                    return Err(invalid("gpu.fake_gpu_memory_mib", "must be > 0".into()));
                }
            }
            GpuDriver::Auto | GpuDriver::Nvidia | GpuDriver::None => {
                if self.gpu.fake_gpus != 0 {
                    return Err(invalid("gpu.fake_gpus", "only applies with gpu.driver = \"fake\"".into()));
                }
            }
        }
        if let Some(p) = &self.gpu.cuda_driver_path {
            if !p.is_absolute() {
                return Err(invalid(
                    "gpu.cuda_driver_path",
                    format!("must be an absolute path (a bare soname would find the shim itself), got {}", p.display()),
                ));
            }
        }
        if let Some(p) = &self.gpu.shim_library {
            if !p.is_absolute() {
                return Err(invalid("gpu.shim_library", format!("must be an absolute path, got {}", p.display())));
            }
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log.level) {
            return Err(invalid("log.level", format!("not a valid filter: {e}")));
        }
        Ok(())
    }

    /// The configuration `notebookosd --dev` runs with: one host, loopback only,
    /// state under `state_dir`, token-less API.
    pub fn dev(state_dir: &Path, listen: SocketAddr, fake_gpus: u32) -> Self {
        let mut c = Config::default();
        c.node.name = "dev".to_owned();
        c.node.state_dir = state_dir.to_owned();
        c.node.runtime_dir = state_dir.join("run");
        c.http.listen = listen;
        c.http.allow_unauthenticated_loopback = true;
        if fake_gpus > 0 {
            c.gpu.driver = GpuDriver::Fake;
            c.gpu.fake_gpus = fake_gpus;
        }
        c
    }

    /// This host's name: `node.name`, else the machine's hostname.
    pub fn node_name(&self) -> String {
        if !self.node.name.is_empty() {
            return self.node.name.clone();
        }
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "localhost".to_owned())
    }
}

/// 1-based line and column of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHIPPED: &str = include_str!("../../packaging/notebookosd.toml");

    #[test]
    fn shipped_default_config_parses_and_equals_the_built_in_defaults() {
        let c = Config::parse(SHIPPED, "packaging/notebookosd.toml").expect("shipped config must load");
        assert_eq!(c, Config::default(), "packaging/notebookosd.toml and Config::default() disagree");
    }

    #[test]
    fn unknown_key_is_named_with_its_section() {
        let err = Config::parse("[gpu]\nidle_releese = \"5s\"\n", "t.toml").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("idle_releese"), "{msg}");
        assert!(msg.contains("gpu"), "{msg}");
        assert!(msg.contains("line 2"), "{msg}");
    }

    #[test]
    fn unknown_section_is_an_error() {
        let err = Config::parse("[gpus]\nfake_gpus = 2\n", "t.toml").unwrap_err();
        assert!(err.to_string().contains("gpus"), "{err}");
    }

    #[test]
    fn malformed_value_names_the_full_key() {
        let err = Config::parse("[gpu]\nidle_release = \"soon\"\n", "t.toml").unwrap_err();
        match &err {
            ConfigError::Parse { field, .. } => assert_eq!(field, "gpu.idle_release"),
            other => panic!("expected a parse error, got {other}"),
        }
        let err = Config::parse("[http]\nlisten = \"not an address\"\n", "t.toml").unwrap_err();
        assert!(err.to_string().contains("http.listen"), "{err}");
    }

    #[test]
    fn non_loopback_listener_requires_a_token() {
        let err = Config::parse("[http]\nlisten = \"0.0.0.0:8888\"\n", "t.toml").unwrap_err();
        assert!(err.to_string().contains("http.token_file"), "{err}");
        let ok = Config::parse("[http]\nlisten = \"0.0.0.0:8888\"\ntoken_file = \"/etc/notebookos/token\"\n", "t.toml");
        assert!(ok.is_ok(), "{ok:?}");
    }

    #[test]
    fn semantic_ranges_are_checked() {
        for (text, field) in [
            ("[gpu]\nsubscription_ratio = 0.5\n", "gpu.subscription_ratio"),
            ("[gpu]\nidle_release = \"0s\"\n", "gpu.idle_release"),
            ("[gpu]\ndriver = \"fake\"\n", "gpu.fake_gpus"),
            ("[gpu]\nfake_gpus = 2\n", "gpu.fake_gpus"),
            ("[gpu]\ncuda_driver_path = \"libcuda.so.1\"\n", "gpu.cuda_driver_path"),
            ("[gpu]\nshim_library = \"libnbos_cuda_shim.so\"\n", "gpu.shim_library"),
            ("[log]\nlevel = \"info,=\"\n", "log.level"),
        ] {
            let err = Config::parse(text, "t.toml").expect_err(text);
            assert!(err.to_string().contains(field), "{text}: {err}");
        }
    }

    #[test]
    fn dev_config_is_valid() {
        let c = Config::dev(Path::new("/tmp/x"), SocketAddr::from(([127, 0, 0, 1], 0)), 2);
        c.validate("dev").expect("dev config valid");
        assert_eq!(c.gpu.driver, GpuDriver::Fake);
    }
}

#[cfg(test)]
mod docs_tests {
    use super::Config;

    /// Every `section.key` of the config, from the defaults serialised back to TOML.
    fn all_keys() -> Vec<String> {
        let value = toml::Value::try_from(Config::default()).expect("config serialises");
        let mut keys = Vec::new();
        if let toml::Value::Table(sections) = value {
            for (section, body) in sections {
                if let toml::Value::Table(fields) = body {
                    keys.extend(fields.keys().map(|k| format!("{section}.{k}")));
                }
            }
        }
        keys
    }

    #[test]
    fn every_config_field_is_documented_in_the_reference_and_the_shipped_file() {
        let reference = include_str!("../../docs/configuration.md");
        let shipped = include_str!("../../packaging/notebookosd.toml");
        let keys = all_keys();
        assert!(keys.len() >= 15, "{keys:?}");
        for key in keys {
            assert!(reference.contains(&format!("`{key}`")), "docs/configuration.md does not document `{key}`");
            let field = key.rsplit('.').next().expect("field");
            assert!(
                shipped.lines().any(|l| l.trim_start_matches("# ").starts_with(&format!("{field} ="))),
                "packaging/notebookosd.toml does not show `{key}`"
            );
        }
    }
}
