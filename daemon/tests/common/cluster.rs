//! N real `notebookosd` processes on loopback forming a cluster: each with its own state
//! and runtime directories, HTTP port (picked by the daemon), raft port, simulated GPUs
//! and log file; one shared API token and one shared object-store directory.
//!
//! Use from a test file with `#[path = "common/cluster.rs"] mod cluster;`.
//! Hosts `1..=seeds` found the cluster (`cluster.seeds`); [`TestCluster::add_host`] starts
//! a host outside the seeds, which joins with `nbos cluster join`. Each daemon runs in its
//! own process group, so [`TestCluster::kill`] takes its kernel processes down with it,
//! like a host that loses power.

#![allow(dead_code, reason = "each test binary uses a different part of the harness")]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "workspace.rs"]
mod workspace;
pub use workspace::{repo, NBOS, NOTEBOOKOSD};
/// The API token every host shares.
pub const TOKEN: &str = "cluster-test-token-0123456789abcdef";
/// The operator token every host shares (membership, drain, re-placement).
pub const OPERATOR_TOKEN: &str = "cluster-test-operator-token-fedcba9876543210";

/// How the hosts are configured.
#[derive(Debug, Clone)]
pub struct Options {
    /// Simulated GPUs per host (0: none).
    pub fake_gpus: u32,
    /// `cluster.host_ttl`.
    pub host_ttl: String,
    /// More TOML appended to every host's config (keys of `[cluster]`, or whole sections).
    pub extra_toml: String,
    /// `gpu.subscription_ratio`.
    pub subscription_ratio: f64,
    /// `cluster.object_store` (default: a directory of the test's, `file://…/objects`).
    pub object_store: Option<String>,
    /// More environment for every daemon (an S3 store's `AWS_*`).
    pub env: Vec<(String, String)>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            fake_gpus: 1,
            host_ttl: "1s".to_owned(),
            extra_toml: String::new(),
            subscription_ratio: 3.0,
            object_store: None,
            env: Vec::new(),
        }
    }
}

/// One host (running or stopped).
pub struct Host {
    pub node_id: u64,
    pub raft_addr: SocketAddr,
    pub dir: PathBuf,
    pub config: PathBuf,
    /// Base URL of the HTTP API of the running daemon (changes across restarts).
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

/// A cluster of daemon processes.
pub struct TestCluster {
    pub hosts: Vec<Host>,
    pub options: Options,
    /// A test PKI (`pki/`, node ids 1..=8): mutual TLS on the raft transport, HTTPS with
    /// client certificates, node certificates on host-to-host calls; else plaintext.
    tls: bool,
    /// HTTP agent of the test's own requests (trusts the test CA when `tls`).
    agent: ureq::Agent,
    seeds: Vec<String>,
    dir: tempfile::TempDir,
}

impl TestCluster {
    /// Starts `seeds` hosts (node ids `1..=seeds`, all founding voters) and waits until each
    /// serves HTTP (not until the cluster is ready: see [`TestCluster::wait_ready`]).
    pub fn start(seeds: u64, options: Options) -> TestCluster {
        let mut c = Self::create(seeds, options);
        for id in 1..=seeds {
            c.spawn(id);
        }
        for id in 1..=seeds {
            c.wait_http(id);
        }
        c
    }

    /// Like [`TestCluster::start`], with mutual TLS on the raft transport (`cluster.tls`).
    pub fn start_tls(seeds: u64, options: Options) -> TestCluster {
        let mut c = Self::configure(seeds, options, true);
        for id in 1..=seeds {
            c.spawn(id);
        }
        for id in 1..=seeds {
            c.wait_http(id);
        }
        c
    }

    /// Configures `seeds` founding hosts without starting any ([`TestCluster::restart`] starts one).
    pub fn create(seeds: u64, options: Options) -> TestCluster {
        Self::configure(seeds, options, false)
    }

    /// Like [`TestCluster::create`], with the cluster's PKI ([`TestCluster::start_tls`]).
    pub fn create_tls(seeds: u64, options: Options) -> TestCluster {
        Self::configure(seeds, options, true)
    }

