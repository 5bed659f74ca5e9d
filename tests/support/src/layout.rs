//! A loopback cluster's directory before any daemon starts: the shared API and operator
//! tokens, the large-object directory, the PKI (through `notebookosd::pki`, as `nbos pki`
//! makes it), and one directory per host with its ports and its config from
//! [`DaemonConfig`]. The Rust launcher ([`crate::cluster::TestCluster`]) starts daemons
//! from it; `nbos-test-cluster prepare` prints it as JSON for the Python test kit and
//! `scripts/demo.sh`, which start their own.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;

use crate::config::DaemonConfig;
use crate::{bins, OPERATOR_TOKEN, TOKEN};

/// Node certificates the PKI issues up front (hosts added later, autoscaled ones).
pub const PKI_NODES: u64 = 8;

/// How the hosts are configured.
#[derive(Debug, Clone)]
pub struct Options {
    /// Simulated GPUs per host (0: `gpu.driver = "none"`).
    pub fake_gpus: u32,
    /// Hosts without GPUs (`gpu.driver = "none"`) after the others: gateways that hold no
    /// replica of a kernel with GPUs.
    pub gateway_hosts: u64,
    /// `cluster.host_ttl`.
    pub host_ttl: Duration,
    /// `gpu.subscription_ratio` (`None`: the daemon's default).
    pub subscription_ratio: Option<f64>,
    /// `gpu.idle_release` (`None`: the daemon's default).
    pub idle_release: Option<Duration>,
    /// `cluster.object_store` (default: the cluster's directory `objects/`).
    pub object_store: Option<String>,
    /// The kernels' Python of each host (one entry: every host's; none: the repository's venv).
    pub python: Vec<PathBuf>,
    /// A PKI: mutual TLS on the raft transport, HTTPS with client certificates, node
    /// certificates on host-to-host calls; else plaintext.
    pub tls: bool,
    /// Each host gets an HTTP port picked now (its URL is known before it starts and stays
    /// the same across restarts); else the daemon picks one and its endpoint file names it.
    pub fixed_http_ports: bool,
    /// Hosts that form no cluster (no `[cluster]`): each serves its own kernels.
    pub standalone: bool,
    /// `log.level` (with `log.format = "text"`); `None`: the daemon's defaults.
    pub log_level: Option<String>,
    /// `NBOS_LOG` of every daemon (overrides `log.level`); `None`: inherited.
    pub log_env: Option<String>,
    /// TOML sections merged over every host's config ([`DaemonConfig::overlay`]).
    pub overlay: String,
    /// More environment for every daemon (an S3 store's `AWS_*`).
    pub env: Vec<(String, String)>,
    /// The API token (`None`: a random one).
    pub token: Option<String>,
    /// The operator token (`None`: a random one).
    pub operator_token: Option<String>,
    /// Keep the cluster's directory when it stops (and say where it is).
    pub keep: bool,
    /// The `notebookosd` binary the launcher starts (`None`: [`bins::notebookosd`]).
    pub daemon: Option<PathBuf>,
    /// Host `i` (1-based) listens on HTTP port `http + i` and raft port `raft + i` (well-known
    /// ports, as the demo's); `None`: free ports picked at layout.
    pub port_bases: Option<PortBases>,
    /// No API token: a token-less API on the loopback listener, as `notebookosd --dev`
    /// serves (with TLS, clients and hosts still authenticate with certificates).
    pub unauthenticated_loopback: bool,
}

/// Base ports of a layout with well-known ports ([`Options::port_bases`]).
#[derive(Debug, Clone, Copy)]
pub struct PortBases {
    pub http: u16,
    pub raft: u16,
}

impl Default for Options {
    /// What the daemon's integration tests use: one simulated GPU, a 1 s host TTL,
    /// subscription ratio 3, the fixed test tokens.
    fn default() -> Self {
        Self {
            fake_gpus: 1,
            gateway_hosts: 0,
            host_ttl: Duration::from_secs(1),
            subscription_ratio: Some(3.0),
            idle_release: None,
            object_store: None,
            python: Vec::new(),
            tls: false,
            fixed_http_ports: false,
            standalone: false,
            log_level: None,
            log_env: Some("info,raft=warn,raft_store=info".to_owned()),
            overlay: String::new(),
            env: Vec::new(),
            token: Some(TOKEN.to_owned()),
            operator_token: Some(OPERATOR_TOKEN.to_owned()),
            keep: false,
            daemon: None,
            port_bases: None,
            unauthenticated_loopback: false,
        }
    }
}

