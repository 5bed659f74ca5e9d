//! `nbos kernel-proxy`.

use crate::cli::not_yet::not_yet;

/// Options of `nbos kernel-proxy`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs the subcommand.
pub fn run(_args: Args) -> anyhow::Result<()> {
    not_yet("kernel-proxy", "the single-host platform (issue 6)")
}
