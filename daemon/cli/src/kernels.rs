//! `nbos kernels`: the kernels of a host, their state and GPUs.

use std::fmt::Write;

use crate::client::{Client, ConnectArgs};
use nbos_sched::host::Snapshot;
use notebookosd::kernel::KernelModel;

/// Options of `nbos kernels`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Fetches and prints the kernels.
pub fn run(target: &ConnectArgs, args: Args) -> anyhow::Result<()> {
    let client = Client::new(target)?;
    let cluster = cluster_view(&client)?;
    let kernels: Vec<KernelModel> = client.get_json("/api/kernels")?;
    let gpus: Snapshot = client.get_json("/api/v1/gpus")?;
    let leases: Vec<serde_json::Value> = client.get_json("/api/v1/leases")?;
    if args.json {
        let mut all = serde_json::json!({ "kernels": kernels, "gpus": gpus, "leases": leases });
        if let Some(rows) = &cluster {
            all["replicas"] = serde_json::to_value(rows)?;
        }
        println!("{}", serde_json::to_string_pretty(&all)?);
    } else {
        print!("{}", render(&kernels));
        if let Some(rows) = &cluster {
            print!("{}", render_replicas(rows));
        }
        print!("{}", render_gpus(&gpus));
        print!("{}", render_leases(&leases));
    }
    Ok(())
}

/// One replica of a cluster kernel, as `nbos kernels` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ReplicaRow {
    /// Kernel id.
    pub kernel_id: String,
    /// Kernelspec name.
    pub name: String,
    /// GPUs per cell.
    pub gpus: u32,
    /// Replica number.
    pub replica: u32,
    /// Host (raft node id).
    pub node_id: u64,
    /// Host name, when the host is up.
    pub host: Option<String>,
    /// `executor` (ran the kernel's last cell), `follower`, `down` (host down), or `?`
    /// (the host did not say).
    pub role: String,
    /// Revisions the replica's namespace is behind its group; `None` when unknown.
    pub lag: Option<u64>,
}

/// What a replica host reports in `GET /api/v1/cluster/replicas` (the fields used here).
#[derive(Debug, serde::Deserialize)]
struct HostedReplica {
    kernel_id: String,
    replica: u32,
    role: String,
    #[serde(default)]
    lag_revisions: Option<u64>,
}

/// In cluster mode, every kernel's replicas with their hosts, roles and lag (asking each
/// live host for its replicas); `None` on a single host.
fn cluster_view(client: &Client) -> anyhow::Result<Option<Vec<ReplicaRow>>> {
    use crate::client::HttpStatus;
    use notebookosd::cluster::control::meta::ClusterStatus;
    use notebookosd::cluster::control::records::KernelRecord;

    let records: Vec<KernelRecord> = match client.get_json("/api/v1/cluster/kernels") {
        Ok(r) => r,
        Err(e) if e.downcast_ref::<HttpStatus>().is_some_and(|s| s.code == 404) => return Ok(None),
        Err(e) => return Err(e),
    };
    let status: ClusterStatus = client.get_json("/api/v1/cluster/status")?;
    let mut hosted: std::collections::HashMap<u64, Option<Vec<HostedReplica>>> = std::collections::HashMap::new();
    for m in &status.members {
        if let Some(h) = &m.host {
            // A host that cannot say (older build, unreachable) shows "?" rather than failing the listing.
            hosted.insert(m.node_id, client.with_url(&h.gateway_url).get_json("/api/v1/cluster/replicas").ok());
        }
    }
    Ok(Some(replica_rows(&records, &status, &hosted)))
}

fn replica_rows(
    records: &[notebookosd::cluster::control::records::KernelRecord],
    status: &notebookosd::cluster::control::meta::ClusterStatus,
    hosted: &std::collections::HashMap<u64, Option<Vec<HostedReplica>>>,
) -> Vec<ReplicaRow> {
    let mut rows = Vec::new();
    for k in records {
        for r in &k.replicas {
            let host = status.members.iter().find(|m| m.node_id == r.node_id).and_then(|m| m.host.as_ref());
            let report = hosted
                .get(&r.node_id)
                .and_then(Option::as_ref)
                .and_then(|v| v.iter().find(|h| h.kernel_id == k.id && h.replica == r.replica));
            let (role, lag) = match (host, report) {
                (None, _) => ("down".to_owned(), None),
                (Some(_), None) => ("?".to_owned(), None),
                (Some(_), Some(h)) => {
                    (if h.role == "executor" { "executor" } else { "follower" }.to_owned(), h.lag_revisions)
                }
            };
            rows.push(ReplicaRow {
                kernel_id: k.id.clone(),
                name: k.name.clone(),
                gpus: k.gpus,
                replica: r.replica,
                node_id: r.node_id,
                host: host.map(|h| h.name.clone()),
                role,
                lag,
            });
        }
    }
    rows
}

