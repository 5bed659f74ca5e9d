//! `nbos status`: one host at a glance.

use std::fmt::Write;

use crate::client::{Client, ConnectArgs};
use notebookosd::status::NodeStatus;

/// Options of `nbos status`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print the raw JSON status.
    #[arg(long)]
    pub json: bool,
}

/// Fetches and prints the status.
pub fn run(target: &ConnectArgs, args: Args) -> anyhow::Result<()> {
    let client = Client::new(target)?;
    let status: NodeStatus = client.get_json("/api/v1/status")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print!("{}", render(&status));
    }
    Ok(())
}

/// The human-readable table.
pub fn render(s: &NodeStatus) -> String {
    let mut out = String::new();
    let mode = if s.dev { " (dev)" } else { "" };
    let _ = writeln!(out, "node      {}{mode}", s.node);
    let _ = writeln!(out, "version   {}", s.version);
    let _ = writeln!(out, "url       {}  auth: {}", s.url, if s.auth { "token" } else { "none (loopback)" });
    let _ = writeln!(out, "uptime    {}s", s.uptime_s);
    let _ = writeln!(out, "state     {}", s.state_dir);
    let _ = writeln!(out, "kernels   {}", s.kernels);
    let sim = if s.inventory.source == "fake" { ", SIMULATED (fake-cuda test double)" } else { "" };
    let _ = writeln!(out, "gpus      {} ({}{sim})", s.inventory.gpus.len(), s.inventory.source);
    if !s.inventory.gpus.is_empty() {
        let _ = writeln!(out, "  {:<5} {:<42} {:>10}  name", "index", "uuid", "memory");
        for g in &s.inventory.gpus {
            let fence = match s.fenced_gpus.iter().find(|f| f.index == g.index as usize) {
                Some(f) => format!(
                    "  FENCED ({}: memory of kernel {} pid {} still on it, {}s)",
                    f.reason, f.kernel_id, f.holder_pid, f.fenced_for_s
                ),
                None => String::new(),
            };
            let _ = writeln!(out, "  {:<5} {:<42} {:>7} MiB  {}{fence}", g.index, g.uuid, g.memory_mib, g.name);
        }
    }
    if !s.fenced_gpus.is_empty() {
        let _ = writeln!(
            out,
            "fenced    {} GPU(s) not granted until the memory on them is gone (the daemon's log says why)",
            s.fenced_gpus.len()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use notebookosd::gpu::{GpuInfo, Inventory};

    #[test]
    fn table_lists_every_gpu_and_marks_simulated_ones() {
        let s = NodeStatus {
            node: "h1".into(),
            version: "0.1.0".into(),
            uptime_s: 5,
            dev: true,
            url: "http://127.0.0.1:1".into(),
            state_dir: "/tmp/s".into(),
            auth: false,
            inventory: Inventory {
                source: "fake".into(),
                gpus: (0..2)
                    .map(|i| GpuInfo {
                        index: i,
                        uuid: format!("GPU-{i}"),
                        name: "Sim".into(),
                        memory_mib: 1024,
                        simulated: true,
                    })
                    .collect(),
            },
            kernels: 0,
            fenced_gpus: vec![notebookosd::lease::FencedGpu {
                index: 1,
                uuid: "GPU-1".into(),
                holder_pid: 42,
                kernel_id: "k-1".into(),
                reason: "checkpoint_failed".into(),
                fenced_for_s: 3,
            }],
        };
        let t = render(&s);
        let gpu1 = t.lines().find(|l| l.contains("GPU-1")).unwrap_or_default();
        assert!(gpu1.contains("FENCED (checkpoint_failed: memory of kernel k-1 pid 42"), "{t}");
        assert!(!t.lines().any(|l| l.contains("GPU-0") && l.contains("FENCED")), "{t}");
        assert!(t.contains("fenced    1 GPU(s)"), "{t}");
        assert!(t.contains("gpus      2 (fake, SIMULATED"), "{t}");
        assert!(t.contains("GPU-0") && t.contains("GPU-1"), "{t}");
        assert!(t.contains("h1 (dev)"), "{t}");
    }
}
