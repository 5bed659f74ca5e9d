//! `nbos kernels`: the kernels of a host, their state and GPUs.

use std::fmt::Write;

use crate::cli::client::{Client, Target};
use crate::kernel::KernelModel;
use crate::sched::host::Snapshot;

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
    let gpus: Snapshot = client.get_json("/api/v1/gpus")?;
    let leases: Vec<serde_json::Value> = client.get_json("/api/v1/leases")?;
    if args.json {
        let all = serde_json::json!({ "kernels": kernels, "gpus": gpus, "leases": leases });
        println!("{}", serde_json::to_string_pretty(&all)?);
    } else {
        print!("{}", render(&kernels));
        print!("{}", render_gpus(&gpus));
        print!("{}", render_leases(&leases));
    }
    Ok(())
}

/// Who holds which GPU, and which cells wait.
pub fn render_gpus(s: &Snapshot) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\ngpus      {} total, {} committed, {} idle-held; {} requested by kernels",
        s.total, s.committed, s.idle_held, s.requested
    );
    let _ = writeln!(
        out,
        "gpu time  {:.1} GPU-s bound per cell; whole-session reservation would have bound {:.1} GPU-s",
        s.gpu_seconds_bound, s.gpu_seconds_reserved
    );
    for (i, h) in s.holders.iter().enumerate() {
        let (what, kernel) = h.split_once(':').unwrap_or((h.as_str(), ""));
        let _ = writeln!(out, "  gpu {i:<3} {what:<10} {kernel}");
    }
    if s.waiting.is_empty() {
        let _ = writeln!(out, "waiting   none");
    } else {
        let _ = writeln!(out, "waiting   {} cell(s)", s.waiting.len());
        for (pos, (kernel, cell)) in s.waiting.iter().enumerate() {
            let _ = writeln!(out, "  {:>3}. kernel {kernel}  cell {cell}", pos + 1);
        }
    }
    out
}

/// The lease server's view: which kernel process holds which physical GPUs.
pub fn render_leases(leases: &[serde_json::Value]) -> String {
    let mut out = String::new();
    if leases.is_empty() {
        let _ = writeln!(out, "leases    none (no kernel process has used a GPU)");
        return out;
    }
    let _ = writeln!(out, "leases    {} kernel process(es) connected", leases.len());
    for l in leases {
        let field = |k: &str| l.get(k).map(|v| v.to_string().trim_matches('"').to_owned()).unwrap_or_default();
        let _ = writeln!(
            out,
            "  pid {:<8} {:<11} lease {:<5} gpus {:<8} kernel {}",
            field("pid"),
            field("state"),
            field("lease"),
            field("gpus"),
            field("kernel_id")
        );
    }
    out
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

    #[test]
    fn gpu_table_names_holders_and_waiting_cells() {
        let s = Snapshot {
            total: 2,
            committed: 1,
            idle_held: 1,
            holders: vec!["committed:k1".into(), "idle:k2".into()],
            waiting: vec![("k3".into(), "c9".into())],
            requested: 3,
            gpu_seconds_bound: 12.5,
            gpu_seconds_reserved: 100.0,
        };
        let t = render_gpus(&s);
        assert!(t.contains("2 total, 1 committed, 1 idle-held"), "{t}");
        assert!(t.contains("gpu 0   committed  k1") && t.contains("gpu 1   idle       k2"), "{t}");
        assert!(t.contains("1. kernel k3  cell c9"), "{t}");
        assert!(t.contains("12.5 GPU-s bound") && t.contains("100.0 GPU-s"), "{t}");
    }
}
