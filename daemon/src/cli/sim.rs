//! `nbos sim`.

use crate::cli::not_yet::not_yet;

/// Options of `nbos sim`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs the subcommand.
pub fn run(_args: Args) -> anyhow::Result<()> {
    not_yet("sim", "the trace simulator (with the single-host scheduler core, issue 6)")
}
