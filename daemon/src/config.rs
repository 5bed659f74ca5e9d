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
    /// Several hosts as one cluster (off: a single host).
    pub cluster: ClusterConfig,
    /// Caps on what API clients may make the daemon hold.
    pub limits: LimitsConfig,
    /// Adding and releasing hosts through a provider (cluster mode).
    pub autoscale: AutoscaleConfig,
}

/// `[limits]`: caps on what API clients may make the daemon hold; a request over one is
/// refused with an error naming the key, and counted in `notebookos_refused_total`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Largest WebSocket message a client may send, bytes.
    pub websocket_max_message_bytes: usize,
    /// Bytes of client WebSocket messages being decoded and forwarded at once, all sockets
    /// of the host together; a message that finds no room within a few seconds closes its socket.
    pub websocket_inflight_bytes: usize,
    /// Messages queued to one WebSocket client before it is disconnected as stuck.
    pub websocket_queued_messages: usize,
    /// Open WebSocket connections to one kernel.
    pub websocket_connections_per_kernel: usize,
    /// Open WebSocket connections in all.
    pub websocket_connections: usize,
    /// Shell and control requests of one WebSocket connection awaiting their reply.
    pub pending_requests_per_connection: usize,
    /// Kernels created through one credential (today: the API token) that exist at once.
    pub kernels_per_token: usize,
    /// Kernels that exist at once (on this host; in the cluster in cluster mode).
    pub kernels: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            // Jupyter Server's (Tornado's) default websocket_max_message_size.
            websocket_max_message_bytes: 10 << 20,
            websocket_inflight_bytes: 128 << 20,
            websocket_queued_messages: 4096,
            websocket_connections_per_kernel: 64,
            websocket_connections: 1024,
            pending_requests_per_connection: 1024,
            kernels_per_token: 256,
            kernels: 1024,
        }
    }
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
    /// Serve HTTPS with this certificate (and accept client certificates from `client_ca`).
    pub tls: Option<HttpTlsConfig>,
    /// Permit plain HTTP on a non-loopback listener: only behind a TLS-terminating proxy.
    pub allow_plaintext: bool,
    /// File holding the operator token: membership, drain and re-placement need it.
    pub operator_token_file: Option<PathBuf>,
    /// Time a client has for its TLS handshake, and for each request's head (line and headers).
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// A connection that moves no byte this long with no request being handled is closed
    /// (an open WebSocket is not: it counts under `limits.websocket_connections`).
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Open HTTP connections (not yet WebSockets), all clients together; more are closed at accept.
    pub max_connections: usize,
    /// Open HTTP connections from one source address (an IPv6 /64); more are closed at accept.
    pub max_connections_per_source: usize,
}

/// `[http].tls`: the HTTPS listener's material (PEM files).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpTlsConfig {
    /// Server certificate chain.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// CA whose client certificates are accepted as credentials (users' API; and for
    /// cluster-internal routes, a certificate naming `node-<id>`).
    pub client_ca: Option<PathBuf>,
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
    /// Whether kernel processes may open only the GPU device files of GPUs they hold a lease
    /// on, enforced in the kernel by eBPF (`kernel::device_cgroup`). Unset: `off` (see
    /// docs/configuration.md for why it is not yet the default on NVIDIA hosts).
    pub device_guard: Option<DeviceGuardMode>,
}

