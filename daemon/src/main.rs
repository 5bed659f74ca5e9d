//! `notebookosd`: the NotebookOS node daemon.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use notebookosd::config::Config;
use notebookosd::node::{self, RunOptions};

/// The NotebookOS node daemon: Jupyter kernels that hold GPUs only while a cell runs.
#[derive(Debug, Parser)]
#[command(
    name = "notebookosd",
    version,
    about = "NotebookOS node daemon: Jupyter kernels whose replicas hold GPUs only while a cell runs"
)]
struct Args {
    /// Configuration file (TOML; see /usr/share/doc/notebookosd/notebookosd.toml).
    #[arg(long, value_name = "FILE", conflicts_with = "dev")]
    config: Option<PathBuf>,

    /// Development mode: one host, loopback only, no token, state in a temporary
    /// directory (or --state-dir), removed on exit when temporary.
    #[arg(long)]
    dev: bool,

    /// With --dev: keep state in DIR instead of a temporary directory.
    #[arg(long, value_name = "DIR", requires = "dev")]
    state_dir: Option<PathBuf>,

    /// With --dev: listen on ADDR (a loopback address; port 0 picks a free one).
    #[arg(long, value_name = "ADDR", requires = "dev", default_value = "127.0.0.1:8888")]
    listen: SocketAddr,

    /// With --dev: simulate N GPUs with the fake-cuda test double.
    #[arg(long, value_name = "N", requires = "dev", default_value_t = 0)]
    fake_gpus: u32,

    /// With --dev: be host N of a loopback dev cluster (turns `[cluster]` on; needs --seeds and --pki).
    #[arg(long, value_name = "N", requires = "dev", requires = "seeds", requires = "pki")]
    cluster_node_id: Option<u64>,

    /// With --cluster-node-id: the cluster's PKI directory (`nbos pki init --dir DIR`, then
    /// `nbos pki issue --dir DIR node N --ip 127.0.0.1` per host): mutual TLS on raft, HTTPS
    /// with client certificates, and this host's node certificate towards the others.
    #[arg(long, value_name = "DIR", requires = "cluster_node_id")]
    pki: Option<PathBuf>,

    /// With --cluster-node-id: the raft transport address (loopback, fixed port).
    #[arg(long, value_name = "ADDR", requires = "cluster_node_id")]
    raft_listen: Option<SocketAddr>,

    /// With --cluster-node-id: the founding meta voters, `id=host:port,...` (cluster.seeds).
    #[arg(long, value_name = "LIST", value_delimiter = ',', requires = "cluster_node_id")]
    seeds: Vec<String>,

    /// With --cluster-node-id: heartbeat lease TTL (cluster.host_ttl), e.g. `1s`.
    #[arg(long, value_name = "DURATION", requires = "cluster_node_id", value_parser = humantime::parse_duration)]
    host_ttl: Option<std::time::Duration>,

    /// With --cluster-node-id: the large-object store every host of the dev cluster shares
    /// (cluster.object_store). Default: `file://$TMPDIR/notebookos-dev-objects-$UID`, a 0700
    /// directory of this user's (refused if another user made it), safe to share between
    /// this user's dev clusters because objects are immutable and named by their sha256.
    #[arg(long, value_name = "URL", requires = "cluster_node_id")]
    object_store: Option<String>,

    /// Validate the configuration and exit.
    #[arg(long)]
    check_config: bool,

    /// Print the notebookosd(8) manual page (roff) and exit (used to build the packages).
    #[arg(long, hide = true)]
    manpage: bool,
}

/// Default config path when neither --config nor --dev is given.
const DEFAULT_CONFIG: &str = "/etc/notebookos/notebookosd.toml";

