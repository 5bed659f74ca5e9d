//! `nbos bench shim`.

use crate::cli::not_yet::not_yet;

/// Options of `nbos bench shim`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs the benchmark.
pub fn run(_args: Args) -> anyhow::Result<()> {
    not_yet("bench shim", "the CUDA shim (issue 4)")
}