/// `gpu.device_guard`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceGuardMode {
    /// A BPF cgroup device program per kernel cgroup; the daemon refuses to start without it.
    Ebpf,
    /// No enforcement below the CUDA shim.
    Off,
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
    /// Memory limit per kernel process tree in MiB (memory cgroup); 0 means none.
    /// Default [`DEFAULT_KERNEL_MEMORY_LIMIT_MIB`].
    pub memory_limit_mib: u64,
    /// Also set `memory_limit_mib` as RLIMIT_AS of each kernel process (an oversized
    /// allocation becomes a Python MemoryError, not an OOM kill). Off by default: CUDA
    /// and the JITs reserve far more address space than they use, and fail under it.
    pub limit_address_space: bool,
    /// Each kernel process in a PID namespace of its own (root daemons): it can signal and
    /// trace only its own processes, not the pre-warm pool's, other kernels' or the host's,
    /// whatever account they share. Inside, Python is pid 2 under a small init that reaps
    /// orphans. Off: kernels share the daemon's, as any process of their account does.
    pub pid_namespace: bool,
    /// The unprivileged account kernels run as when the daemon is root (never root).
    pub user: String,
    /// Group kernels run as; unset means `user`'s primary group.
    pub group: Option<String>,
    /// `[first, last]`: each running kernel gets its own uid (and gid = that uid) from
    /// this range, so kernels cannot read each other's files; unset: all run as `user`.
    pub uid_range: Option<[u32; 2]>,
    /// The kernel's working directory; unset means its private per-kernel directory.
    pub notebook_dir: Option<PathBuf>,
    /// Most processes (threads included) in one kernel's pids cgroup; 0 means no limit.
    pub pids_max: u64,
    /// Pre-warmed kernel processes kept even when none is taken (`docs/prewarm.md`).
    pub prewarm_min: u32,
    /// Most pre-warmed kernel processes; 0 turns the pool off (whatever `prewarm_min` says).
    pub prewarm_max: u32,
    /// Size of each kernel's home (HOME, TMPDIR, default working directory) in MiB: a
    /// sparse ext4 image in the kernel's directory under `node.state_dir`, loop-mounted
    /// (nosuid, nodev) in the kernel's own mount namespace, so a write past it fails with
    /// ENOSPC. Root daemons only; 0 means no quota (the home is a plain directory).
    pub home_quota_mib: u64,
    /// Size of each kernel's private `/dev/shm` (a tmpfs in its own mount namespace,
    /// nosuid, nodev, noexec) in MiB; root daemons only. 0 means the host's `/dev/shm`.
    pub shm_size_mib: u64,
    /// RLIMIT_NOFILE (soft and hard) of kernel processes; 0 means the daemon's own.
    pub open_files_max: u64,
    /// RLIMIT_NPROC of kernel processes: processes and threads of the kernel's *uid*, all
    /// of its processes together (with one shared `kernel.user`, all kernels' together;
    /// `pids_max` is the per-kernel cap). 0 means the daemon's own.
    pub nproc_max: u64,
    /// The largest Jupyter message (all its frames) the daemon takes from a kernel's ZMQ
    /// sockets; a kernel that sends more is disconnected and killed, never the daemon.
    pub max_message_bytes: u64,
}

/// `kernel.max_message_bytes`'s default: far above real Jupyter traffic (a notebook's
/// largest outputs, plots and widget states, are a few MiB; namespace state goes through
/// files, not messages), far below what hurts a host.
pub const DEFAULT_KERNEL_MAX_MESSAGE_BYTES: u64 = 64 << 20;

/// `kernel.memory_limit_mib`'s default, 16 GiB: room for an ordinary notebook (a
/// DataFrame of a few GiB, a model's host-side copy, DataLoader workers), while one
/// runaway cell cannot take a whole host's memory from its neighbours and the daemon
/// (`gpu.subscription_ratio` puts several kernels on a host). Raise it for big-data work.
pub const DEFAULT_KERNEL_MEMORY_LIMIT_MIB: u64 = 16 << 10;
/// `kernel.home_quota_mib`'s default, 10 GiB: datasets, checkpoints and pip installs of
/// one notebook; the image is sparse, so only what is written takes disk space.
pub const DEFAULT_KERNEL_HOME_QUOTA_MIB: u64 = 10 << 10;
/// `kernel.shm_size_mib`'s default, 2 GiB: PyTorch DataLoader workers pass batches
/// through `/dev/shm` (Docker's 64 MiB breaks them); its pages also count against the
/// kernel's memory cgroup.
pub const DEFAULT_KERNEL_SHM_SIZE_MIB: u64 = 2 << 10;
/// `kernel.open_files_max`'s default: far above what a notebook opens (PyTorch's
/// file-descriptor sharing included), far below the daemon's 1048576 (systemd unit).
pub const DEFAULT_KERNEL_OPEN_FILES_MAX: u64 = 65_536;
/// `kernel.nproc_max`'s default: with one shared `kernel.user` it caps all kernels of
/// the host together (a fork bomb in one kernel is stopped by `pids_max` first).
pub const DEFAULT_KERNEL_NPROC_MAX: u64 = 32_768;

/// `kernel.user`'s default: a system account made by `scripts/install-deps.sh` and
/// `packaging/notebookos.sysusers`.
pub const DEFAULT_KERNEL_USER: &str = "notebookos-kernel";

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

/// `[cluster].tls`: the raft transport's mutual TLS material (PEM files).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterTlsConfig {
    /// The cluster CA certificate.
    pub ca_cert: PathBuf,
    /// This host's certificate (SAN `node-<node_id>`, server and client auth).
    pub cert: PathBuf,
    /// This host's private key.
    pub key: PathBuf,
}

