//! `nbos cluster status|join|leave|remove`: the hosts of a cluster, and adding or removing one.

use std::fmt::Write;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::client::{Client, ConnectArgs, HttpStatus};
use notebookosd::cluster::control::meta::{ClusterStatus, LeaveReport};
use notebookosd::cluster::control::records::KernelRecord;

/// `nbos cluster …`.
#[derive(Debug, clap::Subcommand)]
pub enum ClusterCmd {
    /// Members, which are up, the meta leader, each host's GPUs and load.
    Status(StatusArgs),
    /// Add this host (the daemon at --url, started with [cluster] but not in the seeds) to a
    /// running cluster through one of its members.
    Join(JoinArgs),
    /// Take this host out of the cluster: its kernel replicas move to other hosts, then it
    /// leaves the meta group. Refused when a replica has nowhere to go.
    Leave(LeaveArgs),
    /// Remove another host, one that cannot answer (dead, or its disk full), from the meta
    /// group through the member at --url: no replica is moved first (the cluster re-places
    /// a down host's replicas by itself). A host that answers leaves with `leave`.
    Remove(RemoveArgs),
}

/// Options of `nbos cluster remove`.
#[derive(Debug, clap::Args)]
pub struct RemoveArgs {
    /// The node id of the host to remove (`nbos cluster status`).
    #[arg(value_name = "NODE_ID")]
    pub node_id: u64,
}

/// Options of `nbos cluster status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Options of `nbos cluster join`.
#[derive(Debug, clap::Args)]
pub struct JoinArgs {
    /// URL of any running member of the cluster (same API and operator tokens).
    #[arg(value_name = "MEMBER_URL")]
    pub member: String,
    /// How long to wait for this host to be a registered voter.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// Options of `nbos cluster leave`.
#[derive(Debug, clap::Args)]
pub struct LeaveArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// How long to wait for the replicas' moves to finish before leaving the meta group (a
    /// cell running on a replica ends first).
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Only begin the moves: the host stays a member, draining; run `leave` again to finish.
    #[arg(long)]
    pub no_wait: bool,
}

const STATUS: &str = "/api/v1/cluster/status";

/// Runs a `nbos cluster` subcommand.
pub fn run(target: &ConnectArgs, cmd: ClusterCmd) -> anyhow::Result<()> {
    let client = Client::new(target)?;
    match cmd {
        ClusterCmd::Status(a) => {
            let s = status(&client)?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                print!("{}", render(&s));
            }
            Ok(())
        }
        ClusterCmd::Join(a) => join(&client, &a),
        ClusterCmd::Leave(a) => leave(&client, &a),
        ClusterCmd::Remove(a) => {
            let operator = client.as_operator()?.with_timeout(MEMBERSHIP_CALL_TIMEOUT);
            let membership: serde_json::Value =
                operator.send_json("DELETE", &format!("/api/v1/cluster/members/{}", a.node_id), None)?;
            println!("host {} removed from the cluster (meta voters now {})", a.node_id, membership["voters"]);
            Ok(())
        }
    }
}

/// The cluster status of the daemon at `client`, with a clear error when it is a single host.
fn status(client: &Client) -> anyhow::Result<ClusterStatus> {
    client.get_json(STATUS).map_err(|e| {
        if e.downcast_ref::<HttpStatus>().is_some_and(|s| s.code == 404) {
            anyhow::anyhow!("the daemon at {} is a single host (its [cluster] enabled = false)", client.url)
        } else {
            e
        }
    })
}

