//! `[cluster]`: this host as a member of a NotebookOS cluster: raft, seeds, TLS, replicas
//! and the large-object store, with the checks made when the section is enabled.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nbos_sched::policy::PolicyConfig;
use serde::{Deserialize, Serialize};

use super::ConfigError;

/// `[cluster].tls`: the raft transport's mutual TLS material (PEM files).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterTlsConfig {
    /// The cluster CA certificate.
    pub ca_cert: PathBuf,
    /// This host's certificate (SAN `node-<node_id>`, server and client auth).
    pub cert: PathBuf,
    /// This host's private key.
    pub key: PathBuf,
}

/// `[cluster]`: this host as a member of a NotebookOS cluster (issue 7).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Off: a single host, exactly as without this section.
    pub enabled: bool,
    /// Raft node id of this host: non-zero and unique in the cluster.
    pub node_id: u64,
    /// Address the raft transport listens on.
    pub raft_listen: SocketAddr,
    /// Address a host outside the seeds gives the cluster for its raft transport when the
    /// others cannot reach it at `raft_listen` (a wildcard listener, NAT, a proxy). Unset:
    /// `raft_listen`. A seed is always reached at its seed address.
    pub raft_advertise: Option<SocketAddr>,
    /// Base URL other hosts use to reach this host's HTTP API; empty means the HTTP listener's URL.
    pub advertise_url: String,
    /// The founding voters of the meta group, as `"id=host:port"` (raft addresses). A host
    /// not listed joins an existing cluster with `nbos cluster join`.
    pub seeds: Vec<String>,
    /// Mutual TLS for the raft transport; unset means plaintext, allowed only on loopback.
    pub tls: Option<ClusterTlsConfig>,
    /// A host whose heartbeat lease is not renewed for this long is down.
    #[serde(with = "humantime_serde")]
    pub host_ttl: Duration,
    /// Replicas per kernel (on distinct hosts).
    pub replicas: u32,
    /// Namespace objects up to this size travel in the kernel's raft log; larger ones
    /// go to the object store and only a pointer is logged.
    pub sync_inline_max_bytes: u64,
    /// Large-object store URL (`file:///dir`, `s3://bucket/prefix`); empty means
    /// `file://{node.state_dir}/objects`.
    pub object_store: String,
    /// Longest time one request to an S3 store may take (a stalled upload fails the
    /// cell's sync after this and two retries).
    #[serde(with = "humantime_serde")]
    pub object_store_timeout: Duration,
    /// How often the meta leader collects unreferenced large objects; 0 turns it off.
    #[serde(with = "humantime_serde")]
    pub object_gc_interval: Duration,
    /// An unreferenced object is deleted only once its last write is this old: longer than
    /// any replica's catch-up (a lagging replica or a learner may still read it).
    #[serde(with = "humantime_serde")]
    pub object_gc_grace: Duration,
    /// Host memory this host's kernel replicas may use together, MiB: placement puts no
    /// replica here that would take their measured memory past it. 0 (the default): the
    /// host's `MemTotal` less a reserve for the system and the daemon
    /// ([`kernel_memory_capacity_mib`]).
    pub kernel_memory_mib: u64,
}

/// The memory capacity for kernels of a host with `mem_total_mib` of RAM and
/// `configured_mib` set (0: derived): `MemTotal` less a tenth for the system, the daemon
/// and the page cache, and never less than 2 GiB of reserve. 0 (not accounted) when the
/// host's memory is unknown.
pub fn kernel_memory_capacity_mib(configured_mib: u64, mem_total_mib: u64) -> u64 {
    if configured_mib > 0 {
        return configured_mib;
    }
    let reserve = (mem_total_mib / 10).max(2048);
    // A host too small for the reserve still takes kernels: a tenth of it, not "unbounded".
    mem_total_mib.saturating_sub(reserve).max(mem_total_mib / 10)
}

/// One founding voter of the meta group, from `cluster.seeds`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seed {
    /// Raft node id.
    pub node_id: u64,
    /// Raft transport address as written (`host:port`, resolved at start).
    pub addr: String,
}