/// `[cluster]`: this host as a member of a NotebookOS cluster (issue 7).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Off: a single host, exactly as without this section.
    pub enabled: bool,
    /// Raft node id of this host: non-zero and unique in the cluster.
    pub node_id: u64,
    /// Address the raft transport listens on.
    pub raft_listen: SocketAddr,
    /// Address a host outside the seeds gives the cluster for its raft transport when the
    /// others cannot reach it at `raft_listen` (a wildcard listener, NAT, a proxy). Unset:
    /// `raft_listen`. A seed is always reached at its seed address.
    pub raft_advertise: Option<SocketAddr>,
    /// Base URL other hosts use to reach this host's HTTP API; empty means the HTTP listener's URL.
    pub advertise_url: String,
    /// The founding voters of the meta group, as `"id=host:port"` (raft addresses). A host
    /// not listed joins an existing cluster with `nbos cluster join`.
    pub seeds: Vec<String>,
    /// Mutual TLS for the raft transport; unset means plaintext, allowed only on loopback.
    pub tls: Option<ClusterTlsConfig>,
    /// A host whose heartbeat lease is not renewed for this long is down.
    #[serde(with = "humantime_serde")]
    pub host_ttl: Duration,
    /// Replicas per kernel (on distinct hosts).
    pub replicas: u32,
    /// Namespace objects up to this size travel in the kernel's raft log; larger ones
    /// go to the object store and only a pointer is logged.
    pub sync_inline_max_bytes: u64,
    /// Large-object store URL (`file:///dir`, `s3://bucket/prefix`); empty means
    /// `file://{node.state_dir}/objects`.
    pub object_store: String,
    /// Longest time one request to an S3 store may take (a stalled upload fails the
    /// cell's sync after this and two retries).
    #[serde(with = "humantime_serde")]
    pub object_store_timeout: Duration,
    /// How often the meta leader collects unreferenced large objects; 0 turns it off.
    #[serde(with = "humantime_serde")]
    pub object_gc_interval: Duration,
    /// An unreferenced object is deleted only once its last write is this old: longer than
    /// any replica's catch-up (a lagging replica or a learner may still read it).
    #[serde(with = "humantime_serde")]
    pub object_gc_grace: Duration,
}

/// `[autoscale]`: the meta leader adds hosts through a provider when kernels cannot be
/// placed, cells find no host to move to, or committed GPUs call for it, and releases idle
/// hosts (drained first) when they do not. Defaults are the NotebookOS anchors' (30 s
/// interval; the paper's rule: factor 1.05, limit 1.1, 3 hosts of buffer, 2 released a step).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AutoscaleConfig {
    /// `none` (never scale) or `exec` (run `command` with a JSON request on stdin).
    pub provider: AutoscaleProvider,
    /// The `exec` provider's program and arguments (an absolute program path).
    pub command: Vec<String>,
    /// `notebookos` (keep `spare_hosts` whole hosts free above the recent peak of demand)
    /// or `paper` (NotebookOS's committed-GPU rule with `scale_out_factor`, `scale_in_limit`,
    /// `buffer_hosts`).
    pub rule: AutoscaleRule,
    /// Never fewer live hosts than this (a kernel needs `cluster.replicas` hosts).
    pub min_hosts: u32,
    /// Never more hosts than this, booting ones included.
    pub max_hosts: u32,
    /// How often the meta leader decides.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// `notebookos` rule: whole hosts kept free.
    pub spare_hosts: u32,
    /// `notebookos` rule: the window over which the peak of committed plus waiting GPUs is kept.
    #[serde(with = "humantime_serde")]
    pub peak_window: Duration,
    /// `paper` rule: scale out to committed GPUs × this.
    pub scale_out_factor: f64,
    /// `paper` rule: scale in while hosts exceed committed GPUs × this.
    pub scale_in_limit: f64,
    /// `paper` rule: hosts kept above `min_hosts`.
    pub buffer_hosts: u32,
    /// Hosts released per decision at most.
    pub max_release: u32,
    /// A requested host that has not registered by then no longer counts as booting.
    #[serde(with = "humantime_serde")]
    pub boot_timeout: Duration,
    /// How long one provider command may run.
    #[serde(with = "humantime_serde")]
    pub command_timeout: Duration,
    /// How long `POST /api/kernels` waits for a host when placement finds none (0: refuse at once).
    #[serde(with = "humantime_serde")]
    pub placement_wait: Duration,
}

/// `autoscale.provider`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AutoscaleProvider {
    /// No autoscaling.
    None,
    /// An external command (see `docs/autoscaling.md` for its JSON contract).
    Exec,
}

