//! `nbos kernels`: the kernels of a host, their state and GPUs.

use std::fmt::Write;

use crate::cli::client::{Client, Target};
use crate::kernel::KernelModel;

/// Options of `nbos kernels`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Fetches and prints the kernels.
pub fn run(target: &Target, args: Args) -> anyhow::Result<()> {
    let client = Client::new(target)?;
    let kernels: Vec<KernelModel> = client.get_json("/api/kernels")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&kernels)?);
    } else {
        print!("{}", render(&kernels));
    }
    Ok(())
}

/// The human-readable table.
pub fn render(kernels: &[KernelModel]) -> String {
    let mut out = String::new();
    if kernels.is_empty() {
        out.push_str("no kernels\n");
        return out;
    }
    let _ = writeln!(
        out,
        "{:<36}  {:<24}  {:<10}  {:>4}  {:>5}  {:<10}  last activity",
        "id", "kernelspec", "state", "gpus", "conns", "pids"
    );
    for k in kernels {
        let pids = k.pids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let _ = writeln!(
            out,
            "{:<36}  {:<24}  {:<10}  {:>4}  {:>5}  {:<10}  {}",
            k.id, k.name, k.execution_state, k.gpus, k.connections, pids, k.last_activity
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_a_row_per_kernel() {
        let k = KernelModel {
            id: "a1".into(),
            name: "notebookos-python-1gpu".into(),
            last_activity: "2026-01-01T00:00:00.000000Z".into(),
            execution_state: "busy".into(),
            connections: 1,
            gpus: 1,
            pids: vec![42],
        };
        let t = render(&[k]);
        assert!(t.lines().count() == 2, "{t}");
        assert!(t.contains("notebookos-python-1gpu") && t.contains("busy") && t.contains("42"), "{t}");
        assert_eq!(render(&[]), "no kernels\n");
    }
}
