//! Signals to processes by pid or process group (kill(2), killpg(2)), and the signal
//! numbers the daemon sends.

/// A signal number.
pub type Signal = libc::c_int;

pub use libc::{SIGCONT, SIGINT, SIGKILL, SIGSTOP};

/// Sends `sig` to process `pid`.
pub fn kill(pid: u32, sig: Signal) -> std::io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| std::io::Error::other("pid out of range"))?;
    // SAFETY: kill(2) only reads its two integer arguments; the pid is positive.
    if unsafe { libc::kill(pid, sig) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Sends `sig` to every process of process group `pgid`.
pub fn kill_group(pgid: u32, sig: Signal) -> std::io::Result<()> {
    let pgid = libc::pid_t::try_from(pgid).map_err(|_| std::io::Error::other("pid out of range"))?;
    // SAFETY: killpg(2) only reads its two integer arguments.
    if unsafe { libc::killpg(pgid, sig) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `e` says the process is gone (ESRCH).
pub fn no_such_process(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::ESRCH)
}

/// Makes `cmd`'s child kill every process it may signal (kill(-1, SIGKILL)) before it
/// execs. Run after std's switch to the command's uid, so as that uid: exactly that uid's
/// processes (kill(-1) spares the caller).
pub fn kill_all_of_own_uid_before_exec(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: runs in the forked child after the switch to the command's uid (std applies
    // uid/gid before pre_exec hooks) and only calls kill(2), which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::kill(-1, libc::SIGKILL);
            Ok(())
        });
    }
}

/// Signals sent by pid or process group, behind a trait: the host's ([`HostSignals`]), or
/// a test's double that records what would be killed.
pub trait ProcessSignals {
    /// Sends `sig` to process `pid` ([`kill`]).
    fn kill(&self, pid: u32, sig: Signal) -> std::io::Result<()>;
    /// Sends `sig` to process group `pgid` ([`kill_group`]).
    fn kill_group(&self, pgid: u32, sig: Signal) -> std::io::Result<()>;
}

/// The host's signals: kill(2) and killpg(2).
#[derive(Debug, Clone, Copy, Default)]
pub struct HostSignals;

impl ProcessSignals for HostSignals {
    fn kill(&self, pid: u32, sig: Signal) -> std::io::Result<()> {
        kill(pid, sig)
    }

    fn kill_group(&self, pgid: u32, sig: Signal) -> std::io::Result<()> {
        kill_group(pgid, sig)
    }
}