/// How long one drain, remove or add call may take: the daemon bounds each itself (a drain
/// may wait a minute for another move of the same kernel; a leader that removes itself hands
/// its leadership off first), well past the CLI's usual 10 s.
const MEMBERSHIP_CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// Drains this host (its replicas move), waits until each move has finished (the new replica
/// caught up and took the old one's place, after the cell running on the old one, if any,
/// ended), then leaves the meta group.
fn leave(client: &Client, args: &LeaveArgs) -> anyhow::Result<()> {
    #[derive(serde::Deserialize)]
    struct Drained {
        node_id: u64,
        moved: Vec<(String, u64)>,
    }
    status(client)?;
    let operator = client.as_operator()?.with_timeout(MEMBERSHIP_CALL_TIMEOUT);
    let drained: Drained = operator.post_json("/api/v1/cluster/leave", &serde_json::json!({ "phase": "drain" }))?;
    for (kernel, to) in &drained.moved {
        if !args.json {
            println!("kernel {kernel}: replica moved to host {to}");
        }
    }
    if args.no_wait {
        println!(
            "host {} is draining; its replicas are moving: run `nbos cluster leave` again to leave",
            drained.node_id
        );
        return Ok(());
    }
    {
        let deadline = Instant::now() + args.timeout;
        let bar = super::progress::bar(args.json, drained.moved.len(), "replicas moved off this host:");
        for (kernel, to) in &drained.moved {
            bar.set_message(format!("kernel {kernel} → host {to}"));
            loop {
                let record: KernelRecord = client.get_json(&format!("/api/v1/cluster/kernels/{kernel}"))?;
                if !record.hosts().contains(&drained.node_id) {
                    break;
                }
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "the replica of kernel {kernel} has not finished moving to host {to} after {}; host {} is still a \
                     member and draining: run `nbos cluster leave` again",
                    humantime::format_duration(args.timeout),
                    drained.node_id
                );
                std::thread::sleep(Duration::from_millis(200));
            }
            bar.inc(1);
        }
        bar.finish_and_clear();
    }
    let mut report: LeaveReport =
        operator.post_json("/api/v1/cluster/leave", &serde_json::json!({ "phase": "remove" }))?;
    report.moved = drained.moved;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "host {} left the cluster (meta voters now {:?}); stop its daemon now",
            report.node_id, report.membership.voters
        );
    }
    Ok(())
}

