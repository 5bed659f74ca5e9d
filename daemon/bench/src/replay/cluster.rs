//! The cluster a replay drives: a loopback cluster it starts itself (the test-support
//! crate's [`TestCluster`], as the cluster benches start it, with simulated GPUs), or an existing one at
//! `--url`. Either way its hosts are found in `GET /api/v1/cluster/status`, kernels are
//! created and cells run through gateways, and each host's `/metrics` is read.

use std::time::Duration;

use anyhow::Context as _;

use super::autoscaled::Autoscaled;
use nbos_test_support::{Options, TestCluster};
use notebookosd::link::client::GatewayClient;

/// One host of the cluster.
#[derive(Debug, Clone)]
pub struct Host {
    /// Raft node id.
    pub node_id: u64,
    /// Its gateway.
    pub url: String,
    /// GPUs it has.
    pub gpus: u32,
}

/// The cluster under replay.
pub struct ReplayCluster {
    /// Its hosts with GPUs (gateway-only hosts hold no GPU kernel and bill nothing here).
    pub hosts: Vec<Host>,
    gateways: Vec<GatewayClient>,
    agent: ureq::Agent,
    token: Option<String>,
    /// The loopback cluster the replay started ([`TestCluster`] or [`Autoscaled`]), kept
    /// alive for the replay; its daemons stop when it drops.
    _local: Option<Local>,
}

type Local = Box<dyn std::any::Any + Send + Sync>;

impl ReplayCluster {
    /// Starts a loopback cluster of `hosts` daemons and waits until it is ready.
    pub fn local(hosts: u64, options: Options) -> anyhow::Result<Self> {
        let cluster = TestCluster::launch(hosts, options).context("starting the loopback cluster")?;
        let gateways = cluster.hosts.iter().map(|h| cluster.client(h.node_id)).collect::<anyhow::Result<_>>()?;
        let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(10)).build();
        let token = Some(cluster.token().to_owned());
        Self::discover(gateways, agent, token, Some(Box::new(cluster)))
    }

    /// The autoscaled loopback cluster `a` (started).
    pub fn autoscaled(a: Autoscaled) -> anyhow::Result<Self> {
        let c = &a.cluster;
        let gateways = c.hosts.iter().map(|h| c.client(h.node_id)).collect::<anyhow::Result<_>>()?;
        let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(10)).build();
        let token = Some(c.token().to_owned());
        Self::discover(gateways, agent, token, Some(Box::new(a)))
    }

    /// An existing cluster, through the gateway and credentials of the command line.
    pub fn remote(t: &crate::client::ConnectArgs) -> anyhow::Result<Self> {
        let url = t.url.clone().context("--url names the cluster to replay against")?;
        let token = t.token()?;
        let mut gateway = GatewayClient::new(&url, token.clone());
        if let Some(ca) = &t.ca_cert {
            let identity = t.client_cert.as_deref().zip(t.client_key.as_deref());
            gateway = gateway.with_tls(notebookosd::link::tls::client_config(ca, identity)?);
        }
        Self::discover(vec![gateway], t.agent(Duration::from_secs(10))?, token, None)
    }

    fn discover(
        gateways: Vec<GatewayClient>,
        agent: ureq::Agent,
        token: Option<String>,
        local: Option<Local>,
    ) -> anyhow::Result<Self> {
        let mut me = Self { hosts: Vec::new(), gateways, agent, token, _local: local };
        me.hosts = me.live_hosts()?;
        let first = me.gateways.first().map(|g| g.url.clone()).unwrap_or_default();
        anyhow::ensure!(!me.hosts.is_empty(), "{first}: the cluster status lists no host with GPUs that is up");
        Ok(me)
    }

    /// The hosts with GPUs that are up now (`GET /api/v1/cluster/status` of the first
    /// gateway): an autoscaled cluster's hosts come and go during a replay.
    pub fn live_hosts(&self) -> anyhow::Result<Vec<Host>> {
        let first = &self.gateways.first().context("no gateway")?.url;
        let status: serde_json::Value = self
            .get(first, "/api/v1/cluster/status")?
            .into_json()
            .with_context(|| format!("{first}: decoding the cluster status"))?;
        let mut hosts = Vec::new();
        for m in status.get("members").and_then(|m| m.as_array()).into_iter().flatten() {
            let up = m.get("up").and_then(serde_json::Value::as_bool) == Some(true);
            let Some(host) = m.get("host").filter(|_| up) else { continue };
            let gpus = host.get("gpus").and_then(|g| g.as_array()).map_or(0, Vec::len);
            let url = host.get("gateway_url").and_then(|u| u.as_str()).unwrap_or_default();
            if gpus > 0 && !url.is_empty() {
                hosts.push(Host {
                    node_id: m.get("node_id").and_then(serde_json::Value::as_u64).unwrap_or(0),
                    url: url.trim_end_matches('/').to_owned(),
                    gpus: u32::try_from(gpus).unwrap_or(u32::MAX),
                });
            }
        }
        Ok(hosts)
    }

    fn get(&self, base: &str, path: &str) -> anyhow::Result<ureq::Response> {
        let mut req = self.agent.get(&format!("{base}{path}"));
        if let Some(t) = &self.token {
            req = req.set("Authorization", &format!("token {t}"));
        }
        req.call().with_context(|| format!("GET {base}{path}"))
    }

    /// The gateway session `i` uses: spread over the gateways, round robin.
    pub fn gateway(&self, i: usize) -> GatewayClient {
        self.gateways[i % self.gateways.len()].clone()
    }

    /// A host's `/metrics` text.
    pub fn metrics(&self, host: &Host) -> anyhow::Result<String> {
        let url = &host.url;
        self.get(url, "/metrics")?.into_string().with_context(|| format!("{url}: reading /metrics"))
    }
}
