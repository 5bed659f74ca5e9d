//! The one loopback-cluster launcher: N real `notebookosd` processes on 127.0.0.1 from a
//! [`Layout`] (own state and runtime directories, raft and HTTP ports, simulated GPUs,
//! per-run log files; one API token, one operator token, one object-store directory).
//!
//! Hosts `1..=seeds` found the cluster (`cluster.seeds`); [`TestCluster::add_host`] starts
//! a host outside the seeds, which joins with `nbos cluster join`. Each daemon runs in its
//! own process group, so [`TestCluster::kill`] takes its kernel processes down with it,
//! like a host that loses power. The tests use the panicking calls (`start`, `restart`,
//! `wait_ready`); the benches use [`TestCluster::launch`] and the `try_`/`anyhow` calls.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;

use crate::config::DaemonConfig;
use crate::daemon::read_endpoint;
use crate::http::request;
use crate::layout::{HostLayout, Layout, Options};
use crate::wait::{self, wait_for};
use crate::{bins, signal};

/// How long a stopped daemon has to exit before its process group is killed.
const STOP_GRACE: Duration = Duration::from_secs(20);

/// One host (running or stopped).
pub struct Host {
    pub node_id: u64,
    pub raft_addr: std::net::SocketAddr,
    pub dir: PathBuf,
    /// Its config file.
    pub config: PathBuf,
    /// Base URL of the HTTP API of the running daemon (changes across restarts unless the
    /// ports are fixed).
    pub url: String,
    /// How many times the daemon was started (log file `daemon-{starts}.log`).
    pub starts: u32,
    child: Option<Child>,
}

impl Host {
    /// The log file of the current (or last) run.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join(format!("daemon-{}.log", self.starts))
    }

    /// The log of the current (or last) run.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The daemon's process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }
}

/// A cluster of daemon processes, stopped (SIGTERM, then SIGKILL) on drop.
pub struct TestCluster {
    pub hosts: Vec<Host>,
    layout: Layout,
    /// HTTP agent of the test's own requests (trusts the test CA with TLS).
    agent: ureq::Agent,
    daemon: PathBuf,
    dir: Option<tempfile::TempDir>,
}

impl TestCluster {
    /// Starts `seeds` hosts (node ids `1..=seeds`, all founding voters) and waits until each
    /// serves HTTP (not until the cluster is ready: see [`TestCluster::wait_ready`]).
    pub fn start(seeds: u64, options: Options) -> TestCluster {
        let mut c = Self::create(seeds, options);
        c.start_all().expect("start the hosts");
        c
    }

    /// Like [`TestCluster::start`], with the cluster's PKI (mutual TLS on the raft
    /// transport, HTTPS with client certificates).
    pub fn start_tls(seeds: u64, options: Options) -> TestCluster {
        Self::start(seeds, Options { tls: true, ..options })
    }

    /// Configures `seeds` founding hosts without starting any ([`TestCluster::restart`] starts one).
    pub fn create(seeds: u64, options: Options) -> TestCluster {
        Self::try_create(seeds, options).expect("lay out the cluster")
    }

    /// Like [`TestCluster::create`], with the cluster's PKI ([`TestCluster::start_tls`]).
    pub fn create_tls(seeds: u64, options: Options) -> TestCluster {
        Self::create(seeds, Options { tls: true, ..options })
    }

    /// Starts `hosts` founding hosts and waits (up to 60 s) until every host sees every
    /// host up and the cluster ready (standalone hosts: until each answers `/healthz`).
    pub fn launch(hosts: u64, options: Options) -> anyhow::Result<TestCluster> {
        let standalone = options.standalone;
        let mut c = Self::try_create(hosts, options)?;
        c.start_all()?;
        if standalone {
            c.wait_healthy(Duration::from_secs(60))?;
        } else {
            c.wait_all_ready(Duration::from_secs(60))?;
        }
        Ok(c)
    }

    /// Lays out `seeds` founding hosts in a new temporary directory; starts none.
    pub fn try_create(seeds: u64, options: Options) -> anyhow::Result<TestCluster> {
        let dir = tempfile::Builder::new().prefix("nbos-cluster-").tempdir()?;
        let daemon = options.daemon.clone().unwrap_or_else(bins::notebookosd);
        anyhow::ensure!(daemon.exists(), "{} does not exist", daemon.display());
        let layout = Layout::prepare(dir.path(), seeds, seeds, options)?;
        let mut agent = ureq::AgentBuilder::new();
        if let Some(ca) = &layout.ca_cert {
            agent = agent.tls_config(notebookosd::link::tls::client_config(ca, None)?);
        }
        let mut c = TestCluster { hosts: Vec::new(), layout, agent: agent.build(), daemon, dir: Some(dir) };
        let laid_out: Vec<HostLayout> = c.layout.hosts.clone();
        for h in &laid_out {
            c.push_host(h);
        }
        Ok(c)
    }