impl ClusterConfig {
    /// The parsed `seeds` (validated by [`super::Config::validate`]).
    pub fn seed_list(&self) -> Result<Vec<Seed>, String> {
        let mut out: Vec<Seed> = Vec::with_capacity(self.seeds.len());
        for s in &self.seeds {
            let (id, addr) = s.split_once('=').ok_or_else(|| format!("{s:?} is not \"id=host:port\""))?;
            let node_id: u64 = id
                .trim()
                .parse()
                .ok()
                .filter(|&n| n != 0)
                .ok_or_else(|| format!("{s:?}: the node id must be a non-zero integer"))?;
            let addr = addr.trim();
            let port = addr.rsplit_once(':').map(|(host, port)| (host, port.parse::<u16>()));
            match port {
                Some((host, Ok(p))) if !host.is_empty() && p != 0 => {}
                _ => return Err(format!("{s:?}: the address must be host:port with a non-zero port")),
            }
            if out.iter().any(|o| o.node_id == node_id) {
                return Err(format!("node id {node_id} is listed twice"));
            }
            out.push(Seed { node_id, addr: addr.to_owned() });
        }
        Ok(out)
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            node_id: 0,
            raft_listen: SocketAddr::from(([127, 0, 0, 1], 8890)),
            raft_advertise: None,
            advertise_url: String::new(),
            seeds: Vec::new(),
            tls: None,
            host_ttl: Duration::from_secs(3),
            replicas: PolicyConfig::default().replicas,
            sync_inline_max_bytes: 1 << 20,
            object_store: String::new(),
            object_store_timeout: Duration::from_secs(60),
            object_gc_interval: Duration::from_secs(600),
            object_gc_grace: Duration::from_secs(3600),
            kernel_memory_mib: 0,
        }
    }
}

