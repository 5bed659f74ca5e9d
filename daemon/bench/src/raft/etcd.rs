//! etcd side by side (`nbos bench raft --etcd`): a local etcd cluster of the same size, its
//! leader found over gRPC, and the same write load as ours through its native client.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use super::load::{drive, free_addr, Phase};

pub(super) struct Etcd {
    children: Vec<Child>,
    urls: Vec<String>,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub(super) fn start_etcd(bin: &Path, dir: &Path, n: u64) -> anyhow::Result<Etcd> {
    let ports: Vec<(SocketAddr, SocketAddr)> =
        (0..n).map(|_| Ok((free_addr()?, free_addr()?))).collect::<anyhow::Result<_>>()?;
    let initial: Vec<String> = ports.iter().enumerate().map(|(i, (_, p))| format!("e{i}=http://{p}")).collect();
    let mut etcd = Etcd { children: Vec::new(), urls: Vec::new() };
    for (i, (c, p)) in ports.iter().enumerate() {
        let log = std::fs::File::create(dir.join(format!("etcd-{i}.log")))?;
        // Default durability: etcd fsyncs its WAL before acknowledging (no --unsafe-no-fsync).
        let child = Command::new(bin)
            .arg(format!("--name=e{i}"))
            .arg(format!("--data-dir={}", dir.join(format!("etcd-{i}")).display()))
            .arg(format!("--listen-client-urls=http://{c}"))
            .arg(format!("--advertise-client-urls=http://{c}"))
            .arg(format!("--listen-peer-urls=http://{p}"))
            .arg(format!("--initial-advertise-peer-urls=http://{p}"))
            .arg(format!("--initial-cluster={}", initial.join(",")))
            .arg("--initial-cluster-state=new")
            .arg("--initial-cluster-token=nbos-bench")
            .arg("--logger=zap")
            .arg("--log-level=error")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("start {}", bin.display()))?;
        etcd.children.push(child);
        etcd.urls.push(format!("http://{c}"));
    }
    Ok(etcd)
}

/// The client URL of etcd's leader, asked over gRPC (`Maintenance.Status`) until every member
/// answers and one of them is the leader they name.
pub(super) async fn etcd_leader(etcd: &Etcd, dir: &Path) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let options = || Some(etcd_client::ConnectOptions::new().with_connect_timeout(Duration::from_secs(1)));
    loop {
        let mut leader = None;
        let mut answered = 0;
        for url in &etcd.urls {
            let Ok(mut client) = etcd_client::Client::connect([url.as_str()], options()).await else { continue };
            let Ok(Ok(status)) = tokio::time::timeout(Duration::from_secs(1), client.status()).await else { continue };
            answered += 1;
            if status.leader() != 0 && status.header().is_some_and(|h| h.member_id() == status.leader()) {
                leader = Some(url.clone());
            }
        }
        if let (Some(url), true) = (&leader, answered == etcd.urls.len()) {
            return Ok(url.clone());
        }
        if Instant::now() > deadline {
            bail!("etcd: no leader among {:?} within 30 s; see the etcd-*.log files in {}", etcd.urls, dir.display());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `clients` gRPC clients, each with its own connection to the leader and one put outstanding.
pub(super) async fn etcd_load(leader: &str, clients: usize, time: Duration, value: &str) -> anyhow::Result<Phase> {
    // Connected before the clock starts, as ours are at their first call (a TCP connect).
    let mut conns = Vec::with_capacity(clients);
    for _ in 0..clients {
        let options = etcd_client::ConnectOptions::new().with_timeout(Duration::from_secs(5));
        conns.push(etcd_client::Client::connect([leader], Some(options)).await.context("connect to etcd over gRPC")?);
    }
    let conns = std::sync::Mutex::new(conns);
    let value = value.to_owned();
    Ok(drive(clients, move |c| {
        let client = conns.lock().ok().and_then(|mut v| v.pop());
        let value = value.clone();
        async move {
            let mut lat = Vec::new();
            let Some(mut client) = client else { return lat };
            let end = Instant::now() + time;
            let mut i = 0u64;
            while Instant::now() < end {
                i += 1;
                let t = Instant::now();
                if client.put(format!("bench/{c}/{i}"), value.as_str(), None).await.is_ok() {
                    lat.push(t.elapsed().as_secs_f64() * 1e3);
                }
            }
            lat
        }
    })
    .await)
}