/// `autoscale.rule`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AutoscaleRule {
    /// Ours (`sched::scale::ours`).
    Notebookos,
    /// NotebookOS's (`sched::scale::paper`).
    Paper,
}

impl Default for AutoscaleConfig {
    fn default() -> Self {
        Self {
            provider: AutoscaleProvider::None,
            command: Vec::new(),
            rule: AutoscaleRule::Paper,
            min_hosts: 3,
            max_hosts: 64,
            interval: Duration::from_secs(30),
            spare_hosts: 1,
            peak_window: Duration::from_secs(600),
            scale_out_factor: 1.05,
            scale_in_limit: 1.1,
            buffer_hosts: 3,
            max_release: 2,
            boot_timeout: Duration::from_secs(600),
            command_timeout: Duration::from_secs(600),
            placement_wait: Duration::from_secs(300),
        }
    }
}

/// One founding voter of the meta group, from `cluster.seeds`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seed {
    /// Raft node id.
    pub node_id: u64,
    /// Raft transport address as written (`host:port`, resolved at start).
    pub addr: String,
}

impl ClusterConfig {
    /// The parsed `seeds` (validated by [`Config::validate`]).
    pub fn seed_list(&self) -> Result<Vec<Seed>, String> {
        let mut out: Vec<Seed> = Vec::with_capacity(self.seeds.len());
        for s in &self.seeds {
            let (id, addr) = s.split_once('=').ok_or_else(|| format!("{s:?} is not \"id=host:port\""))?;
            let node_id: u64 = id
                .trim()
                .parse()
                .ok()
                .filter(|&n| n != 0)
                .ok_or_else(|| format!("{s:?}: the node id must be a non-zero integer"))?;
            let addr = addr.trim();
            let port = addr.rsplit_once(':').map(|(host, port)| (host, port.parse::<u16>()));
            match port {
                Some((host, Ok(p))) if !host.is_empty() && p != 0 => {}
                _ => return Err(format!("{s:?}: the address must be host:port with a non-zero port")),
            }
            if out.iter().any(|o| o.node_id == node_id) {
                return Err(format!("node id {node_id} is listed twice"));
            }
            out.push(Seed { node_id, addr: addr.to_owned() });
        }
        Ok(out)
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            node_id: 0,
            raft_listen: SocketAddr::from(([127, 0, 0, 1], 8890)),
            raft_advertise: None,
            advertise_url: String::new(),
            seeds: Vec::new(),
            tls: None,
            host_ttl: Duration::from_secs(3),
            replicas: 3,
            sync_inline_max_bytes: 1 << 20,
            object_store: String::new(),
            object_store_timeout: Duration::from_secs(60),
            object_gc_interval: Duration::from_secs(600),
            object_gc_grace: Duration::from_secs(3600),
        }
    }
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
            tls: None,
            allow_plaintext: false,
            operator_token_file: None,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 4096,
            max_connections_per_source: 256,
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
            device_guard: None,
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
        Self {
            python: PathBuf::from("python3"),
            memory_limit_mib: DEFAULT_KERNEL_MEMORY_LIMIT_MIB,
            limit_address_space: false,
            pid_namespace: true,
            user: DEFAULT_KERNEL_USER.to_owned(),
            group: None,
            uid_range: None,
            notebook_dir: None,
            pids_max: 4096,
            // NotebookOS keeps 3 per host; ours keeps 1 when nothing is taken and grows
            // to 3 with demand (sched::prewarm).
            prewarm_min: 1,
            prewarm_max: 3,
            home_quota_mib: DEFAULT_KERNEL_HOME_QUOTA_MIB,
            shm_size_mib: DEFAULT_KERNEL_SHM_SIZE_MIB,
            open_files_max: DEFAULT_KERNEL_OPEN_FILES_MAX,
            nproc_max: DEFAULT_KERNEL_NPROC_MAX,
            max_message_bytes: DEFAULT_KERNEL_MAX_MESSAGE_BYTES,
        }
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
        self.validate_kernel(origin)?;
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log.level) {
            return Err(invalid("log.level", format!("not a valid filter: {e}")));
        }
        self.validate_cluster(origin)?;
        self.validate_autoscale(origin)
    }

    /// `[autoscale]`: checked only when a provider is set.
    fn validate_autoscale(&self, origin: &str) -> Result<(), ConfigError> {
        let invalid =
            |field: &'static str, reason: String| ConfigError::Invalid { origin: origin.to_owned(), field, reason };
        let a = &self.autoscale;
        if a.provider == AutoscaleProvider::None {
            return Ok(());
        }
        if !self.cluster.enabled {
            return Err(invalid("autoscale.provider", "needs a cluster ([cluster] enabled = true)".into()));
        }
        match a.command.first() {
            Some(p) if Path::new(p).is_absolute() => {}
            _ => {
                return Err(invalid(
                    "autoscale.command",
                    "the exec provider needs a command whose program is an absolute path".into(),
                ))
            }
        }
        if a.min_hosts > a.max_hosts || a.max_hosts == 0 {
            return Err(invalid(
                "autoscale.max_hosts",
                format!("must be at least 1 and autoscale.min_hosts ({}), got {}", a.min_hosts, a.max_hosts),
            ));
        }
        if a.interval < Duration::from_millis(100) {
            return Err(invalid("autoscale.interval", "must be at least 100ms".into()));
        }
        for (field, v) in
            [("autoscale.scale_out_factor", a.scale_out_factor), ("autoscale.scale_in_limit", a.scale_in_limit)]
        {
            if !(v.is_finite() && v > 0.0) {
                return Err(invalid(field, format!("must be a positive number, got {v}")));
            }
        }
        Ok(())
    }

    /// `[kernel]`: what the text alone shows (the accounts are looked up at start,
    /// `kernel::identity`).
    fn validate_kernel(&self, origin: &str) -> Result<(), ConfigError> {
        let invalid =
            |field: &'static str, reason: String| ConfigError::Invalid { origin: origin.to_owned(), field, reason };
        let k = &self.kernel;
        if k.user.is_empty() || k.user == "root" {
            return Err(invalid("kernel.user", format!("must name an unprivileged account, got {:?}", k.user)));
        }
        if k.group.as_deref().is_some_and(|g| g.is_empty() || g == "root") {
            return Err(invalid("kernel.group", "must name an unprivileged group (or be unset)".into()));
        }
        if let Some([first, last]) = k.uid_range {
            if first == 0 {
                return Err(invalid("kernel.uid_range", "must not include uid 0 (root)".into()));
            }
            if first > last {
                return Err(invalid("kernel.uid_range", format!("[{first}, {last}] is empty (first > last)")));
            }
            if last >= u32::MAX - 1 {
                return Err(invalid("kernel.uid_range", format!("{last} is not a usable uid")));
            }
        }
        if k.prewarm_max > 0 && k.prewarm_min > k.prewarm_max {
            return Err(invalid(
                "kernel.prewarm_min",
                format!("{} exceeds kernel.prewarm_max = {}", k.prewarm_min, k.prewarm_max),
            ));
        }
        if k.prewarm_max > 64 {
            return Err(invalid("kernel.prewarm_max", format!("{} is more than 64 idle Pythons", k.prewarm_max)));
        }
        // Below 1 MiB an ordinary plot would kill its kernel; above 1 GiB one message of
        // each of a host's kernels could exhaust it.
        const MIB: u64 = 1 << 20;
        if !(MIB..=1024 * MIB).contains(&k.max_message_bytes) {
            return Err(invalid(
                "kernel.max_message_bytes",
                format!("{} is outside 1 MiB ..= 1 GiB (1048576 ..= 1073741824)", k.max_message_bytes),
            ));
        }
        // ext4 needs a few MiB of its own; below 64 MiB a home holds nothing useful.
        if k.home_quota_mib != 0 && !(64..=1 << 30).contains(&k.home_quota_mib) {
            return Err(invalid(
                "kernel.home_quota_mib",
                format!("{} is outside 64 ..= 1073741824 MiB (0: no quota)", k.home_quota_mib),
            ));
        }
        if k.shm_size_mib > 1 << 30 {
            return Err(invalid("kernel.shm_size_mib", format!("{} MiB is more than any host has", k.shm_size_mib)));
        }
        // ipykernel alone holds ~30 descriptors (ZMQ sockets, logs); above the kernel's
        // fs.nr_open default (1048576) setrlimit fails and no kernel would start.
        if k.open_files_max != 0 && !(256..=1 << 20).contains(&k.open_files_max) {
            return Err(invalid(
                "kernel.open_files_max",
                format!("{} is outside 256 ..= 1048576 (0: the daemon's own)", k.open_files_max),
            ));
        }
        // Python and ipykernel start a dozen threads; below 64 no kernel would start.
        if k.nproc_max != 0 && k.nproc_max < 64 {
            return Err(invalid("kernel.nproc_max", format!("{} is below 64 (0: the daemon's own)", k.nproc_max)));
        }
        if let Some(d) = &k.notebook_dir {
            if !d.is_absolute() {
                return Err(invalid("kernel.notebook_dir", format!("must be an absolute path, got {}", d.display())));
            }
        }
        Ok(())
    }

    /// `[cluster]`: checked only when enabled (a disabled section changes nothing).
    fn validate_cluster(&self, origin: &str) -> Result<(), ConfigError> {
        let invalid =
            |field: &'static str, reason: String| ConfigError::Invalid { origin: origin.to_owned(), field, reason };
        let c = &self.cluster;
        if !c.enabled {
            return Ok(());
        }
        if c.node_id == 0 {
            return Err(invalid("cluster.node_id", "must be a non-zero integer unique in the cluster".into()));
        }
        let seeds = c.seed_list().map_err(|e| invalid("cluster.seeds", e))?;
        if seeds.is_empty() {
            return Err(invalid(
                "cluster.seeds",
                "must list the founding meta voters as \"id=host:port\" (this host's own entry when it founds the cluster)".into(),
            ));
        }
        if c.raft_listen.port() == 0 {
            return Err(invalid("cluster.raft_listen", "needs a fixed port: the other hosts' seeds name it".into()));
        }
        if let Some(own) = seeds.iter().find(|s| s.node_id == c.node_id) {
            if let Ok(addr) = own.addr.parse::<SocketAddr>() {
                if addr.port() != c.raft_listen.port() {
                    return Err(invalid(
                        "cluster.seeds",
                        format!(
                            "this host's own seed {}={} does not match cluster.raft_listen = {}",
                            own.node_id, own.addr, c.raft_listen
                        ),
                    ));
                }
            }
        }
        if let Some(a) = c.raft_advertise {
            if a.ip().is_unspecified() || a.port() == 0 {
                return Err(invalid(
                    "cluster.raft_advertise",
                    format!("{a} is not an address other hosts can reach (no wildcard, a fixed port)"),
                ));
            }
        }
        if c.raft_listen.ip().is_unspecified()
            && c.raft_advertise.is_none()
            && !seeds.iter().any(|s| s.node_id == c.node_id)
        {
            return Err(invalid(
                "cluster.raft_listen",
                format!(
                    "{} cannot be handed to the cluster by `nbos cluster join`: a host outside cluster.seeds \
                     must listen on the address the other hosts reach it at, or name it in cluster.raft_advertise",
                    c.raft_listen
                ),
            ));
        }
        if c.tls.is_none() && !c.raft_listen.ip().is_loopback() {
            return Err(invalid(
                "cluster.tls",
                format!(
                    "required because cluster.raft_listen = {} is not a loopback address \
                     (plaintext raft traffic is accepted on loopback only)",
                    c.raft_listen
                ),
            ));
        }
        if c.tls.is_none() {
            if let Some(s) = seeds.iter().find(|s| s.addr.parse::<SocketAddr>().map_or(true, |a| !a.ip().is_loopback()))
            {
                return Err(invalid(
                    "cluster.tls",
                    format!("required because seed {}={} is not a loopback address", s.node_id, s.addr),
                ));
            }
        }
        if let Some(tls) = &c.tls {
            for (field, p) in [("cluster.tls", &tls.ca_cert), ("cluster.tls", &tls.cert), ("cluster.tls", &tls.key)] {
                if !p.is_absolute() {
                    return Err(invalid(field, format!("paths must be absolute, got {}", p.display())));
                }
            }
        }
        if c.host_ttl < Duration::from_millis(500) || c.host_ttl > Duration::from_secs(3600) {
            return Err(invalid(
                "cluster.host_ttl",
                format!("must be between 500ms and 1h, got {}", humantime::format_duration(c.host_ttl)),
            ));
        }
        if c.replicas == 0 || c.replicas > 9 {
            return Err(invalid("cluster.replicas", format!("must be 1..=9, got {}", c.replicas)));
        }
        if c.sync_inline_max_bytes == 0 || c.sync_inline_max_bytes > 8 << 20 {
            return Err(invalid(
                "cluster.sync_inline_max_bytes",
                format!(
                    "must be 1..=8388608 (a kernel group's snapshot is one 16 MiB frame), got {}",
                    c.sync_inline_max_bytes
                ),
            ));
        }
        let scheme_ok = c.advertise_url.starts_with("http://") || c.advertise_url.starts_with("https://");
        if !c.advertise_url.is_empty() && !scheme_ok {
            return Err(invalid(
                "cluster.advertise_url",
                format!("must be an http:// or https:// URL, got {:?}", c.advertise_url),
            ));
        }
        if c.object_store.is_empty() && c.replicas > 1 {
            return Err(invalid(
                "cluster.object_store",
                "must be set when kernels have several replicas: every replica host reads the large objects \
                 an executor wrote, so use s3://bucket[/prefix] or a directory every host mounts \
                 (file:///mnt/shared/...), not a directory of this host only"
                    .to_owned(),
            ));
        }
        if c.object_store_timeout < Duration::from_secs(1) {
            return Err(invalid(
                "cluster.object_store_timeout",
                format!("must be at least 1s, got {:?}", c.object_store_timeout),
            ));
        }
        if !c.object_store.is_empty() {
            let ok = c
                .object_store
                .strip_prefix("file://")
                .map(|p| Path::new(p).is_absolute())
                .unwrap_or_else(|| c.object_store.strip_prefix("s3://").is_some_and(|b| !b.is_empty()));
            if !ok {
                return Err(invalid(
                    "cluster.object_store",
                    format!("must be file:///absolute/dir or s3://bucket[/prefix], got {:?}", c.object_store),
                ));
            }
        }
        Ok(())
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

    const SHIPPED: &str = include_str!("../../packaging/notebookosd.toml");

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
            ("[kernel]\nhome_quota_mib = 8\n", "kernel.home_quota_mib"),
            ("[kernel]\nshm_size_mib = 2000000000\n", "kernel.shm_size_mib"),
            ("[kernel]\nopen_files_max = 16\n", "kernel.open_files_max"),
            ("[kernel]\nopen_files_max = 2000000\n", "kernel.open_files_max"),
            ("[kernel]\nnproc_max = 10\n", "kernel.nproc_max"),
        ] {
            let err = Config::parse(text, "t.toml").expect_err(text);
            assert!(err.to_string().contains(field), "{text}: {err}");
        }
    }

    const CLUSTER: &str = "[cluster]\nenabled = true\nnode_id = 1\nraft_listen = \"127.0.0.1:7001\"\n";

    #[test]
    fn cluster_section_is_off_by_default_and_accepts_a_loopback_dev_cluster() {
        assert!(!Config::default().cluster.enabled);
        let seed_text = "seeds = [\"1=127.0.0.1:7001\", \"2=127.0.0.1:7002\", \"3=127.0.0.1:7003\"]\n";
        let text = format!("{CLUSTER}{seed_text}object_store = \"file:///srv/objects\"\n");
        let c = Config::parse(&text, "t.toml").expect("valid cluster config");
        let seeds = c.cluster.seed_list().expect("seeds");
        assert_eq!(seeds.iter().map(|s| s.node_id).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert_eq!(c.cluster.host_ttl, Duration::from_secs(3));
        assert_eq!(c.cluster.replicas, 3);
        assert_eq!(c.object_store_url(), "file:///srv/objects");
        // Several replicas need a store every host reads; one replica may use the host's own.
        let err = Config::parse(&format!("{CLUSTER}{seed_text}"), "t.toml").expect_err("no object store");
        assert!(err.to_string().contains("cluster.object_store"), "{err}");
        let single = Config::parse(&format!("{CLUSTER}{seed_text}replicas = 1\n"), "t.toml").expect("one replica");
        assert_eq!(single.object_store_url(), "file:///var/lib/notebookos/objects");
    }

    #[test]
    fn bad_cluster_values_name_their_key() {
        let seeds = "seeds = [\"1=127.0.0.1:7001\"]\n";
        for (text, field) in [
            (format!("[cluster]\nenabled = true\n{seeds}"), "cluster.node_id"),
            (CLUSTER.to_owned(), "cluster.seeds"),
            (format!("{CLUSTER}seeds = [\"one=127.0.0.1:7001\"]\n"), "cluster.seeds"),
            (format!("{CLUSTER}seeds = [\"1=127.0.0.1\"]\n"), "cluster.seeds"),
            (format!("{CLUSTER}seeds = [\"1=127.0.0.1:7001\", \"1=127.0.0.1:7002\"]\n"), "cluster.seeds"),
            (format!("{CLUSTER}seeds = [\"1=127.0.0.1:7009\"]\n"), "cluster.seeds"),
            (format!("{CLUSTER}seeds = [\"1=127.0.0.1:7001\", \"2=10.0.0.2:7001\"]\n"), "cluster.tls"),
            (format!("[cluster]\nenabled = true\nnode_id = 1\nraft_listen = \"0.0.0.0:7001\"\n{seeds}"), "cluster.tls"),
            (
                format!("{CLUSTER}{seeds}tls = {{ ca_cert = \"ca.pem\", cert = \"/c.pem\", key = \"/k.pem\" }}\n"),
                "cluster.tls",
            ),
            (format!("{CLUSTER}{seeds}host_ttl = \"10ms\"\n"), "cluster.host_ttl"),
            (format!("{CLUSTER}{seeds}host_ttl = \"soon\"\n"), "cluster.host_ttl"),
            (format!("{CLUSTER}{seeds}replicas = 0\n"), "cluster.replicas"),
            (format!("{CLUSTER}{seeds}sync_inline_max_bytes = 0\n"), "cluster.sync_inline_max_bytes"),
            (format!("{CLUSTER}{seeds}advertise_url = \"host:8888\"\n"), "cluster.advertise_url"),
            (format!("{CLUSTER}{seeds}object_store = \"objects\"\n"), "cluster.object_store"),
            (
                format!("[cluster]\nenabled = true\nnode_id = 1\nraft_listen = \"127.0.0.1:0\"\n{seeds}"),
                "cluster.raft_listen",
            ),
            (format!("{CLUSTER}{seeds}seed = []\n"), "cluster.seed"),
            (
                format!(
                    "[cluster]\nenabled = true\nnode_id = 4\nraft_listen = \"0.0.0.0:7004\"\n{seeds}\
                     tls = {{ ca_cert = \"/ca.pem\", cert = \"/c.pem\", key = \"/k.pem\" }}\n"
                ),
                "cluster.raft_listen",
            ),
            (format!("{CLUSTER}{seeds}raft_advertise = \"0.0.0.0:7001\"\n"), "cluster.raft_advertise"),
            (format!("{CLUSTER}{seeds}raft_advertise = \"10.0.0.4:0\"\n"), "cluster.raft_advertise"),
        ] {
            let err = Config::parse(&text, "t.toml").expect_err(&text);
            assert!(err.to_string().contains(field), "{text}: {err}");
        }
        // A joining host on a wildcard listener that names the address it is reached at.
        let joining = format!(
            "[cluster]\nenabled = true\nnode_id = 4\nraft_listen = \"0.0.0.0:7004\"\nraft_advertise = \"10.0.0.4:7004\"\n\
             {seeds}object_store = \"file:///srv/o\"\ntls = {{ ca_cert = \"/ca.pem\", cert = \"/c.pem\", key = \"/k.pem\" }}\n"
        );
        let c = Config::parse(&joining, "t.toml").expect("a wildcard listener with raft_advertise");
        assert_eq!(c.cluster.raft_advertise, Some("10.0.0.4:7004".parse().expect("addr")));
    }

    #[test]
    fn autoscaling_is_checked_when_a_provider_is_set() {
        let cluster = format!("{CLUSTER}seeds = [\"1=127.0.0.1:7001\"]\nobject_store = \"file:///srv/o\"\n");
        let exec = "[autoscale]\nprovider = \"exec\"\n";
        for (text, field) in [
            (exec.to_owned(), "autoscale.provider"),
            (format!("{cluster}{exec}"), "autoscale.command"),
            (format!("{cluster}{exec}command = [\"provider.sh\"]\n"), "autoscale.command"),
            (format!("{cluster}{exec}command = [\"/p\"]\nmin_hosts = 5\nmax_hosts = 4\n"), "autoscale.max_hosts"),
            (format!("{cluster}{exec}command = [\"/p\"]\ninterval = \"1ms\"\n"), "autoscale.interval"),
            (format!("{cluster}{exec}command = [\"/p\"]\nscale_out_factor = 0.0\n"), "autoscale.scale_out_factor"),
            (format!("{cluster}{exec}command = [\"/p\"]\nrule = \"greedy\"\n"), "autoscale.rule"),
        ] {
            let err = Config::parse(&text, "t.toml").expect_err(&text);
            assert!(err.to_string().contains(field), "{text}: {err}");
        }
        let ok = Config::parse(
            &format!("{cluster}{exec}command = [\"/usr/lib/notebookos/provider\", \"--pool\", \"a\"]\n"),
            "t.toml",
        )
        .expect("a valid exec provider");
        assert_eq!(ok.autoscale.interval, Duration::from_secs(30), "the anchors' interval");
        assert_eq!(ok.autoscale.rule, AutoscaleRule::Paper);
        let none =
            Config::parse("[autoscale]\ncommand = [\"relative\"]\n", "t.toml").expect("provider none: unchecked");
        assert_eq!(none.autoscale.provider, AutoscaleProvider::None);
    }

    #[test]
    fn a_disabled_cluster_section_is_not_checked() {
        let c = Config::parse("[cluster]\nnode_id = 0\nseeds = [\"garbage\"]\n", "t.toml").expect("disabled");
        assert!(!c.cluster.enabled);
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