/// The replicas table (cluster mode).
pub fn render_replicas(rows: &[ReplicaRow]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\nreplicas  (lag: revisions behind the kernel's group; ? = the host did not report)");
    if rows.is_empty() {
        let _ = writeln!(out, "  none");
        return out;
    }
    let _ = writeln!(
        out,
        "  {:<36}  {:>7}  {:>4}  {:<16}  {:<8}  {:>4}",
        "kernel", "replica", "node", "host", "role", "lag"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "  {:<36}  {:>7}  {:>4}  {:<16}  {:<8}  {:>4}",
            r.kernel_id,
            r.replica,
            r.node_id,
            r.host.as_deref().unwrap_or("-"),
            r.role,
            r.lag.map_or_else(|| "?".to_owned(), |l| l.to_string())
        );
    }
    out
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
        "{:<36}  {:<12}  {:<24}  {:<10}  {:>4}  {:>11}  {:>5}  {:<10}  last activity",
        "id", "owner", "kernelspec", "state", "gpus", "gpu mem/MiB", "conns", "pids"
    );
    for k in kernels {
        let pids = k.pids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        // "-": no limit of the kernel's own (the GPU's memory, or the host's limit).
        let gpu_mem = k.gpu_memory_mib.map_or_else(|| "-".to_owned(), |m| m.to_string());
        // "-": no owner (no [auth] users, or a kernel from before them).
        let owner = k.owner.as_deref().unwrap_or("-");
        let _ = writeln!(
            out,
            "{:<36}  {:<12}  {:<24}  {:<10}  {:>4}  {:>11}  {:>5}  {:<10}  {}",
            k.id, owner, k.name, k.execution_state, k.gpus, gpu_mem, k.connections, pids, k.last_activity
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
            gpu_memory_mib: Some(2048),
            pids: vec![42],
            owner: Some("alice".into()),
        };
        let unlimited = KernelModel { id: "b2".into(), gpu_memory_mib: None, owner: None, ..k.clone() };
        let t = render(&[k, unlimited]);
        assert!(t.lines().count() == 3, "{t}");
        assert!(t.lines().next().is_some_and(|h| h.contains("gpu mem/MiB")), "{t}");
        let row = t.lines().find(|l| l.starts_with("a1")).expect("row a1");
        assert!(row.contains("notebookos-python-1gpu") && row.contains("busy") && row.contains("42"), "{t}");
        assert!(row.contains(" 2048 "), "the kernel's GPU memory limit: {t}");
        assert!(t.lines().next().is_some_and(|h| h.contains("owner")), "{t}");
        assert!(row.contains(" alice "), "the owner: {t}");
        let row = t.lines().find(|l| l.starts_with("b2")).expect("row b2");
        assert!(row.contains(" - "), "no limit of its own: {t}");
        assert_eq!(render(&[]), "no kernels\n");
    }

    #[test]
    fn replicas_show_host_role_and_lag_and_say_when_unknown() {
        use notebookosd::cluster::control::meta::{ClusterStatus, MemberStatus};
        use notebookosd::cluster::control::records::{HostRecord, KernelRecord, ReplicaRecord};
        let member = |id: u64, up: bool| MemberStatus {
            node_id: id,
            role: "voter".into(),
            up,
            host: up.then(|| HostRecord {
                node_id: id,
                name: format!("h{id}"),
                gateway_url: format!("http://127.0.0.1:{}", 9000 + id),
                raft_addr: "127.0.0.1:1".parse().unwrap(),
                gpus: vec![],
                memory_bytes: 0,
                version: "0".into(),
            }),
            load: None,
            draining: false,
        };
        let status = ClusterStatus {
            node_id: 1,
            raft_addr: "127.0.0.1:1".parse().unwrap(),
            gateway_url: "http://127.0.0.1:9001".into(),
            ready: true,
            meta_leader: Some(1),
            term: 1,
            registered: true,
            members: vec![member(1, true), member(2, true), member(3, true), member(4, false)],
            kernels: 1,
            moving: Vec::new(),
        };
        let k = KernelRecord {
            id: "k1".into(),
            name: "python3".into(),
            gpus: 1,
            group: 99,
            replicas: [(1, 1), (2, 2), (3, 4)].map(|(replica, node_id)| ReplicaRecord { replica, node_id }).to_vec(),
            created_ms: 0,
            env: Default::default(),
            moving: None,
            owner: None,
            owner_groups: Vec::new(),
        };
        let row = |replica, role: &str, lag| HostedReplica {
            kernel_id: "k1".into(),
            replica,
            role: role.into(),
            lag_revisions: Some(lag),
        };
        let hosted = std::collections::HashMap::from([
            (1, Some(vec![row(1, "executor", 0)])),
            (2, Some(vec![row(2, "standby", 3)])),
            (3, None),
        ]);
        let rows = replica_rows(&[k], &status, &hosted);
        let roles: Vec<(&str, Option<u64>)> = rows.iter().map(|r| (r.role.as_str(), r.lag)).collect();
        assert_eq!(roles, vec![("executor", Some(0)), ("follower", Some(3)), ("down", None)]);
        let t = render_replicas(&rows);
        assert!(
            t.lines().any(|l| l.contains("k1") && l.contains("h2") && l.contains("follower") && l.ends_with('3')),
            "{t}"
        );
        assert!(t.lines().any(|l| l.contains("down") && l.trim_end().ends_with('?')), "{t}");
        // Host 1 up but silent about the kernel: unknown, not "follower".
        let silent = std::collections::HashMap::from([(1, None)]);
        assert_eq!(replica_rows(&rows_kernel(), &status, &silent)[0].role, "?");
    }

    fn rows_kernel() -> Vec<notebookosd::cluster::control::records::KernelRecord> {
        vec![notebookosd::cluster::control::records::KernelRecord {
            id: "k2".into(),
            name: "python3".into(),
            gpus: 0,
            group: 98,
            replicas: vec![notebookosd::cluster::control::records::ReplicaRecord { replica: 1, node_id: 1 }],
            created_ms: 0,
            env: Default::default(),
            moving: None,
            owner: None,
            owner_groups: Vec::new(),
        }]
    }

    #[test]
    fn gpu_table_names_holders_and_waiting_cells() {
        let s = Snapshot {
            total: 2,
            committed: 1,
            idle_held: 1,
            fenced: 0,
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
