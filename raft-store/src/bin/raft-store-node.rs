//! One raft-store node process (for multi-process tests and benchmarks).
//!
//! `raft-store-node --config node.json` where the file holds a `NodeServiceConfig`.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;

/// Runs one raft-store node with a JSON-lines client API.
#[derive(Debug, Parser)]
struct Args {
    /// Path of the node configuration (JSON `NodeServiceConfig`).
    #[arg(long)]
    config: PathBuf,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn,raft=error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let text = std::fs::read_to_string(&args.config)
        .with_context(|| format!("read node configuration {}", args.config.display()))?;
    let cfg: raft_store::service::NodeServiceConfig =
        serde_json::from_str(&text).with_context(|| format!("parse node configuration {}", args.config.display()))?;
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().context("start runtime")?;
    rt.block_on(raft_store::service::run_node(cfg))
}
