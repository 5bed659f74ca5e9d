//! `nbos objects status|gc`: the cluster's large-object store as its collector sees it, and
//! collecting it now.

use std::fmt::Write;
use std::time::Duration;

use crate::client::{Client, ConnectArgs};
use notebookosd::cluster::cells::object_collector::{GcReport, GC_PATH, OBJECTS_PATH};

/// `nbos objects …`.
#[derive(Debug, clap::Subcommand)]
pub enum ObjectsCmd {
    /// Objects and bytes stored, referenced by replicas, unreferenced (within the grace period
    /// or past it), and referenced but missing.
    Status(StatusArgs),
    /// Delete the unreferenced objects past the grace period now (as the meta leader does
    /// every `cluster.object_gc_interval`); needs the operator token.
    Gc(GcArgs),
}

/// Options of `nbos objects status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Options of `nbos objects gc`.
#[derive(Debug, clap::Args)]
pub struct GcArgs {
    /// Report what would be deleted; delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// A run lists the store and asks every host: longer than the CLI's usual 10 s on a big store.
const GC_CALL_TIMEOUT: Duration = Duration::from_secs(300);

/// Runs a `nbos objects` subcommand.
pub fn run(target: &ConnectArgs, cmd: ObjectsCmd) -> anyhow::Result<()> {
    let client = Client::new(target)?.with_timeout(GC_CALL_TIMEOUT);
    let (report, json): (GcReport, bool) = match cmd {
        ObjectsCmd::Status(a) => (client.get_json(OBJECTS_PATH)?, a.json),
        ObjectsCmd::Gc(a) => {
            let operator = client.as_operator()?;
            (operator.post_json(GC_PATH, &serde_json::json!({ "dry_run": a.dry_run }))?, a.json)
        }
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    if !report.complete {
        anyhow::bail!("not every host answered, so nothing was deleted: {}", report.unanswered.join("; "));
    }
    Ok(())
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 20)
}

/// The report as text.
pub fn render(r: &GcReport) -> String {
    let mut out = String::new();
    let row = |out: &mut String, what: &str, t: notebookosd::cluster::cells::objects::collect::Tally| {
        let _ = writeln!(out, "  {what:<34} {:>8} objects {:>12.1} MiB", t.objects, mib(t.bytes));
    };
    let _ = writeln!(out, "store {} (meta leader: host {}, grace {} s)", r.store, r.node_id, r.grace_s);
    row(&mut out, "stored", r.stored);
    row(&mut out, "referenced by a replica", r.referenced);
    row(&mut out, "unreferenced, within the grace", r.recent);
    row(&mut out, "unreferenced, past the grace", r.collectable);
    if !r.dry_run {
        row(&mut out, "deleted now", r.collected);
    }
    if r.failed_deletes > 0 {
        let _ = writeln!(out, "  failed deletes: {} (retried next run)", r.failed_deletes);
    }
    if r.dangling > 0 {
        let _ = writeln!(out, "  referenced but MISSING from the store: {}", r.dangling);
    }
    let _ = writeln!(out, "  hosts asked: {:?}; took {} ms", r.hosts_asked, r.took_ms);
    out
}