fn join(client: &Client, args: &JoinArgs) -> anyhow::Result<()> {
    let me = status(client)?;
    if is_member(&me) {
        println!("host {} is already a member of the cluster", me.node_id);
        return Ok(());
    }
    let member = client.with_url(&args.member).as_operator()?.with_timeout(MEMBERSHIP_CALL_TIMEOUT);
    let body = serde_json::json!({ "node_id": me.node_id, "raft_addr": me.raft_addr });
    let m: raft_store::Membership = member
        .post_json("/api/v1/cluster/members", &body)
        .with_context(|| format!("asking {} to add host {}", args.member, me.node_id))?;
    println!("host {} added to the meta group (voters {:?}); waiting for it to register", me.node_id, m.voters);
    let deadline = Instant::now() + args.timeout;
    let spinner = super::progress::bar(false, 0, "catching up with the meta group and registering");
    loop {
        let s = status(client)?;
        spinner.tick();
        if is_member(&s) {
            spinner.finish_and_clear();
            println!(
                "host {} joined: up, meta leader {}",
                s.node_id,
                s.meta_leader.map_or_else(|| "none".to_owned(), |l| l.to_string())
            );
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "host {} was added but did not register within {}: check that the members can reach its raft address {} \
             and it theirs",
            s.node_id,
            humantime::format_duration(args.timeout),
            s.raft_addr
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The host is a voter of the meta group and its heartbeat record is up.
fn is_member(s: &ClusterStatus) -> bool {
    s.registered && s.members.iter().any(|m| m.node_id == s.node_id && m.role == "voter" && m.up)
}

/// The human-readable table.
pub fn render(s: &ClusterStatus) -> String {
    let mut out = String::new();
    let up = s.members.iter().filter(|m| m.up).count();
    let leader = s.meta_leader.map_or_else(|| "none (not ready)".to_owned(), |l| l.to_string());
    let _ = writeln!(out, "cluster   {} of {} host(s) up; meta leader {leader}; term {}", up, s.members.len(), s.term);
    let _ = writeln!(
        out,
        "this host {} ({}), raft {}{}",
        s.node_id,
        s.gateway_url,
        s.raft_addr,
        if s.registered { "" } else { ", NOT registered (no heartbeat lease)" }
    );
    let _ = writeln!(out, "kernels   {}", s.kernels);
    let _ = writeln!(
        out,
        "{:>4}  {:<7}  {:<4}  {:<16}  {:<26}  {:>4}  {:>4}  {:>9}  {:>8}  {:>10}",
        "id", "role", "up", "name", "url", "gpus", "idle", "committed", "replicas", "subscribed"
    );
    for m in &s.members {
        let mark = if Some(m.node_id) == s.meta_leader { "*" } else { "" };
        let (name, url, gpus) = m.host.as_ref().map_or(("-".to_owned(), "-".to_owned(), "-".to_owned()), |h| {
            (h.name.clone(), h.gateway_url.clone(), h.gpus.len().to_string())
        });
        let (idle, committed, replicas, subscribed) =
            m.load.as_ref().map_or(("-".to_owned(), "-".to_owned(), "-".to_owned(), "-".to_owned()), |l| {
                (
                    l.gpus_idle.to_string(),
                    l.gpus_committed.to_string(),
                    l.replicas.to_string(),
                    l.subscribed_gpus.to_string(),
                )
            });
        let _ = writeln!(
            out,
            "{:>4}  {:<7}  {:<4}  {:<16}  {:<26}  {:>4}  {:>4}  {:>9}  {:>8}  {:>10}",
            format!("{}{mark}", m.node_id),
            m.role,
            match (m.up, m.draining) {
                (true, true) => "drain",
                (true, false) => "up",
                (false, _) => "DOWN",
            },
            name,
            url,
            gpus,
            idle,
            committed,
            replicas,
            subscribed
        );
    }
    for mv in &s.moving {
        let m = &mv.moving;
        let _ = writeln!(
            out,
            "moving    kernel {}: replica {} from host {} to host {} as replica {} ({}, since {} ms since the epoch)",
            mv.kernel,
            m.replica,
            m.from,
            m.to,
            m.new_replica,
            m.reason.as_str(),
            m.started_ms
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use notebookosd::cluster::control::meta::{MemberStatus, MovingStatus};
    use notebookosd::cluster::control::records::{GpuRecord, HostRecord, LoadRecord, MoveReason, MoveRecord};

    fn member(id: u64, up: bool) -> MemberStatus {
        MemberStatus {
            node_id: id,
            role: "voter".into(),
            up,
            host: up.then(|| HostRecord {
                node_id: id,
                name: format!("h{id}"),
                gateway_url: format!("http://127.0.0.1:{}", 8880 + id),
                raft_addr: format!("127.0.0.1:{}", 7000 + id).parse().unwrap(),
                gpus: vec![GpuRecord { uuid: "GPU-0".into(), model: "Sim".into(), memory_bytes: 1 << 30 }],
                memory_bytes: 1 << 34,
                version: "0.1.0".into(),
            }),
            load: up.then_some(LoadRecord {
                node_id: id,
                gpus_total: 1,
                gpus_committed: 1,
                gpus_idle: 0,
                replicas: 2,
                subscribed_gpus: 3,
                ..LoadRecord::default()
            }),
            draining: id == 4,
        }
    }

    #[test]
    fn table_marks_the_leader_and_down_hosts() {
        let s = ClusterStatus {
            node_id: 1,
            raft_addr: "127.0.0.1:7001".parse().unwrap(),
            gateway_url: "http://127.0.0.1:8881".into(),
            ready: true,
            meta_leader: Some(2),
            term: 4,
            registered: true,
            members: vec![member(1, true), member(2, true), member(3, false), member(4, true)],
            kernels: 5,
            moving: vec![MovingStatus {
                kernel: "k1".into(),
                moving: MoveRecord {
                    replica: 2,
                    from: 4,
                    to: 1,
                    new_replica: 4,
                    reason: MoveReason::Drain,
                    started_ms: 7,
                },
            }],
        };
        let t = render(&s);
        let row4 = t.lines().find(|l| l.trim_start().starts_with("4 ")).expect("draining row");
        assert!(row4.contains("drain"), "{t}");
        assert!(t.contains("moving    kernel k1: replica 2 from host 4 to host 1 as replica 4 (drain"), "{t}");
        assert!(t.contains("3 of 4 host(s) up; meta leader 2; term 4"), "{t}");
        let row2 = t.lines().find(|l| l.trim_start().starts_with("2*")).expect("leader row");
        assert!(row2.contains("up") && row2.contains("h2") && row2.contains("http://127.0.0.1:8882"), "{t}");
        let row3 = t.lines().find(|l| l.trim_start().starts_with("3 ")).expect("down row");
        assert!(row3.contains("DOWN"), "{t}");
        assert!(is_member(&s));
        let lonely = ClusterStatus { meta_leader: None, registered: false, ..s };
        assert!(render(&lonely).contains("meta leader none (not ready)"));
        assert!(!is_member(&lonely));
    }
}
