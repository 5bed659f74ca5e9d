//! `nbos bench raft`.

use crate::cli::not_yet::not_yet;

/// Options of `nbos bench raft`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs the benchmark.
pub fn run(_args: Args) -> anyhow::Result<()> {
    not_yet("bench raft", "the raft-store (issue 3)")
}