/// One host's place in the layout.
#[derive(Debug, Clone, Serialize)]
pub struct HostLayout {
    /// Raft node id (1-based; host `i` of the list is `i + 1`).
    pub node_id: u64,
    /// Its directory (config, `state/`, `run/`, logs).
    pub dir: PathBuf,
    /// Its config file.
    pub config_path: PathBuf,
    /// Its raft address.
    pub raft_addr: SocketAddr,
    /// Its URL when its HTTP port is fixed ([`Options::fixed_http_ports`]).
    pub url: Option<String>,
    /// Whether it founds the meta group (a seed); the others join with `nbos cluster join`.
    pub seed: bool,
    /// The configuration written to `config_path`.
    #[serde(skip)]
    pub config: DaemonConfig,
}

/// The cluster's directory and every host's configuration.
#[derive(Debug, Serialize)]
pub struct Layout {
    /// The shared directory (tokens, `objects/`, `pki/`, a directory per host).
    pub dir: PathBuf,
    /// The API token.
    pub token: String,
    /// The operator token.
    pub operator_token: String,
    /// File holding the API token.
    pub token_file: PathBuf,
    /// File holding the operator token.
    pub operator_token_file: PathBuf,
    /// The PKI's CA certificate, with TLS.
    pub ca_cert: Option<PathBuf>,
    /// The seeds as every host's config lists them (`"id=addr"`).
    pub seeds: Vec<String>,
    /// The hosts, node id `i + 1` at index `i`.
    pub hosts: Vec<HostLayout>,
    #[serde(skip)]
    options: Options,
    /// Node ids `gpu_hosts + 1 ..= prepared_hosts` are the gateway hosts.
    #[serde(skip)]
    gpu_hosts: u64,
    #[serde(skip)]
    prepared_hosts: u64,
}

