//! The connection file of one kernel process: ports, transport and HMAC key.

use std::net::{Ipv4Addr, TcpListener};
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// The Jupyter connection file (`jupyter_client.connect.write_connection_file`'s format).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConnectionInfo {
    /// Shell ROUTER port.
    pub shell_port: u16,
    /// IOPub PUB port.
    pub iopub_port: u16,
    /// Stdin ROUTER port.
    pub stdin_port: u16,
    /// Control ROUTER port.
    pub control_port: u16,
    /// Heartbeat REP port.
    pub hb_port: u16,
    /// Address the kernel binds.
    pub ip: String,
    /// HMAC key (hex text used as bytes, as jupyter_client does).
    pub key: String,
    /// `tcp`.
    pub transport: String,
    /// `hmac-sha256`.
    pub signature_scheme: String,
    /// Kernel name (informational).
    #[serde(default)]
    pub kernel_name: String,
}

/// Ports this process handed to kernels lately (a kernel binds its ports within seconds).
static RECENT_PORTS: std::sync::Mutex<std::collections::VecDeque<u16>> =
    std::sync::Mutex::new(std::collections::VecDeque::new());
/// How many handed-out ports are remembered.
const RECENT_PORTS_KEPT: usize = 1024;
/// Picks of one port before one that was handed out lately is taken anyway.
const PICK_TRIES: usize = 64;

impl ConnectionInfo {
    /// Fresh loopback ports and a random 256-bit key.
    ///
    /// The ports are found by binding port 0 and releasing it, as jupyter_client
    /// does; another process could take one in between, which then shows up as a
    /// kernel that fails to start (and is reported as such), never as a wrong peer,
    /// because every message is signed with the key.
    pub fn new_loopback(kernel_name: &str) -> anyhow::Result<Self> {
        let mut held = Vec::with_capacity(5);
        let mut ports = [0u16; 5];
        {
            // A port released here is free until its kernel binds it: the kernel's bind(0)
            // hands it out again at once, so kernels started together got each other's ports
            // (and, since the daemon checks who listens, failed their starts). Ports handed
            // out recently are skipped, held bound meanwhile so the next pick differs.
            let mut recent = RECENT_PORTS.lock().unwrap_or_else(|p| p.into_inner());
            for p in &mut ports {
                for _ in 0..PICK_TRIES {
                    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("finding a free loopback port")?;
                    *p = l.local_addr().context("reading a bound port")?.port();
                    held.push(l);
                    if !recent.contains(p) {
                        break;
                    }
                }
            }
            for p in ports {
                if recent.len() == RECENT_PORTS_KEPT {
                    recent.pop_front();
                }
                recent.push_back(p);
            }
        }
        drop(held);
        Ok(Self {
            shell_port: ports[0],
            iopub_port: ports[1],
            stdin_port: ports[2],
            control_port: ports[3],
            hb_port: ports[4],
            ip: "127.0.0.1".to_owned(),
            key: random_hex(32)?,
            transport: "tcp".to_owned(),
            signature_scheme: "hmac-sha256".to_owned(),
            kernel_name: kernel_name.to_owned(),
        })
    }

    /// Same key, fresh ports (a restarted kernel keeps its key).
    pub fn with_fresh_ports(&self) -> anyhow::Result<Self> {
        let fresh = Self::new_loopback(&self.kernel_name)?;
        Ok(Self { key: self.key.clone(), ..fresh })
    }

    /// Reads a connection file (what a client wrote for `nbos kernel-proxy -f`).
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading connection file {}", path.display()))?;
        let info: Self =
            serde_json::from_str(&text).with_context(|| format!("parsing connection file {}", path.display()))?;
        anyhow::ensure!(
            info.transport == "tcp",
            "connection file {}: transport {:?} is not supported (only tcp)",
            path.display(),
            info.transport
        );
        anyhow::ensure!(
            info.signature_scheme == "hmac-sha256" || info.key.is_empty(),
            "connection file {}: signature_scheme {:?} is not supported (only hmac-sha256)",
            path.display(),
            info.signature_scheme
        );
        Ok(info)
    }

    /// Writes the file with mode 0600 (the key is a secret), as a new file: whatever was
    /// at `path` is removed first and no symlink is followed, since the directory may be
    /// a kernel's own (its process could have put a link there for the daemon to write through).
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("removing the old connection file {}", path.display()));
            }
            _ => {}
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(crate::sys::open_flags::O_NOFOLLOW)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("creating connection file {}", path.display()))?;
        f.write_all(serde_json::to_string_pretty(self)?.as_bytes())
            .with_context(|| format!("writing connection file {}", path.display()))
    }

    /// `tcp://ip:port`.
    pub fn endpoint(&self, port: u16) -> String {
        format!("{}://{}:{port}", self.transport, self.ip)
    }
}

/// `n` random bytes from the OS, hex-encoded.
pub fn random_hex(n: usize) -> anyhow::Result<String> {
    let mut buf = vec![0u8; n];
    getrandom::fill(&mut buf).map_err(|e| anyhow::anyhow!("reading random bytes: {e}"))?;
    Ok(hex::encode(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_files_have_distinct_ports_and_a_long_random_key() {
        let a = ConnectionInfo::new_loopback("k").expect("a");
        let b = ConnectionInfo::new_loopback("k").expect("b");
        assert_ne!(a.key, b.key);
        assert_eq!(a.key.len(), 64);
        let mut ports = vec![a.shell_port, a.iopub_port, a.stdin_port, a.control_port, a.hb_port];
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 5);
        let r = a.with_fresh_ports().expect("fresh");
        assert_eq!(r.key, a.key);
    }

    /// Kernels started together never get the same port: a released port is what the next
    /// bind(0) hands out, so without the memory of recent ports these overlapped.
    #[test]
    fn kernels_picked_one_after_another_share_no_port() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..20 {
            let c = ConnectionInfo::new_loopback("k").expect("ports");
            for p in [c.shell_port, c.iopub_port, c.stdin_port, c.control_port, c.hb_port] {
                assert!(seen.insert(p), "port {p} handed out twice");
            }
        }
    }

    #[test]
    fn write_then_read_and_refuse_other_transports() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("c.json");
        let a = ConnectionInfo::new_loopback("k").expect("a");
        a.write(&p).expect("write");
        assert_eq!(ConnectionInfo::read(&p).expect("read"), a);
        let ipc = ConnectionInfo { transport: "ipc".into(), ..a };
        ipc.write(&p).expect("write");
        assert!(ConnectionInfo::read(&p).unwrap_err().to_string().contains("ipc"));
        std::fs::write(&p, "{").expect("w");
        assert!(ConnectionInfo::read(&p).is_err());
    }
}
