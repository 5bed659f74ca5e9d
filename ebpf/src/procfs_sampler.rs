//! The procfs side: process liveness, CPU time and context switches from `/proc/<pid>`.
//!
//! In procfs mode this is how exits are found (polling) and how a process without a shim is
//! judged busy (its CPU time advanced since the last sample). Coarse: CPU work is not GPU work,
//! so a CPU-busy process counts as active, which errs on the side of keeping its GPU.

use std::collections::HashMap;

/// One reading of `/proc/<pid>/stat` and `status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ProcSample {
    /// `starttime` (clock ticks after boot): with the pid, names one process across pid reuse.
    pub start_ticks: u64,
    /// utime + stime in clock ticks.
    pub cpu_ticks: u64,
    /// Voluntary + involuntary context switches.
    pub context_switches: Option<u64>,
    /// The process has exited (zombie or dead) and `/proc` still shows it.
    pub exited: bool,
    /// Its exit status, once exited.
    pub exit_code: Option<i32>,
}

/// Reads `pid`; `None` when there is no such process.
pub(crate) fn sample(pid: u32) -> Option<ProcSample> {
    let proc = procfs::process::Process::new(i32::try_from(pid).ok()?).ok()?;
    let stat = proc.stat().ok()?;
    let context_switches =
        proc.status().ok().and_then(|s| Some(s.voluntary_ctxt_switches? + s.nonvoluntary_ctxt_switches?));
    let exited = matches!(stat.state, 'Z' | 'X' | 'x');
    Some(ProcSample {
        start_ticks: stat.starttime,
        cpu_ticks: stat.utime + stat.stime,
        context_switches,
        exited,
        exit_code: if exited { stat.exit_code } else { None },
    })
}

/// Whether `/proc/<pid>` exists at all (zombies included: a zombie has exited but its exit
/// tracepoint has run, so it is not "gone before anyone saw it").
pub(crate) fn exists(pid: u32) -> bool {
    std::path::Path::new("/proc").join(pid.to_string()).exists()
}

/// Clock ticks to nanoseconds.
pub(crate) fn ticks_to_ns(ticks: u64) -> u64 {
    let per_sec = procfs::ticks_per_second().max(1);
    ticks.saturating_mul(1_000_000_000 / per_sec)
}

/// Process start as CLOCK_MONOTONIC ns (`starttime` counts from boot, as does the monotonic
/// clock on a machine that has not been suspended).
pub(crate) fn start_ns(pid: u32) -> Option<u64> {
    sample(pid).filter(|s| !s.exited).map(|s| ticks_to_ns(s.start_ticks))
}

#[derive(Clone, Copy, Debug)]
struct Tracked {
    last: ProcSample,
    cpu_changed_ns: u64,
}

/// Processes sampled periodically, with the time their CPU time last advanced.
#[derive(Debug, Default)]
pub(crate) struct ProcTracker {
    tracked: HashMap<u32, Tracked>,
}

/// What [`ProcTracker::tick`] found gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Gone {
    pub pid: u32,
    pub exit_code: Option<i32>,
}

impl ProcTracker {
    /// Starts sampling `pid`; `false` if it does not exist. A new process counts as active now:
    /// without history, assuming idle could take a GPU from a busy process.
    pub(crate) fn track(&mut self, pid: u32, now_ns: u64) -> bool {
        if self.tracked.contains_key(&pid) {
            return true;
        }
        match sample(pid) {
            Some(s) if !s.exited => {
                self.tracked.insert(pid, Tracked { last: s, cpu_changed_ns: now_ns });
                true
            }
            _ => false,
        }
    }

    /// Whether `pid` is being sampled.
    #[cfg(test)]
    pub(crate) fn is_tracked(&self, pid: u32) -> bool {
        self.tracked.contains_key(&pid)
    }

    /// Last time `pid`'s CPU time advanced, CLOCK_MONOTONIC ns.
    pub(crate) fn cpu_changed_ns(&self, pid: u32) -> Option<u64> {
        self.tracked.get(&pid).map(|t| t.cpu_changed_ns)
    }

    /// Latest sample of `pid`.
    pub(crate) fn last(&self, pid: u32) -> Option<ProcSample> {
        self.tracked.get(&pid).map(|t| t.last)
    }

    /// Samples every tracked process; returns (and forgets) those that exited or whose pid now
    /// names another process.
    pub(crate) fn tick(&mut self, now_ns: u64) -> Vec<Gone> {
        let mut gone = Vec::new();
        self.tracked.retain(|&pid, t| match sample(pid) {
            Some(s) if !s.exited && s.start_ticks == t.last.start_ticks => {
                if s.cpu_ticks != t.last.cpu_ticks {
                    t.cpu_changed_ns = now_ns;
                }
                t.last = s;
                true
            }
            Some(s) if s.start_ticks == t.last.start_ticks => {
                gone.push(Gone { pid, exit_code: s.exit_code });
                false
            }
            _ => {
                gone.push(Gone { pid, exit_code: None });
                false
            }
        });
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_sampled_and_alive() {
        let s = sample(std::process::id()).unwrap();
        assert!(!s.exited && s.start_ticks > 0);
        assert!(s.context_switches.is_some());
        assert!(start_ns(std::process::id()).unwrap() <= crate::clock::monotonic_ns());
    }

    #[test]
    fn a_reaped_child_is_reported_gone_with_its_tracker_entry() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        let mut t = ProcTracker::default();
        assert!(t.track(pid, 1));
        assert!(t.tick(2).is_empty());
        child.kill().unwrap();
        child.wait().unwrap();
        let gone = t.tick(3);
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].pid, pid);
        assert!(!t.is_tracked(pid));
    }
}