impl Layout {
    /// Lays out `seeds` founding hosts and `hosts - seeds` more (configured with the same
    /// seeds, to join later) in `dir`, which must exist and may be shared with kernels.
    pub fn prepare(dir: &Path, hosts: u64, seeds: u64, options: Options) -> anyhow::Result<Layout> {
        anyhow::ensure!(seeds >= 1 && seeds <= hosts, "{seeds} seeds of {hosts} hosts");
        let gpu_hosts = hosts.checked_sub(options.gateway_hosts).context("more gateway hosts than hosts")?;
        // Kernels run as another uid (kernel.user): they pass through (0711), never list.
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o711))
            .with_context(|| format!("chmod {}", dir.display()))?;
        let token = options.token.clone().map_or_else(random_token, Ok)?;
        let operator_token = options.operator_token.clone().map_or_else(random_token, Ok)?;
        let token_file = dir.join("token");
        let operator_token_file = dir.join("operator-token");
        write_private(&token_file, &format!("{token}\n"))?;
        write_private(&operator_token_file, &format!("{operator_token}\n"))?;
        std::fs::create_dir_all(dir.join("objects")).context("objects dir")?;
        let mut ca_cert = None;
        if options.tls {
            let pki = notebookosd::pki::Pki::at(&dir.join("pki"));
            pki.init().context("pki init")?;
            let loopback = ["127.0.0.1".parse()?];
            for id in 1..=PKI_NODES.max(hosts) {
                pki.issue_node(id, &["localhost".to_owned()], &loopback).context("node certificate")?;
            }
            ca_cert = Some(pki.ca_cert());
        }
        let addrs: Vec<SocketAddr> =
            (1..=hosts).map(|id| port_of(&options, id, |b| b.raft)).collect::<anyhow::Result<_>>()?;
        let seed_list =
            addrs.iter().take(usize::try_from(seeds)?).zip(1u64..).map(|(a, id)| format!("{id}={a}")).collect();
        let mut layout = Layout {
            dir: dir.to_owned(),
            token,
            operator_token,
            token_file,
            operator_token_file,
            ca_cert,
            seeds: seed_list,
            hosts: Vec::new(),
            options,
            gpu_hosts,
            prepared_hosts: hosts,
        };
        for addr in addrs {
            layout.add_host_at(addr)?;
        }
        Ok(layout)
    }

    /// The options the hosts were configured with.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Lays out one more host (next node id, not a seed); returns its node id.
    pub fn add_host(&mut self) -> anyhow::Result<u64> {
        let next = u64::try_from(self.hosts.len())? + 1;
        self.add_host_at(port_of(&self.options, next, |b| b.raft)?)
    }

    fn add_host_at(&mut self, raft_addr: SocketAddr) -> anyhow::Result<u64> {
        let node_id = u64::try_from(self.hosts.len())? + 1;
        let o = &self.options;
        let dir = self.dir.join(format!("host{node_id}"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut c = DaemonConfig::new(&dir);
        c.name(&format!("host{node_id}"));
        if o.unauthenticated_loopback {
            c.config.http.allow_unauthenticated_loopback = true;
        } else {
            c.tokens(&self.token_file, Some(&self.operator_token_file));
        }
        let fixed = o.fixed_http_ports || o.port_bases.is_some();
        let http = if fixed { Some(port_of(o, node_id, |b| b.http)?) } else { None };
        if let Some(addr) = http {
            c.listen(addr);
        }
        let index = usize::try_from(node_id - 1)?;
        let python = match o.python.as_slice() {
            [] => bins::python(),
            [one] => one.clone(),
            many => many.get(index).cloned().context("no Python for this host")?,
        };
        // A relative path would be taken from the daemon's working directory.
        let python = if python.components().count() > 1 { std::path::absolute(&python)? } else { python };
        c.python(&python);
        let gateway_only = node_id > self.gpu_hosts && node_id <= self.prepared_hosts;
        let gpus = if gateway_only { 0 } else { o.fake_gpus };
        c.fake_gpus(gpus);
        if gpus > 0 {
            // Simulated GPUs have no driver to attach eBPF probes to.
            c.observer(notebookosd::config::ObserverMode::Procfs);
        }
        if let Some(r) = o.subscription_ratio {
            c.subscription_ratio(r);
        }
        if let Some(d) = o.idle_release {
            c.idle_release(d);
        }
        if let Some(level) = &o.log_level {
            c.log_level(level);
        }
        if !o.standalone {
            c.cluster(node_id, raft_addr, &self.seeds).host_ttl(o.host_ttl);
            let objects = self.dir.join("objects");
            c.object_store(&o.object_store.clone().unwrap_or_else(|| format!("file://{}", objects.display())));
        }
        if o.tls {
            let files = raft_store::NodeTlsFiles::in_dir(&self.dir.join("pki"), node_id);
            c.https(&files.cert, &files.key, &files.ca_cert);
            if !o.standalone {
                c.raft_tls(&files.ca_cert, &files.cert, &files.key);
            }
        }
        c.overlay(&o.overlay)?;
        let config_path = c.write(&dir.join("notebookosd.toml"))?;
        let scheme = if o.tls { "https" } else { "http" };
        self.hosts.push(HostLayout {
            node_id,
            dir,
            config_path,
            raft_addr,
            url: http.map(|a| format!("{scheme}://{a}")),
            seed: self.seeds.iter().any(|s| s.starts_with(&format!("{node_id}="))),
            config: c,
        });
        Ok(node_id)
    }

    /// Rewrites host `node_id`'s config after `edit` changed it (it takes effect at the
    /// host's next start).
    pub fn reconfigure(&mut self, node_id: u64, edit: impl FnOnce(&mut DaemonConfig)) -> anyhow::Result<()> {
        let h = self.hosts.get_mut(usize::try_from(node_id)? - 1).context("no such host")?;
        edit(&mut h.config);
        h.config.write(&h.config_path)?;
        Ok(())
    }
}

/// Host `node_id`'s address from the options' port bases (`which` picks HTTP or raft), else a
/// free one.
fn port_of(options: &Options, node_id: u64, which: impl Fn(&PortBases) -> u16) -> anyhow::Result<SocketAddr> {
    match &options.port_bases {
        Some(b) => {
            let port = u16::try_from(u64::from(which(b)) + node_id).context("port out of range")?;
            Ok(SocketAddr::from(([127, 0, 0, 1], port)))
        }
        None => free_loopback_addr(),
    }
}

/// A free loopback address (bound, then released; the daemon binds it soon after), below
/// the ephemeral range: a port-0 pick could be taken in between by any outgoing
/// connection or port-0 listener of the machine.
pub fn free_loopback_addr() -> anyhow::Result<SocketAddr> {
    raft_store::service::free_loopback_addr().context("finding a free port")
}

fn random_token() -> anyhow::Result<String> {
    let mut b = [0u8; 24];
    getrandom::fill(&mut b).map_err(|e| anyhow::anyhow!("random token: {e}"))?;
    Ok(hex::encode(b))
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .with_context(|| format!("chmod {}", path.display()))
}