fn main() -> ExitCode {
    // A kernel's PID namespace init is this binary re-executed (sys/pid_namespace.rs).
    notebookosd::sys::pid_namespace::run_as_init();
    let args = Args::parse();
    if args.manpage {
        let cmd = <Args as clap::CommandFactory>::command();
        let page = clap_mangen::Man::new(cmd).section("8");
        return match page.render(&mut std::io::stdout()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("notebookosd: writing the manual page: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let (config, opts) = match load(&args) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("notebookosd: {e:#}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = node::preflight::check(&config) {
        eprintln!("notebookosd: {e:#}");
        return ExitCode::from(2);
    }
    if args.check_config {
        println!("notebookosd: configuration OK");
        return ExitCode::SUCCESS;
    }
    notebookosd::logging::init(&config.log);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("notebookosd: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(node::run(config, opts)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "notebookosd failed");
            eprintln!("notebookosd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn load(args: &Args) -> anyhow::Result<(Config, RunOptions)> {
    if !args.dev {
        let path = args.config.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG));
        return Ok((Config::load(&path)?, RunOptions::default()));
    }
    anyhow::ensure!(
        args.listen.ip().is_loopback(),
        "--dev listens on loopback only; {} is not a loopback address (use --config for anything else)",
        args.listen
    );
    let (state_dir, remove_on_exit) = match &args.state_dir {
        Some(d) => (d.clone(), None),
        None => {
            let d = tempfile::Builder::new().prefix("notebookosd-dev-").tempdir()?.keep();
            (d.clone(), Some(d))
        }
    };
    let mut config = Config::dev(&state_dir, args.listen, args.fake_gpus);
    if let Some(node_id) = args.cluster_node_id {
        config.cluster.enabled = true;
        config.cluster.node_id = node_id;
        config.cluster.seeds = args.seeds.clone();
        config.node.name = format!("dev-{node_id}");
        if let Some(dir) = &args.pki {
            // A dev cluster is never plaintext: raft, HTTPS and host-to-host calls all use the PKI.
            let dir = std::path::absolute(dir)?;
            let node = notebookosd::pki::node_name(node_id);
            let (ca, cert, key) =
                (dir.join("ca.pem"), dir.join(format!("{node}.pem")), dir.join(format!("{node}.key")));
            for f in [&ca, &cert, &key] {
                anyhow::ensure!(
                    f.exists(),
                    "--pki: {} is missing (nbos pki init --dir {d}; nbos pki issue --dir {d} node {node_id} --ip 127.0.0.1)",
                    f.display(),
                    d = dir.display()
                );
            }
            config.cluster.tls = Some(notebookosd::config::ClusterTlsConfig {
                ca_cert: ca.clone(),
                cert: cert.clone(),
                key: key.clone(),
            });
            config.http.tls = Some(notebookosd::config::HttpTlsConfig { cert, key, client_ca: Some(ca) });
        }
        if let Some(a) = args.raft_listen {
            config.cluster.raft_listen = a;
        } else if let Some(own) =
            config.cluster.seed_list().ok().and_then(|s| s.into_iter().find(|s| s.node_id == node_id))
        {
            // Default: this host's own seed address.
            config.cluster.raft_listen = own.addr.parse().map_err(|_| {
                anyhow::anyhow!("--seeds: {}={} is not an IP:port; pass --raft-listen", own.node_id, own.addr)
            })?;
        }
        if let Some(ttl) = args.host_ttl {
            config.cluster.host_ttl = ttl;
        }
        config.cluster.object_store = match &args.object_store {
            Some(url) => url.clone(),
            // Every replica host must read what an executor wrote: one directory for all
            // this user's dev hosts on this machine, not one per state directory; private,
            // because its name in the shared temporary directory is predictable.
            // Several dev clusters of this user share it, so none collects it: each would
            // delete the objects the others refer to.
            None => {
                let uid = nix::unistd::geteuid().as_raw();
                let dir = std::env::temp_dir().join(format!("notebookos-dev-objects-{uid}"));
                notebookosd::cluster::cells::objects::ensure_private_dir(&dir)?;
                config.cluster.object_gc_interval = std::time::Duration::ZERO;
                format!("file://{}", dir.display())
            }
        };
    }
    config.validate("--dev")?;
    Ok((config, RunOptions { dev: true, remove_on_exit }))
}