    fn push_host(&mut self, h: &HostLayout) {
        self.hosts.push(Host {
            node_id: h.node_id,
            raft_addr: h.raft_addr,
            dir: h.dir.clone(),
            config: h.config_path.clone(),
            url: h.url.clone().unwrap_or_default(),
            starts: 0,
            child: None,
        });
    }

    fn start_all(&mut self) -> anyhow::Result<()> {
        let ids: Vec<u64> = self.hosts.iter().map(|h| h.node_id).collect();
        for &id in &ids {
            self.spawn(id)?;
        }
        for &id in &ids {
            self.wait_http(id)?;
        }
        Ok(())
    }

    /// The layout the hosts were configured from (tokens, PKI, configs).
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The options the hosts were configured with.
    pub fn options(&self) -> &Options {
        self.layout.options()
    }

    /// The seeds as every host's config lists them (`"id=addr"`).
    pub fn seed_list(&self) -> &[String] {
        &self.layout.seeds
    }

    /// The API token.
    pub fn token(&self) -> &str {
        &self.layout.token
    }

    /// The file holding the API token.
    pub fn token_file(&self) -> &Path {
        &self.layout.token_file
    }

    /// Starts one more host outside the seeds (next node id); it serves HTTP but is not a
    /// member until `nbos cluster join`. Returns its node id.
    pub fn add_host(&mut self) -> u64 {
        let id = self.layout.add_host().expect("lay out a host");
        let h = self.layout.hosts[self.hosts.len()].clone();
        self.push_host(&h);
        self.spawn(id).expect("spawn");
        self.wait_http(id).expect("serve HTTP");
        id
    }

    /// Rewrites host `node_id`'s config after `edit` changed it (from its next start on).
    pub fn reconfigure(&mut self, node_id: u64, edit: impl FnOnce(&mut DaemonConfig)) {
        self.layout.reconfigure(node_id, edit).expect("reconfigure");
    }

    pub fn host(&self, node_id: u64) -> &Host {
        &self.hosts[index(node_id)]
    }

    fn host_mut(&mut self, node_id: u64) -> &mut Host {
        &mut self.hosts[index(node_id)]
    }

    /// Starts host `node_id`'s daemon without waiting for it (see [`TestCluster::restart`]).
    pub fn spawn(&mut self, node_id: u64) -> anyhow::Result<()> {
        use std::os::unix::process::CommandExt;
        let o = self.layout.options();
        let (env, log_env) = (o.env.clone(), o.log_env.clone());
        let daemon = self.daemon.clone();
        let h = self.host_mut(node_id);
        anyhow::ensure!(h.child.is_none(), "host {node_id} is already running");
        // A stale endpoint file (after kill -9) must not be mistaken for the new daemon's.
        let _ = std::fs::remove_file(h.dir.join("run/endpoint.json"));
        h.starts += 1;
        let log = std::fs::File::create(h.log_path()).context("log file")?;
        let mut command = Command::new(&daemon);
        command.arg("--config").arg(&h.config);
        if let Some(level) = log_env {
            command.env("NBOS_LOG", level);
        }
        // Its own process group: `kill` takes its kernel processes down with it.
        let child = command
            .envs(env)
            .stdout(Stdio::null())
            .stderr(log)
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {}", daemon.display()))?;
        h.child = Some(child);
        Ok(())
    }

