//! `notebookosd` configuration: a TOML file whose every field is documented in
//! `packaging/notebookosd.toml` (the shipped default) and `docs/configuration.md`.
//!
//! Unknown keys are errors, and every error names the offending field by its full
//! dotted path (`gpu.idle_release`), because a typo in a privileged daemon's config
//! that is silently ignored is worse than a refusal to start.
//!
//! This file holds the whole [`Config`], its loading and the checks that span sections;
//! each section (`[node]`, `[http]`, `[gpu]`, …) is a file of its own, with its defaults
//! and, where it has them, the checks of that section alone.

use std::net::SocketAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

mod auth;
mod autoscale;
mod cluster;
mod error;
mod gpu;
mod http;
mod kernel;
mod limits;
mod log;
mod node;
mod observer;
mod policy;

pub use auth::{AuthConfig, GroupLimits, Quota};
pub use autoscale::{AutoscaleConfig, AutoscaleProvider, AutoscaleRule};
pub use cluster::{kernel_memory_capacity_mib, ClusterConfig, ClusterTlsConfig, Seed};
pub use error::ConfigError;
pub use gpu::{DeviceGuardMode, GpuConfig, GpuDriver};
pub use http::{HttpConfig, HttpTlsConfig};
pub use kernel::{
    KernelConfig, RunAs, DEFAULT_KERNEL_HOME_QUOTA_MIB, DEFAULT_KERNEL_MAX_MESSAGE_BYTES,
    DEFAULT_KERNEL_MEMORY_LIMIT_MIB, DEFAULT_KERNEL_NPROC_MAX, DEFAULT_KERNEL_OPEN_FILES_MAX,
    DEFAULT_KERNEL_SHM_SIZE_MIB, DEFAULT_KERNEL_USER,
};
pub use limits::LimitsConfig;
pub use log::{LogConfig, LogFormat};
pub use node::NodeConfig;
pub use observer::{ObserverConfig, ObserverMode};

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
    /// Several hosts as one cluster (off: a single host).
    pub cluster: ClusterConfig,
    /// Caps on what API clients may make the daemon hold.
    pub limits: LimitsConfig,
    /// Adding and releasing hosts through a provider (cluster mode).
    pub autoscale: AutoscaleConfig,
    /// Who the API's callers are (users, groups, admins) and the audit log.
    pub auth: AuthConfig,
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
        // Users ([auth]) hold credentials of their own: the shared token is then optional.
        if !self.http.listen.ip().is_loopback() && self.http.token_file.is_none() && !self.auth.has_users() {
            return Err(invalid(
                "http.token_file",
                format!(
                    "required because http.listen = {} is not a loopback address \
                     (the API starts and stops GPU workloads), unless [auth] configures users",
                    self.http.listen
                ),
            ));
        }
        if self.auth.client_certificate_users && self.http.tls.as_ref().is_none_or(|t| t.client_ca.is_none()) {
            return Err(invalid(
                "auth.client_certificate_users",
                "needs http.tls.client_ca: only a certificate the listener verified names a user".into(),
            ));
        }
        if self.auth.users_file.as_deref().is_some_and(|p| !p.is_absolute()) {
            return Err(invalid("auth.users_file", "must be an absolute path".into()));
        }
        if self.auth.audit_log.as_deref().is_some_and(|p| !p.is_absolute()) {
            return Err(invalid("auth.audit_log", "must be an absolute path".into()));
        }
        if !self.http.listen.ip().is_loopback() && self.http.tls.is_none() && !self.http.allow_plaintext {
            return Err(invalid(
                "http.tls",
                format!(
                    "required because http.listen = {} is not a loopback address (tokens and kernel traffic \
                     must not cross the network in plaintext); set http.allow_plaintext = true only behind \
                     a TLS-terminating proxy",
                    self.http.listen
                ),
            ));
        }
        if let Some(tls) = &self.http.tls {
            for p in [Some(&tls.cert), Some(&tls.key), tls.client_ca.as_ref()].into_iter().flatten() {
                if !p.is_absolute() {
                    return Err(invalid("http.tls", format!("paths must be absolute, got {}", p.display())));
                }
            }
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
        if self.gpu.fair_share_half_life.is_zero() {
            return Err(invalid("gpu.fair_share_half_life", "must be longer than 0s".into()));
        }
        let l = &self.limits;
        for (field, value) in [
            ("limits.websocket_max_message_bytes", l.websocket_max_message_bytes),
            ("limits.websocket_inflight_bytes", l.websocket_inflight_bytes),
            ("http.max_connections", self.http.max_connections),
            ("http.max_connections_per_source", self.http.max_connections_per_source),
            ("limits.websocket_queued_messages", l.websocket_queued_messages),
            ("limits.websocket_connections_per_kernel", l.websocket_connections_per_kernel),
            ("limits.websocket_connections", l.websocket_connections),
            ("limits.pending_requests_per_connection", l.pending_requests_per_connection),
            ("limits.kernels_per_token", l.kernels_per_token),
            ("limits.kernels", l.kernels),
        ] {
            if value == 0 {
                return Err(invalid(field, "must be > 0".into()));
            }
        }
        // The decoders' own ceiling (a message is held whole, and copied once, while decoded).
        if l.websocket_max_message_bytes > crate::jupyter::MAX_CLIENT_MESSAGE_BYTES {
            return Err(invalid(
                "limits.websocket_max_message_bytes",
                format!("must be <= {}", crate::jupyter::MAX_CLIENT_MESSAGE_BYTES),
            ));
        }
        // One message must fit the budget of all messages in flight.
        if l.websocket_inflight_bytes < l.websocket_max_message_bytes {
            return Err(invalid(
                "limits.websocket_inflight_bytes",
                format!(
                    "must be >= limits.websocket_max_message_bytes ({}), got {}",
                    l.websocket_max_message_bytes, l.websocket_inflight_bytes
                ),
            ));
        }
        // Counted in the semaphore's u32 permits.
        if l.websocket_inflight_bytes > u32::MAX as usize {
            return Err(invalid("limits.websocket_inflight_bytes", format!("must be <= {}", u32::MAX)));
        }
        let hours_ok = |h: Option<f64>| h.is_none_or(|h| h.is_finite() && h >= 0.0);
        if !hours_ok(l.user.gpu_hours_per_day) {
            return Err(invalid("limits.user.gpu_hours_per_day", "must be a number of hours, 0 or more".into()));
        }
        if let Some((g, _)) = l.groups.iter().find(|(_, g)| !hours_ok(g.quota.gpu_hours_per_day)) {
            return Err(invalid(
                "limits.groups",
                format!("[limits.groups.{g}] gpu_hours_per_day must be a number of hours, 0 or more"),
            ));
        }
        if self.http.max_connections_per_source > self.http.max_connections {
            return Err(invalid(
                "http.max_connections_per_source",
                format!("must be <= http.max_connections ({})", self.http.max_connections),
            ));
        }
        for (field, value) in
            [("http.header_read_timeout", self.http.header_read_timeout), ("http.idle_timeout", self.http.idle_timeout)]
        {
            if value.is_zero() {
                return Err(invalid(field, "must be longer than 0s".into()));
            }
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
        self.kernel.validate(origin)?;
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log.level) {
            return Err(invalid("log.level", format!("not a valid filter: {e}")));
        }
        self.cluster.validate(origin)?;
        self.autoscale.validate(self.cluster.enabled, origin)
    }

    /// `cluster.object_store`, with the default filled in.
    pub fn object_store_url(&self) -> String {
        if self.cluster.object_store.is_empty() {
            format!("file://{}", self.node.state_dir.join("objects").display())
        } else {
            self.cluster.object_store.clone()
        }
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

    const SHIPPED: &str = include_str!("../../../packaging/notebookosd.toml");

    #[test]
    fn shipped_default_config_parses_and_equals_the_built_in_defaults() {
        let c = Config::parse(SHIPPED, "packaging/notebookosd.toml").expect("shipped config must load");
        assert_eq!(c, Config::default(), "packaging/notebookosd.toml and Config::default() disagree");
    }

    #[test]
    fn limits_must_be_positive_and_within_the_decoders_ceiling() {
        let c = Config::parse(
            "[limits]
kernels = 3
websocket_connections = 10
",
            "t.toml",
        )
        .expect("ok");
        assert_eq!((c.limits.kernels, c.limits.websocket_connections), (3, 10));
        for (text, field) in [
            (
                "[limits]
kernels_per_token = 0
",
                "limits.kernels_per_token",
            ),
            (
                "[limits]
websocket_max_message_bytes = 268435457
",
                "limits.websocket_max_message_bytes",
            ),
            (
                "[limits]
websocket_max_message_bytes = 2000
websocket_inflight_bytes = 1000
",
                "limits.websocket_inflight_bytes",
            ),
            ("[limits.user]\ngpu_hours_per_day = -1.0\n", "limits.user.gpu_hours_per_day"),
            ("[limits.groups.ml]\ngpu_hours_per_day = nan\n", "[limits.groups.ml] gpu_hours_per_day"),
            ("[http]\nmax_connections = 10\nmax_connections_per_source = 11\n", "http.max_connections_per_source"),
            ("[http]\nmax_connections = 0\n", "http.max_connections"),
            ("[http]\nheader_read_timeout = \"0s\"\n", "http.header_read_timeout"),
            ("[http]\nidle_timeout = \"0s\"\n", "http.idle_timeout"),
        ] {
            let err = Config::parse(text, "t.toml").expect_err(text);
            assert!(err.to_string().contains(field), "{err}");
        }
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
        let ok = Config::parse(
            "[http]\nlisten = \"0.0.0.0:8888\"\ntoken_file = \"/etc/notebookos/token\"\nallow_plaintext = true\n",
            "t.toml",
        );
        assert!(ok.is_ok(), "{ok:?}");
        let users = Config::parse(
            "[http]\nlisten = \"0.0.0.0:8888\"\nallow_plaintext = true\n[auth]\nusers_file = \"/etc/notebookos/users.toml\"\n",
            "t.toml",
        );
        assert!(users.is_ok(), "users make the shared token optional: {users:?}");
    }

    #[test]
    fn certificate_users_need_verified_certificates() {
        let err = Config::parse("[auth]\nclient_certificate_users = true\n", "t.toml").unwrap_err();
        assert!(err.to_string().contains("http.tls.client_ca"), "{err}");
        let err = Config::parse("[auth]\nusers_file = \"users.toml\"\n", "t.toml").unwrap_err();
        assert!(err.to_string().contains("auth.users_file"), "{err}");
    }

    #[test]
    fn non_loopback_listener_requires_tls_unless_plaintext_is_allowed() {
        let http = "[http]\nlisten = \"0.0.0.0:8888\"\ntoken_file = \"/etc/notebookos/token\"\n";
        let err = Config::parse(http, "t.toml").unwrap_err().to_string();
        assert!(err.contains("http.tls") && err.contains("allow_plaintext"), "{err}");
        let tls =
            format!("{http}tls = {{ cert = \"/etc/notebookos/node.pem\", key = \"/etc/notebookos/node.key\" }}\n");
        assert!(Config::parse(&tls, "t.toml").is_ok());
        let relative = format!("{http}tls = {{ cert = \"node.pem\", key = \"/k\", client_ca = \"/ca.pem\" }}\n");
        let err = Config::parse(&relative, "t.toml").unwrap_err().to_string();
        assert!(err.contains("http.tls") && err.contains("absolute"), "{err}");
        // Loopback stays plain-HTTP capable (dev, tests).
        assert!(Config::parse("[http]\nlisten = \"127.0.0.1:8888\"\n", "t.toml").is_ok());
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
        let reference = include_str!("../../../docs/configuration.md");
        let shipped = include_str!("../../../packaging/notebookosd.toml");
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
