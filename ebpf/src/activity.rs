//! What the observer reports about a process.

use serde::Serialize;

/// The mode the observer runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Uprobes and the exit tracepoint are attached.
    Ebpf,
    /// Fallback: procfs sampling and shim counters.
    Procfs,
}

impl Mode {
    /// `"ebpf"` or `"procfs"`, as in metrics and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Ebpf => "ebpf",
            Mode::Procfs => "procfs",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// GPU activity of one process (thread group) since the observer first saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProcessActivity {
    /// Thread group id.
    pub pid: u32,
    /// Process name (`comm`), empty when unknown.
    pub comm: String,
    /// Kernel and graph launches.
    pub launches: u64,
    /// Memory copies.
    pub copies: u64,
    /// Bytes copied, where the call's arguments say.
    pub copy_bytes: u64,
    /// Memsets.
    pub memsets: u64,
    /// Bytes set.
    pub memset_bytes: u64,
    /// Context, stream and event synchronisations.
    pub syncs: u64,
    /// ioctls on the GPU device files (only with the ioctl probe enabled).
    pub driver_ioctls: u64,
    /// Gated calls the shim reported over the lease protocol (`Activity { calls }`).
    pub shim_calls: u64,
    /// First GPU activity, CLOCK_MONOTONIC nanoseconds.
    pub first_activity_ns: u64,
    /// Latest GPU activity, CLOCK_MONOTONIC nanoseconds.
    pub last_activity_ns: u64,
    /// Where the counts came from.
    pub sources: Sources,
    /// CPU time (user + system) in nanoseconds, when sampled (procfs mode).
    pub cpu_time_ns: Option<u64>,
    /// Voluntary + involuntary context switches, when sampled (procfs mode).
    pub context_switches: Option<u64>,
}

/// Which signals contributed to a [`ProcessActivity`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Sources {
    /// Uprobes on the driver library.
    pub uprobes: bool,
    /// The shim's counters file.
    pub shim_counters: bool,
    /// The shim's `Activity` reports over the lease protocol.
    pub lease_reports: bool,
}

/// A process the observer tracked or was asked to watch has exited.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExitEvent {
    /// Thread group id of the exited process.
    pub pid: u32,
    /// Exit status as the kernel stores it (`exit_code`), when known.
    pub exit_code: Option<i32>,
    /// When the exit was seen, CLOCK_MONOTONIC nanoseconds (in eBPF mode: in the kernel).
    pub exited_at_ns: u64,
    /// Its final GPU activity, if it had any.
    pub activity: Option<ProcessActivity>,
}
