//! Configuration of the observer (the daemon's `[observer]` table).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Which way to observe. `Auto` tries eBPF and falls back to procfs with a log line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModeRequest {
    /// eBPF when it loads, else procfs.
    #[default]
    Auto,
    /// eBPF or an error.
    Ebpf,
    /// procfs only (CPU time, context switches, shim counters), never touching BPF.
    Procfs,
}

/// Observer settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ObserverConfig {
    /// eBPF, procfs, or automatic choice.
    pub mode: ModeRequest,
    /// Driver libraries to probe. Empty: discover with `ldconfig -p` and well-known paths.
    /// Every configured path must exist and export driver entry points, else start fails.
    pub libraries: Vec<PathBuf>,
    /// Put uprobes on the kernel-launch entry points too. Exact, but a uprobe costs about a
    /// microsecond per hit; with `false` launch counts come from the shim's counters files and
    /// the uprobes stay on the rarer copy, memset and synchronise calls.
    pub launch_probes: bool,
    /// Count ioctls on the GPU device files per process (`tp_btf/sys_enter`). Finds GPU users
    /// that bypass the probed library, at the price of a check on every syscall of the host.
    pub ioctl_probe: bool,
    /// Device files whose ioctls count (with `ioctl_probe`). Empty: every `/dev/nvidia*`.
    pub ioctl_devices: Vec<PathBuf>,
    /// Directory of the shim's per-process counters files (`<dir>/<pid>`); `None`: not read.
    pub counters_dir: Option<PathBuf>,
    /// Most processes tracked at once (size of the BPF map).
    pub max_processes: u32,
    /// How often the background thread wakes: ring buffer poll timeout, procfs sampling.
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// How often per-process counts are folded into the Prometheus counters.
    #[serde(with = "humantime_serde")]
    pub metrics_interval: Duration,
    /// Exit events each `exit_events()` subscriber may have unread; more are dropped and
    /// counted, so a stalled reader cannot grow the daemon's memory. At least 1.
    pub exit_queue: usize,
}

/// Where the shim writes its counters (see `shim_counters`).
pub const DEFAULT_COUNTERS_DIR: &str = "/run/notebookos/counters";

impl Default for ObserverConfig {
    fn default() -> Self {
        Self {
            mode: ModeRequest::Auto,
            libraries: Vec::new(),
            launch_probes: true,
            ioctl_probe: false,
            ioctl_devices: Vec::new(),
            counters_dir: Some(PathBuf::from(DEFAULT_COUNTERS_DIR)),
            max_processes: 16_384,
            poll_interval: Duration::from_millis(20),
            metrics_interval: Duration::from_secs(1),
            exit_queue: 4096,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_table_reads_with_defaults_and_refuses_unknown_keys() {
        let c: ObserverConfig = serde_json::from_str(
            r#"{"mode": "procfs", "libraries": ["/usr/lib/libcuda.so.1"], "poll_interval": "50ms", "launch_probes": false}"#,
        )
        .unwrap();
        assert_eq!(c.mode, ModeRequest::Procfs);
        assert_eq!(c.poll_interval, Duration::from_millis(50));
        assert!(!c.launch_probes && !c.ioctl_probe);
        assert_eq!(c.metrics_interval, Duration::from_secs(1));
        assert_eq!(c.counters_dir.as_deref(), Some(std::path::Path::new(DEFAULT_COUNTERS_DIR)));
        let err = serde_json::from_str::<ObserverConfig>(r#"{"mode": "kprobe"}"#).unwrap_err().to_string();
        assert!(err.contains("kprobe"), "{err}");
        let err = serde_json::from_str::<ObserverConfig>(r#"{"librarys": []}"#).unwrap_err().to_string();
        assert!(err.contains("librarys"), "{err}");
    }
}
