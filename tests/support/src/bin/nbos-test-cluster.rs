//! `nbos-test-cluster config`: prints one daemon's config from JSON sections.
//! `nbos-test-cluster prepare`: lays out a loopback cluster (tokens, PKI, each host's
//! directory, ports and config, from the same code as the Rust tests' launcher) and prints
//! it as one JSON object on stdout. The Python test kit and `scripts/demo.sh` start the
//! daemons from it, so every launcher configures hosts the same way.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use nbos_test_support::config::DaemonConfig;
use nbos_test_support::layout::{Layout, Options, PortBases};

#[derive(Debug, Parser)]
#[command(name = "nbos-test-cluster", about = "Lay out a loopback NotebookOS cluster and print it as JSON")]
enum Cli {
    /// Writes the cluster's directory and prints its layout.
    Prepare(Prepare),
    /// Prints one daemon's config: state and runtime directories under `--dir`, an HTTP
    /// listener on a loopback port it picks, and the sections of `--json` merged over that.
    Config(ConfigArgs),
}

#[derive(Debug, clap::Args)]
struct ConfigArgs {
    /// The daemon's directory (`state/`, `run/`).
    #[arg(long)]
    dir: PathBuf,
    /// A JSON object of config sections, e.g. `{"kernel": {"python": "/usr/bin/python3"}}`.
    #[arg(long, default_value = "{}")]
    json: String,
}

#[derive(Debug, clap::Args)]
struct Prepare {
    /// The cluster's directory (created if missing).
    #[arg(long)]
    dir: PathBuf,
    /// Hosts (node ids 1..=hosts).
    #[arg(long, default_value_t = 3)]
    hosts: u64,
    /// Hosts founding the meta group (the first ones; default: all). The others are
    /// configured with them as seeds and join with `nbos cluster join`.
    #[arg(long)]
    founders: Option<u64>,
    /// Gateway hosts without GPUs among the last ones.
    #[arg(long, default_value_t = 0)]
    gateway_hosts: u64,
    /// Simulated GPUs per host (0: none).
    #[arg(long, default_value_t = 1)]
    fake_gpus: u32,
    /// The kernels' Python: once for every host, or once per host.
    #[arg(long)]
    python: Vec<PathBuf>,
    /// Mutual TLS on the raft transport and HTTPS, from a PKI in `DIR/pki`.
    #[arg(long)]
    tls: bool,
    /// `cluster.host_ttl`.
    #[arg(long, default_value = "1s", value_parser = humantime_duration)]
    host_ttl: Duration,
    /// `gpu.subscription_ratio` (default: the daemon's).
    #[arg(long)]
    subscription_ratio: Option<f64>,
    /// `gpu.idle_release` (default: the daemon's).
    #[arg(long, value_parser = humantime_duration)]
    idle_release: Option<Duration>,
    /// `log.level` (with text format).
    #[arg(long, default_value = "info")]
    log_level: String,
    /// TOML sections merged over every host's config.
    #[arg(long, default_value = "")]
    overlay: String,
    /// Host i listens on HTTP port BASE+i (default: free ports).
    #[arg(long, requires = "raft_base")]
    http_base: Option<u16>,
    /// Host i's raft transport listens on port BASE+i.
    #[arg(long, requires = "http_base")]
    raft_base: Option<u16>,
    /// No API token on the loopback listener, as `notebookosd --dev` (with --tls, clients
    /// still present certificates).
    #[arg(long)]
    unauthenticated_loopback: bool,
}

fn humantime_duration(s: &str) -> Result<Duration, humantime::DurationError> {
    humantime::parse_duration(s)
}

fn main() -> anyhow::Result<()> {
    match Cli::parse() {
        Cli::Prepare(p) => prepare(p),
        Cli::Config(c) => {
            let sections: serde_json::Value = serde_json::from_str(&c.json).context("--json")?;
            let mut config = DaemonConfig::new(&std::path::absolute(&c.dir)?);
            config.overlay_json(&sections)?;
            print!("{}", config.to_checked_toml()?);
            Ok(())
        }
    }
}

fn prepare(p: Prepare) -> anyhow::Result<()> {
    std::fs::create_dir_all(&p.dir)?;
    let dir = std::path::absolute(&p.dir)?;
    let options = Options {
        fake_gpus: p.fake_gpus,
        gateway_hosts: p.gateway_hosts,
        host_ttl: p.host_ttl,
        subscription_ratio: p.subscription_ratio,
        idle_release: p.idle_release,
        python: p.python,
        tls: p.tls,
        fixed_http_ports: true,
        log_level: Some(p.log_level),
        log_env: None,
        overlay: p.overlay,
        token: None,
        operator_token: None,
        port_bases: p.http_base.zip(p.raft_base).map(|(http, raft)| PortBases { http, raft }),
        unauthenticated_loopback: p.unauthenticated_loopback,
        ..Options::default()
    };
    let layout = Layout::prepare(&dir, p.hosts, p.founders.unwrap_or(p.hosts), options)?;
    println!("{}", serde_json::to_string_pretty(&layout)?);
    Ok(())
}