    /// The seeds as every host's config lists them (`"id=addr"`).
    pub fn seed_list(&self) -> &[String] {
        &self.seeds
    }

    fn configure(seeds: u64, options: Options, tls: bool) -> TestCluster {
        let dir = tempfile::tempdir().expect("tempdir");
        // Kernels run as another uid (kernel.user): they pass through (0711), never list.
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o711)).expect("chmod");
        std::fs::write(dir.path().join("token"), format!("{TOKEN}\n")).expect("token");
        std::fs::write(dir.path().join("operator-token"), format!("{OPERATOR_TOKEN}\n")).expect("operator token");
        std::fs::create_dir_all(dir.path().join("objects")).expect("objects dir");
        let mut agent = ureq::AgentBuilder::new();
        if tls {
            let pki = notebookosd::pki::Pki::at(&dir.path().join("pki"));
            pki.init().expect("pki");
            for id in 1..=8 {
                pki.issue_node(id, &[], &["127.0.0.1".parse().expect("ip")]).expect("node cert");
            }
            agent = agent.tls_config(notebookosd::link::tls::client_config(&pki.ca_cert(), None).expect("tls"));
        }
        let addrs: Vec<SocketAddr> =
            (0..seeds).map(|_| raft_store::service::free_loopback_addr().expect("free port")).collect();
        let seed_list = addrs.iter().zip(1u64..).map(|(a, id)| format!("{id}={a}")).collect();
        let mut c = TestCluster { hosts: Vec::new(), options, tls, agent: agent.build(), seeds: seed_list, dir };
        for (addr, id) in addrs.into_iter().zip(1u64..) {
            c.create_host(id, addr);
        }
        c
    }

    /// Starts one more host outside the seeds (next node id); it serves HTTP but is not a
    /// member until `nbos cluster join`. Returns its node id.
    pub fn add_host(&mut self) -> u64 {
        let id = self.hosts.len() as u64 + 1;
        let addr = raft_store::service::free_loopback_addr().expect("free port");
        self.create_host(id, addr);
        self.spawn(id);
        self.wait_http(id);
        id
    }

    fn create_host(&mut self, node_id: u64, raft_addr: SocketAddr) {
        let dir = self.dir.path().join(format!("host{node_id}"));
        std::fs::create_dir_all(&dir).expect("host dir");
        let config = dir.join("notebookosd.toml");
        let python = repo().join(".venv/bin/python");
        let gpu = if self.options.fake_gpus > 0 {
            format!(
                "[gpu]\ndriver = \"fake\"\nfake_gpus = {}\nsubscription_ratio = {:?}\n[observer]\nmode = \"procfs\"\n",
                self.options.fake_gpus, self.options.subscription_ratio
            )
        } else {
            format!("[gpu]\ndriver = \"none\"\nsubscription_ratio = {:?}\n", self.options.subscription_ratio)
        };
        let seeds = self.seeds.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", ");
        let (tls, http_tls) = if self.tls {
            let files = raft_store::NodeTlsFiles::in_dir(&self.dir.path().join("pki"), node_id);
            (
                format!("tls = {{ ca_cert = {:?}, cert = {:?}, key = {:?} }}\n", files.ca_cert, files.cert, files.key),
                format!(
                    "tls = {{ cert = {:?}, key = {:?}, client_ca = {:?} }}\n",
                    files.cert, files.key, files.ca_cert
                ),
            )
        } else {
            (String::new(), String::new())
        };
        let text = format!(
            "[node]\nname = \"host{node_id}\"\nstate_dir = {state:?}\nruntime_dir = {run:?}\n\
             [http]\nlisten = \"127.0.0.1:0\"\ntoken_file = {token:?}\noperator_token_file = {operator:?}\n{http_tls}\
             {gpu}[kernel]\npython = {python:?}\n\
             [cluster]\nenabled = true\nnode_id = {node_id}\nraft_listen = \"{raft_addr}\"\nseeds = [{seeds}]\n\
             host_ttl = \"{ttl}\"\nobject_store = {objects:?}\n{tls}{extra}",
            state = dir.join("state"),
            run = dir.join("run"),
            token = self.dir.path().join("token"),
            operator = self.dir.path().join("operator-token"),
            ttl = self.options.host_ttl,
            objects = self
                .options
                .object_store
                .clone()
                .unwrap_or_else(|| format!("file://{}", self.dir.path().join("objects").display())),
            extra = self.options.extra_toml,
        );
        std::fs::write(&config, text).expect("config");
        self.hosts.push(Host { node_id, raft_addr, dir, config, url: String::new(), starts: 0, child: None });
    }

    pub fn host(&self, node_id: u64) -> &Host {
        &self.hosts[usize::try_from(node_id - 1).expect("id")]
    }

    fn host_mut(&mut self, node_id: u64) -> &mut Host {
        &mut self.hosts[usize::try_from(node_id - 1).expect("id")]
    }

    fn spawn(&mut self, node_id: u64) {
        use std::os::unix::process::CommandExt;
        let env = self.options.env.clone();
        let h = self.host_mut(node_id);
        assert!(h.child.is_none(), "host {node_id} is already running");
        // A stale endpoint file (after kill -9) must not be mistaken for the new daemon's.
        let _ = std::fs::remove_file(h.dir.join("run/endpoint.json"));
        h.starts += 1;
        let log = std::fs::File::create(h.log_path()).expect("log file");
        let child = Command::new(*NOTEBOOKOSD)
            .arg("--config")
            .arg(&h.config)
            .env("NBOS_LOG", "info,raft=warn,raft_store=info")
            .envs(env)
            .stdout(Stdio::null())
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("spawn notebookosd");
        h.child = Some(child);
    }

    fn wait_http(&mut self, node_id: u64) {
        let endpoint = self.host(node_id).dir.join("run/endpoint.json");
        let url = wait_for(Duration::from_secs(30), &format!("host {node_id} to serve HTTP"), || {
            if let Some(c) = self.host_mut(node_id).child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    panic!("host {node_id} exited at start ({status}):\n{}", self.host(node_id).log());
                }
            }
            let text = std::fs::read_to_string(&endpoint).ok()?;
            let v: serde_json::Value = serde_json::from_str(&text).ok()?;
            v.get("url").and_then(|u| u.as_str()).map(str::to_owned)
        });
        self.host_mut(node_id).url = url;
    }

    /// `kill -9` of the daemon and everything in its process group (its kernels).
    pub fn kill(&mut self, node_id: u64) {
        let h = self.host_mut(node_id);
        let mut child = h.child.take().expect("host is running");
        let pgid = libc::pid_t::try_from(child.id()).expect("pid");
        // SAFETY: killpg(2) on the process group our own child leads (process_group(0)).
        unsafe { libc::killpg(pgid, libc::SIGKILL) };
        let _ = child.wait();
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
    #[allow(dead_code)] // used by some test crates only
    pub fn wait_exit(&mut self, node_id: u64, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let h = self.host_mut(node_id);
            let status = h.child.as_mut()?.try_wait().expect("try_wait");
            if let Some(status) = status {
                h.child = None;
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM (graceful stop: the host's lease is revoked, its kernels are stopped).
    pub fn stop(&mut self, node_id: u64) {
        let h = self.host_mut(node_id);
        if let Some(mut child) = h.child.take() {
            terminate(&mut child);
        }
    }

    /// Starts a stopped (or never started) host with its state directory and configuration.
    pub fn restart(&mut self, node_id: u64) {
        self.spawn(node_id);
        self.wait_http(node_id);
    }

    /// `GET path` on a host with the cluster token; status and JSON body (`Null` if none).
    pub fn get(&self, node_id: u64, path: &str) -> (u16, serde_json::Value) {
        request(&self.agent, "GET", &self.host(node_id).url, path, None, TOKEN)
    }

    /// `POST path` with a JSON body on a host.
    pub fn post(&self, node_id: u64, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
        request(&self.agent, "POST", &self.host(node_id).url, path, Some(body), TOKEN)
    }

    /// `POST path` with a JSON body on a host, with the operator token.
    pub fn post_as_operator(&self, node_id: u64, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
        request(&self.agent, "POST", &self.host(node_id).url, path, Some(body), OPERATOR_TOKEN)
    }

    /// The test's HTTP agent (trusts the test CA in a TLS cluster).
    pub fn agent(&self) -> &ureq::Agent {
        &self.agent
    }

    /// `DELETE path` on a host.
    pub fn delete(&self, node_id: u64, path: &str) -> (u16, serde_json::Value) {
        request(&self.agent, "DELETE", &self.host(node_id).url, path, None, TOKEN)
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

    /// Waits until every running host sees exactly `expected` up and a meta leader.
    pub fn wait_ready(&self, expected: &[u64], within: Duration) {
        let running: Vec<u64> = self.hosts.iter().filter(|h| h.running()).map(|h| h.node_id).collect();
        wait_for(within, &format!("hosts {running:?} to see {expected:?} up with a leader"), || {
            running
                .iter()
                .all(|&id| {
                    self.status(id).is_some_and(|s| s["meta_leader"].is_u64()) && self.up_seen_by(id) == expected
                })
                .then_some(())
        });
    }

    /// Waits (up to `within`) until the replica of `kernel` on every running host applied
    /// revision `rev` and follows its group (no `broken`); returns their namespace digests.
    pub fn digests_after(&self, kernel: &str, rev: u64, within: Duration) -> std::collections::BTreeMap<u64, String> {
        let running: Vec<u64> = self.hosts.iter().filter(|h| h.running()).map(|h| h.node_id).collect();
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
        let out = Command::new(*NBOS)
            .arg("--url")
            .arg(&self.host(node_id).url)
            // Secrets through the environment: argv is readable by every local user.
            .env("NBOS_TOKEN", TOKEN)
            .env("NBOS_OPERATOR_TOKEN", OPERATOR_TOKEN)
            .args(if self.tls { vec!["--ca-cert".into(), self.dir.path().join("pki/ca.pem")] } else { Vec::new() })
            .args(args)
            .output()
            .expect("run nbos");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// The directory shared by the hosts (token, object store).
    pub fn dir(&self) -> &Path {
        self.dir.path()
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
                terminate(&mut c);
            }
        }
    }
}

/// SIGTERM, then SIGKILL of the group if the daemon does not exit within 10 s.
fn terminate(child: &mut Child) {
    let Ok(pid) = libc::pid_t::try_from(child.id()) else { return };
    // SAFETY: kill(2) on our own unreaped child.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: killpg(2) on the group our child leads.
    unsafe { libc::killpg(pid, libc::SIGKILL) };
    let _ = child.wait();
}

/// Polls `f` until it returns `Some`, panicking with `what` after `within`.
pub fn wait_for<T>(within: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {within:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn request(
    agent: &ureq::Agent,
    method: &str,
    base: &str,
    path: &str,
    body: Option<serde_json::Value>,
    token: &str,
) -> (u16, serde_json::Value) {
    let send = || -> Result<ureq::Response, Box<ureq::Error>> {
        let req = agent
            .request(method, &format!("{base}{path}"))
            .timeout(Duration::from_secs(15))
            .set("Authorization", &format!("token {token}"));
        match &body {
            Some(b) => req.set("Content-Type", "application/json").send_string(&b.to_string()),
            None => req.call(),
        }
        .map_err(Box::new)
    };
    let res = match send() {
        // A pooled connection the server had closed after refusing the previous request
        // (hyper does not keep a connection whose request body it did not read): the request
        // never reached it, so once more (the agent dropped that connection: a new one).
        Err(e) if matches!(&*e, ureq::Error::Transport(t) if t.to_string().contains("Unexpected EOF")) => send(),
        other => other,
    }
    .map_err(|e| *e);
    let (code, text) = match res {
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => return (0, serde_json::Value::String(e.to_string())),
    };
    (code, serde_json::from_str(&text).unwrap_or(serde_json::Value::Null))
}
