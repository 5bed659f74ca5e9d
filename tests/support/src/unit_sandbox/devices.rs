//! `DevicePolicy=` and `DeviceAllow=` as systemd applies them on a cgroup v1 host: a devices
//! cgroup of the service's own that denies everything but the listed nodes (systemd's
//! `cgroup.c`; on cgroup v2 it attaches an equivalent BPF program). Removed on drop.

use std::ffi::CString;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};

use super::unit::Service;

const DEVICES_V1: &str = "/sys/fs/cgroup/devices";

/// What `DevicePolicy=closed` allows besides `DeviceAllow=` (systemd's `auto_devices`).
const PSEUDO_DEVICES: &[&str] =
    &["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx"];

/// The service's devices cgroup.
#[derive(Debug)]
pub struct DeviceCgroup {
    dir: PathBuf,
    /// `<dir>/cgroup.procs`, which the child writes "0" (itself) to.
    pub procs: CString,
    /// The rules written to `devices.allow`, as `c 195:* rw`.
    pub allowed: Vec<String>,
    /// `DeviceAllow=` entries with no such node or driver on this host (systemd skips them).
    pub absent: Vec<String>,
}

/// The major number `/proc/devices` gives driver `name` in its `Character` or `Block` part.
fn major_of(block: bool, name: &str) -> Option<u32> {
    let text = std::fs::read_to_string("/proc/devices").ok()?;
    let section = if block { "Block devices:" } else { "Character devices:" };
    let mut inside = false;
    for line in text.lines() {
        if line.ends_with(':') {
            inside = line == section;
            continue;
        }
        let mut parts = line.split_whitespace();
        if let (true, Some(major), Some(n)) = (inside, parts.next(), parts.next()) {
            if n == name {
                return major.parse().ok();
            }
        }
    }
    None
}

/// The devices-cgroup rule for `node` (a device path, `char-NAME` or `block-NAME`) with
/// `access` (systemd's letters r, w, m), or `None` if the host has no such device.
fn rule(node: &str, access: &str) -> anyhow::Result<Option<String>> {
    if !access.chars().all(|ch| "rwm".contains(ch)) {
        bail!("device access {access}: only r, w and m");
    }
    if let Some(name) = node.strip_prefix("char-") {
        return Ok(major_of(false, name).map(|m| format!("c {m}:* {access}")));
    }
    if let Some(name) = node.strip_prefix("block-") {
        return Ok(major_of(true, name).map(|m| format!("b {m}:* {access}")));
    }
    let Ok(meta) = std::fs::metadata(node) else { return Ok(None) };
    let kind = match meta.file_type() {
        t if t.is_char_device() => 'c',
        t if t.is_block_device() => 'b',
        _ => bail!("DeviceAllow={node}: not a device node"),
    };
    let rdev = meta.rdev();
    Ok(Some(format!("{kind} {}:{} {access}", libc::major(rdev), libc::minor(rdev))))
}

impl DeviceCgroup {
    /// Creates `nbos-unit-sandbox-<pid>-<n>` under the v1 devices hierarchy with the unit's
    /// policy, or says why this host cannot have one.
    pub fn new(service: &Service, name: &str) -> anyhow::Result<Option<Self>> {
        let policy = service.one("DevicePolicy");
        let allow = service.all("DeviceAllow");
        match policy {
            None | Some("auto") if allow.is_empty() => return Ok(None),
            None | Some("auto" | "closed" | "strict") => {}
            Some(other) => bail!("DevicePolicy={other}: not known here"),
        }
        if !Path::new(DEVICES_V1).join("devices.allow").exists() {
            bail!("DevicePolicy= needs the cgroup v1 devices controller at {DEVICES_V1} here");
        }
        let dir = Path::new(DEVICES_V1).join(name);
        std::fs::create_dir(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
        let mut this = Self {
            procs: CString::new(dir.join("cgroup.procs").as_os_str().as_encoded_bytes())?,
            dir,
            allowed: Vec::new(),
            absent: Vec::new(),
        };
        std::fs::write(this.dir.join("devices.deny"), "a").context("devices.deny a")?;
        let mut wanted: Vec<(String, String)> = Vec::new();
        if policy != Some("strict") {
            wanted.extend(PSEUDO_DEVICES.iter().map(|d| ((*d).to_owned(), "rwm".to_owned())));
            wanted.push(("char-pts".to_owned(), "rw".to_owned()));
        }
        for entry in allow {
            let mut parts = entry.split_whitespace();
            let node = parts.next().context("an empty DeviceAllow=")?;
            wanted.push((node.to_owned(), parts.next().unwrap_or("rwm").to_owned()));
        }
        for (node, access) in wanted {
            match rule(&node, &access)? {
                Some(r) => {
                    std::fs::write(this.dir.join("devices.allow"), &r).with_context(|| format!("devices.allow {r}"))?;
                    this.allowed.push(r);
                }
                None => this.absent.push(node),
            }
        }
        Ok(Some(this))
    }
}

impl Drop for DeviceCgroup {
    fn drop(&mut self) {
        // The daemon and its kernels have exited by now; a cgroup empties a moment later.
        let _ = crate::wait::poll(Duration::from_secs(10), || std::fs::remove_dir(&self.dir).ok());
    }
}