impl ClusterConfig {
    /// `[cluster]`: checked only when enabled (a disabled section changes nothing).
    pub(super) fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        let invalid =
            |field: &'static str, reason: String| ConfigError::Invalid { origin: origin.to_owned(), field, reason };
        let c = self;
        if !c.enabled {
            return Ok(());
        }
        if c.node_id == 0 {
            return Err(invalid("cluster.node_id", "must be a non-zero integer unique in the cluster".into()));
        }
        let seeds = c.seed_list().map_err(|e| invalid("cluster.seeds", e))?;
        if seeds.is_empty() {
            return Err(invalid(
                "cluster.seeds",
                "must list the founding meta voters as \"id=host:port\" (this host's own entry when it founds the cluster)".into(),
            ));
        }
        if c.raft_listen.port() == 0 {
            return Err(invalid("cluster.raft_listen", "needs a fixed port: the other hosts' seeds name it".into()));
        }
        if let Some(own) = seeds.iter().find(|s| s.node_id == c.node_id) {
            if let Ok(addr) = own.addr.parse::<SocketAddr>() {
                if addr.port() != c.raft_listen.port() {
                    return Err(invalid(
                        "cluster.seeds",
                        format!(
                            "this host's own seed {}={} does not match cluster.raft_listen = {}",
                            own.node_id, own.addr, c.raft_listen
                        ),
                    ));
                }
            }
        }
        if let Some(a) = c.raft_advertise {
            if a.ip().is_unspecified() || a.port() == 0 {
                return Err(invalid(
                    "cluster.raft_advertise",
                    format!("{a} is not an address other hosts can reach (no wildcard, a fixed port)"),
                ));
            }
        }
        if c.raft_listen.ip().is_unspecified()
            && c.raft_advertise.is_none()
            && !seeds.iter().any(|s| s.node_id == c.node_id)
        {
            return Err(invalid(
                "cluster.raft_listen",
                format!(
                    "{} cannot be handed to the cluster by `nbos cluster join`: a host outside cluster.seeds \
                     must listen on the address the other hosts reach it at, or name it in cluster.raft_advertise",
                    c.raft_listen
                ),
            ));
        }
        if c.tls.is_none() && !c.raft_listen.ip().is_loopback() {
            return Err(invalid(
                "cluster.tls",
                format!(
                    "required because cluster.raft_listen = {} is not a loopback address \
                     (plaintext raft traffic is accepted on loopback only)",
                    c.raft_listen
                ),
            ));
        }
        if c.tls.is_none() {
            if let Some(s) = seeds.iter().find(|s| s.addr.parse::<SocketAddr>().map_or(true, |a| !a.ip().is_loopback()))
            {
                return Err(invalid(
                    "cluster.tls",
                    format!("required because seed {}={} is not a loopback address", s.node_id, s.addr),
                ));
            }
        }
        if let Some(tls) = &c.tls {
            for (field, p) in [("cluster.tls", &tls.ca_cert), ("cluster.tls", &tls.cert), ("cluster.tls", &tls.key)] {
                if !p.is_absolute() {
                    return Err(invalid(field, format!("paths must be absolute, got {}", p.display())));
                }
            }
        }
        if c.host_ttl < Duration::from_millis(500) || c.host_ttl > Duration::from_secs(3600) {
            return Err(invalid(
                "cluster.host_ttl",
                format!("must be between 500ms and 1h, got {}", humantime::format_duration(c.host_ttl)),
            ));
        }
        if c.replicas == 0 || c.replicas > 9 {
            return Err(invalid("cluster.replicas", format!("must be 1..=9, got {}", c.replicas)));
        }
        if c.sync_inline_max_bytes == 0 || c.sync_inline_max_bytes > 8 << 20 {
            return Err(invalid(
                "cluster.sync_inline_max_bytes",
                format!(
                    "must be 1..=8388608 (a kernel group's snapshot is one 16 MiB frame), got {}",
                    c.sync_inline_max_bytes
                ),
            ));
        }
        let scheme_ok = c.advertise_url.starts_with("http://") || c.advertise_url.starts_with("https://");
        if !c.advertise_url.is_empty() && !scheme_ok {
            return Err(invalid(
                "cluster.advertise_url",
                format!("must be an http:// or https:// URL, got {:?}", c.advertise_url),
            ));
        }
        if c.object_store.is_empty() && c.replicas > 1 {
            return Err(invalid(
                "cluster.object_store",
                "must be set when kernels have several replicas: every replica host reads the large objects \
                 an executor wrote, so use s3://bucket[/prefix] or a directory every host mounts \
                 (file:///mnt/shared/...), not a directory of this host only"
                    .to_owned(),
            ));
        }
        if c.object_store_timeout < Duration::from_secs(1) {
            return Err(invalid(
                "cluster.object_store_timeout",
                format!("must be at least 1s, got {:?}", c.object_store_timeout),
            ));
        }
        if !c.object_store.is_empty() {
            let ok = c
                .object_store
                .strip_prefix("file://")
                .map(|p| Path::new(p).is_absolute())
                .unwrap_or_else(|| c.object_store.strip_prefix("s3://").is_some_and(|b| !b.is_empty()));
            if !ok {
                return Err(invalid(
                    "cluster.object_store",
                    format!("must be file:///absolute/dir or s3://bucket[/prefix], got {:?}", c.object_store),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::Config;

    const CLUSTER: &str = "[cluster]\nenabled = true\nnode_id = 1\nraft_listen = \"127.0.0.1:7001\"\n";

    #[test]
    fn the_memory_for_kernels_is_the_configured_value_or_memtotal_less_a_reserve() {
        use super::kernel_memory_capacity_mib as cap;
        assert_eq!(cap(4096, 1 << 20), 4096, "configured wins");
        assert_eq!(cap(0, 1 << 20), (1 << 20) - (1 << 20) / 10, "a 1 TiB host keeps a tenth");
        assert_eq!(cap(0, 16_384), 16_384 - 2048, "at least 2 GiB of reserve");
        assert_eq!(cap(0, 1024), 102, "a tiny host still takes kernels");
        assert_eq!(cap(0, 0), 0, "unknown memory: not accounted");
        let c = Config::parse(
            &format!("{CLUSTER}seeds = [\"1=127.0.0.1:7001\"]\nreplicas = 1\nkernel_memory_mib = 512\n"),
            "t.toml",
        )
        .expect("valid");
        assert_eq!(c.cluster.kernel_memory_mib, 512);
    }

    #[test]
    fn cluster_section_is_off_by_default_and_accepts_a_loopback_dev_cluster() {
        assert!(!Config::default().cluster.enabled);
        let seed_text = "seeds = [\"1=127.0.0.1:7001\", \"2=127.0.0.1:7002\", \"3=127.0.0.1:7003\"]\n";
        let text = format!("{CLUSTER}{seed_text}object_store = \"file:///srv/objects\"\n");
        let c = Config::parse(&text, "t.toml").expect("valid cluster config");
        let seeds = c.cluster.seed_list().expect("seeds");
        assert_eq!(seeds.iter().map(|s| s.node_id).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert_eq!(c.cluster.host_ttl, Duration::from_secs(3));
        assert_eq!(c.cluster.replicas, 3);
        assert_eq!(c.object_store_url(), "file:///srv/objects");
        // Several replicas need a store every host reads; one replica may use the host's own.
        let err = Config::parse(&format!("{CLUSTER}{seed_text}"), "t.toml").expect_err("no object store");
        assert!(err.to_string().contains("cluster.object_store"), "{err}");
        let single = Config::parse(&format!("{CLUSTER}{seed_text}replicas = 1\n"), "t.toml").expect("one replica");
        assert_eq!(single.object_store_url(), "file:///var/lib/notebookos/objects");
    }

    #[test]
    fn bad_cluster_values_name_their_key() {
        let seeds = "seeds = [\"1=127.0.0.1:7001\"]\n";
        for (text, field) in [
            (format!("[cluster]\nenabled = true\n{seeds}"), "cluster.node_id"),
            (CLUSTER.to_owned(), "cluster.seeds"),
            (format!("{CLUSTER}seeds = [\"one=127.0.0.1:7001\"]\n"), "cluster.seeds"),
            (format!("{CLUSTER}seeds = [\"1=127.0.0.1\"]\n"), "cluster.seeds"),
            (format!("{CLUSTER}seeds = [\"1=127.0.0.1:7001\", \"1=127.0.0.1:7002\"]\n"), "cluster.seeds"),
            (format!("{CLUSTER}seeds = [\"1=127.0.0.1:7009\"]\n"), "cluster.seeds"),
            (format!("{CLUSTER}seeds = [\"1=127.0.0.1:7001\", \"2=10.0.0.2:7001\"]\n"), "cluster.tls"),
            (format!("[cluster]\nenabled = true\nnode_id = 1\nraft_listen = \"0.0.0.0:7001\"\n{seeds}"), "cluster.tls"),
            (
                format!("{CLUSTER}{seeds}tls = {{ ca_cert = \"ca.pem\", cert = \"/c.pem\", key = \"/k.pem\" }}\n"),
                "cluster.tls",
            ),
            (format!("{CLUSTER}{seeds}host_ttl = \"10ms\"\n"), "cluster.host_ttl"),
            (format!("{CLUSTER}{seeds}host_ttl = \"soon\"\n"), "cluster.host_ttl"),
            (format!("{CLUSTER}{seeds}replicas = 0\n"), "cluster.replicas"),
            (format!("{CLUSTER}{seeds}sync_inline_max_bytes = 0\n"), "cluster.sync_inline_max_bytes"),
            (format!("{CLUSTER}{seeds}advertise_url = \"host:8888\"\n"), "cluster.advertise_url"),
            (format!("{CLUSTER}{seeds}object_store = \"objects\"\n"), "cluster.object_store"),
            (
                format!("[cluster]\nenabled = true\nnode_id = 1\nraft_listen = \"127.0.0.1:0\"\n{seeds}"),
                "cluster.raft_listen",
            ),
            (format!("{CLUSTER}{seeds}seed = []\n"), "cluster.seed"),
            (
                format!(
                    "[cluster]\nenabled = true\nnode_id = 4\nraft_listen = \"0.0.0.0:7004\"\n{seeds}\
                     tls = {{ ca_cert = \"/ca.pem\", cert = \"/c.pem\", key = \"/k.pem\" }}\n"
                ),
                "cluster.raft_listen",
            ),
            (format!("{CLUSTER}{seeds}raft_advertise = \"0.0.0.0:7001\"\n"), "cluster.raft_advertise"),
            (format!("{CLUSTER}{seeds}raft_advertise = \"10.0.0.4:0\"\n"), "cluster.raft_advertise"),
        ] {
            let err = Config::parse(&text, "t.toml").expect_err(&text);
            assert!(err.to_string().contains(field), "{text}: {err}");
        }
        // A joining host on a wildcard listener that names the address it is reached at.
        let joining = format!(
            "[cluster]\nenabled = true\nnode_id = 4\nraft_listen = \"0.0.0.0:7004\"\nraft_advertise = \"10.0.0.4:7004\"\n\
             {seeds}object_store = \"file:///srv/o\"\ntls = {{ ca_cert = \"/ca.pem\", cert = \"/c.pem\", key = \"/k.pem\" }}\n"
        );
        let c = Config::parse(&joining, "t.toml").expect("a wildcard listener with raft_advertise");
        assert_eq!(c.cluster.raft_advertise, Some("10.0.0.4:7004".parse().expect("addr")));
    }

    #[test]
    fn a_disabled_cluster_section_is_not_checked() {
        let c = Config::parse("[cluster]\nnode_id = 0\nseeds = [\"garbage\"]\n", "t.toml").expect("disabled");
        assert!(!c.cluster.enabled);
    }
}
