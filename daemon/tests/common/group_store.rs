//! Three raft stores in the test process on loopback (plaintext), the way three hosts'
//! daemons embed theirs, for tests of kernel groups without daemon processes.

use std::time::{Duration, Instant};

use raft_store::{RaftStore, StoreConfig, TransportSecurity};

/// `n` stores, node ids `1..=n`, each knowing the others.
pub struct Stores {
    pub stores: Vec<RaftStore>,
    _dir: tempfile::TempDir,
}

impl Stores {
    pub fn open(n: u64) -> Stores {
        Self::open_with(n, |_| {})
    }

    /// Like [`Stores::open`], with a hook to adjust each node's configuration.
    pub fn open_with(n: u64, adjust: impl Fn(&mut StoreConfig)) -> Stores {
        let dir = tempfile::tempdir().expect("tempdir");
        let addrs: Vec<_> = (0..n).map(|_| raft_store::service::free_loopback_addr().expect("free port")).collect();
        let mut configs = Vec::new();
        for id in 1..=n {
            let mut cfg = StoreConfig::new(
                id,
                dir.path().join(format!("node-{id}")),
                addrs[(id - 1) as usize],
                TransportSecurity::Plaintext,
            );
            cfg.peers = (1..=n).filter(|o| *o != id).map(|o| (o, addrs[(o - 1) as usize])).collect();
            cfg.tick_interval = Duration::from_millis(50);
            adjust(&mut cfg);
            configs.push(cfg);
        }
        let stores = configs.iter().map(|c| RaftStore::open(c.clone()).expect("open store")).collect();
        Stores { stores, _dir: dir }
    }

    pub fn node(&self, id: u64) -> &RaftStore {
        &self.stores[(id - 1) as usize]
    }

    pub fn ids(&self) -> Vec<u64> {
        (1..=self.stores.len() as u64).collect()
    }

    /// Creates `group` on every node with all nodes as voters; waits for a leader.
    pub async fn create_group(&self, group: u64) -> u64 {
        let voters = self.ids();
        for s in &self.stores {
            s.create_group(group, &voters).await.expect("create group");
        }
        self.wait_leader(group).await
    }

    /// Waits until some node leads `group`; returns its id.
    pub async fn wait_leader(&self, group: u64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            for s in &self.stores {
                if let Ok(st) = s.status(group).await {
                    if st.role == "leader" {
                        return s.node_id();
                    }
                }
            }
            assert!(Instant::now() < deadline, "group {group} elected no leader in time");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A small deterministic PRNG (xorshift64*) so a failing run can be replayed from its seed.
pub struct Rng(u64);

impl Rng {
    pub fn seeded() -> Rng {
        let seed = std::env::var("NBOS_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
        });
        eprintln!("random seed {seed} (replay with NBOS_TEST_SEED={seed})");
        Rng(seed | 1)
    }

    pub fn from_seed(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// True with probability `p_percent`%.
    pub fn chance(&mut self, p_percent: u64) -> bool {
        self.below(100) < p_percent
    }
}

/// The Python with ipykernel and nbos_kernel: `NBOS_PYTHON`, else the project's venv.
pub fn python() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("NBOS_PYTHON") {
        return p.into();
    }
    let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    assert!(p.exists(), "{} is missing: create the venv (make deps)", p.display());
    p
}