    /// Waits (30 s) until host `node_id` serves HTTP; its URL from its endpoint file.
    fn wait_http(&mut self, node_id: u64) -> anyhow::Result<()> {
        let endpoint = self.host(node_id).dir.join("run/endpoint.json");
        let served = wait::poll(Duration::from_secs(30), || {
            let exited = self.host_mut(node_id).child.as_mut().and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                return Some(Err(anyhow::anyhow!(
                    "host {node_id} exited at start ({status}):\n{}",
                    self.host(node_id).log()
                )));
            }
            read_endpoint(&endpoint).map(Ok)
        });
        let url = served.unwrap_or_else(|| Err(anyhow::anyhow!("host {node_id} did not serve HTTP within 30 s")))?;
        self.host_mut(node_id).url = url;
        Ok(())
    }

    /// `kill -9` of the daemon and everything in its process group (its kernels).
    pub fn kill(&mut self, node_id: u64) {
        if let Some(mut child) = self.host_mut(node_id).child.take() {
            signal::kill_group(&child);
            let _ = child.wait();
        }
    }

    /// Pids of the kernel processes a host started (found by their connection files, or
    /// the pre-warm launcher, which live under the host's directory), running or orphaned.
    pub fn kernel_pids(&self, node_id: u64) -> Vec<i32> {
        let dir = self.host(node_id).dir.display().to_string();
        let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
        entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let cmd = String::from_utf8_lossy(&cmd);
                (cmd.contains("ipykernel_launcher") || cmd.contains(".prewarm.py")) && cmd.contains(&dir)
            })
            .collect()
    }

    /// Waits up to `within` for a host's daemon to exit by itself; its exit status, or
    /// `None` if it still runs.
    pub fn wait_exit(&mut self, node_id: u64, within: Duration) -> Option<std::process::ExitStatus> {
        self.host(node_id).child.as_ref()?;
        let h = self.host_mut(node_id);
        let status = wait::poll(within, || h.child.as_mut().and_then(|c| c.try_wait().expect("try_wait")))?;
        h.child = None;
        Some(status)
    }

    /// SIGTERM (graceful stop: the host's lease is revoked, its kernels are stopped).
    pub fn stop(&mut self, node_id: u64) {
        if let Some(mut child) = self.host_mut(node_id).child.take() {
            signal::terminate(&mut child, STOP_GRACE);
        }
    }

    /// Starts a stopped (or never started) host with its state directory and configuration,
    /// and waits until it serves HTTP.
    pub fn restart(&mut self, node_id: u64) {
        self.try_restart(node_id).expect("restart");
    }

    /// [`TestCluster::restart`], failing instead of panicking.
    pub fn try_restart(&mut self, node_id: u64) -> anyhow::Result<()> {
        self.spawn(node_id)?;
        self.wait_http(node_id)
    }

    /// `GET path` on a host with the cluster token; status and JSON body (`Null` if none).
    pub fn get(&self, node_id: u64, path: &str) -> (u16, serde_json::Value) {
        request(&self.agent, "GET", &self.host(node_id).url, path, None, self.token())
    }

    /// `POST path` with a JSON body on a host.
    pub fn post(&self, node_id: u64, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
        request(&self.agent, "POST", &self.host(node_id).url, path, Some(body), self.token())
    }

    /// `POST path` with a JSON body on a host, with the operator token.
    pub fn post_as_operator(&self, node_id: u64, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
        request(&self.agent, "POST", &self.host(node_id).url, path, Some(body), &self.layout.operator_token)
    }

    /// `DELETE path` on a host.
    pub fn delete(&self, node_id: u64, path: &str) -> (u16, serde_json::Value) {
        request(&self.agent, "DELETE", &self.host(node_id).url, path, None, self.token())
    }

    /// `GET path` on a host as JSON, `None` unless it answered 2xx.
    pub fn get_json(&self, node_id: u64, path: &str) -> Option<serde_json::Value> {
        let (code, v) = self.get(node_id, path);
        (200..300).contains(&code).then_some(v)
    }

    /// The value of `series` (name and labels, as exposed) on a host's `/metrics`.
    pub fn metric(&self, node_id: u64, series: &str) -> Option<f64> {
        let url = format!("{}/metrics", self.host(node_id).url);
        let text = self.agent.get(&url).timeout(Duration::from_secs(10)).call().ok()?.into_string().ok()?;
        text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// A gateway client for a host (trusting the test CA with TLS).
    pub fn client(&self, node_id: u64) -> anyhow::Result<notebookosd::link::client::GatewayClient> {
        let g = notebookosd::link::client::GatewayClient::new(&self.host(node_id).url, Some(self.token().to_owned()));
        Ok(match &self.layout.ca_cert {
            Some(ca) => g.with_tls(notebookosd::link::tls::client_config(ca, None)?),
            None => g,
        })
    }

    /// The test's HTTP agent (trusts the test CA in a TLS cluster).
    pub fn agent(&self) -> &ureq::Agent {
        &self.agent
    }

    /// The host's `/api/v1/cluster/status`, or `None` if it did not answer 200.
    pub fn status(&self, node_id: u64) -> Option<serde_json::Value> {
        let (code, v) = self.get(node_id, "/api/v1/cluster/status");
        (code == 200).then_some(v)
    }

    /// Node ids that `node_id` sees up.
    pub fn up_seen_by(&self, node_id: u64) -> Vec<u64> {
        let Some(s) = self.status(node_id) else { return Vec::new() };
        s["members"]
            .as_array()
            .map(|m| m.iter().filter(|m| m["up"] == true).filter_map(|m| m["node_id"].as_u64()).collect())
            .unwrap_or_default()
    }

    fn running(&self) -> Vec<u64> {
        self.hosts.iter().filter(|h| h.running()).map(|h| h.node_id).collect()
    }

    /// Waits until every running host sees exactly `expected` up and a meta leader.
    pub fn wait_ready(&self, expected: &[u64], within: Duration) {
        let running = self.running();
        wait_for(within, &format!("hosts {running:?} to see {expected:?} up with a leader"), || {
            running
                .iter()
                .all(|&id| {
                    self.status(id).is_some_and(|s| s["meta_leader"].is_u64()) && self.up_seen_by(id) == expected
                })
                .then_some(())
        });
    }

    /// Waits until every running host reports the cluster `ready` with every running host up.
    pub fn wait_all_ready(&self, within: Duration) -> anyhow::Result<()> {
        let running = self.running();
        self.poll(within, "the cluster was not ready", || {
            running.iter().all(|&id| {
                self.status(id).is_some_and(|s| s["ready"] == true)
                    && running.iter().all(|n| self.up_seen_by(id).contains(n))
            })
        })
    }

    /// Waits until every running host answers `/healthz` (standalone hosts).
    pub fn wait_healthy(&self, within: Duration) -> anyhow::Result<()> {
        self.poll(within, "the hosts did not start", || {
            self.hosts
                .iter()
                .filter(|h| h.running())
                .all(|h| self.agent.get(&format!("{}/healthz", h.url)).timeout(Duration::from_secs(5)).call().is_ok())
        })
    }

    fn poll(&self, within: Duration, failure: &str, mut done: impl FnMut() -> bool) -> anyhow::Result<()> {
        wait::poll(within, || done().then_some(()))
            .ok_or_else(|| anyhow::anyhow!("{failure} within {within:?}\n{}", self.logs()))
    }

    /// Waits (up to `within`) until the replica of `kernel` on every running host applied
    /// revision `rev` and follows its group (no `broken`); returns their namespace digests.
    pub fn digests_after(&self, kernel: &str, rev: u64, within: Duration) -> std::collections::BTreeMap<u64, String> {
        let running = self.running();
        wait_for(within, &format!("replicas of {kernel} on {running:?} to apply revision {rev}"), || {
            running
                .iter()
                .all(|&h| {
                    let (code, v) = self.get(h, "/api/v1/cluster/replicas");
                    code == 200
                        && v.as_array().into_iter().flatten().any(|r| {
                            r["kernel_id"] == kernel
                                && r["applied_revision"].as_u64().is_some_and(|a| a >= rev)
                                && r.get("broken").is_none()
                        })
                })
                .then_some(())
        });
        running
            .iter()
            .map(|&h| {
                let (code, v) = self.get(h, &format!("/api/v1/cluster/kernels/{kernel}/digest"));
                assert_eq!(code, 200, "digest on host {h}: {v}");
                (h, v["digest"].as_str().expect("digest").to_owned())
            })
            .collect()
    }

    /// Runs `nbos` against a host; returns (success, stdout, stderr).
    pub fn nbos(&self, node_id: u64, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(bins::nbos())
            .arg("--url")
            .arg(&self.host(node_id).url)
            // Secrets through the environment: argv is readable by every local user.
            .env("NBOS_TOKEN", self.token())
            .env("NBOS_OPERATOR_TOKEN", &self.layout.operator_token)
            .args(self.layout_ca_args())
            .args(args)
            .output()
            .expect("run nbos");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `--ca-cert CA` for `nbos` when the cluster speaks TLS, else nothing.
    pub fn layout_ca_args(&self) -> Vec<PathBuf> {
        self.layout.ca_cert.iter().flat_map(|ca| [PathBuf::from("--ca-cert"), ca.clone()]).collect()
    }

    /// The directory shared by the hosts (tokens, object store, PKI).
    pub fn dir(&self) -> &Path {
        &self.layout.dir
    }

    /// The last lines of every host's current log, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for h in &self.hosts {
            let log = h.log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            out.push_str(&format!("----- host {} (run {}) -----\n", h.node_id, h.starts));
            for l in tail.iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
        for h in &mut self.hosts {
            if let Some(mut c) = h.child.take() {
                signal::terminate(&mut c, STOP_GRACE);
            }
        }
        if self.layout.options().keep {
            if let Some(d) = self.dir.take() {
                eprintln!("nbos: the hosts' directories are kept in {}", d.keep().display());
            }
        }
    }
}

fn index(node_id: u64) -> usize {
    usize::try_from(node_id.saturating_sub(1)).unwrap_or(usize::MAX)
}
