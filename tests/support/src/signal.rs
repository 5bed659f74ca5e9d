//! Signals to the daemons a launcher started (its own children, each leading its process
//! group when started with `process_group(0)`).

use std::process::Child;

/// SIGTERM to `child` (graceful stop).
pub fn term(child: &Child) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) on our own child, not reaped yet.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
}

/// SIGKILL to every process of the group `child` leads (the daemon and its kernels).
pub fn kill_group(child: &Child) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: killpg(2) on the process group our own child leads (`process_group(0)`).
        unsafe { libc::killpg(pid, libc::SIGKILL) };
    }
}

/// SIGTERM, then SIGKILL of the group if the daemon does not exit within `grace`; reaps it.
pub fn terminate(child: &mut Child, grace: std::time::Duration) {
    term(child);
    if crate::wait::poll(grace, || child.try_wait().ok().flatten()).is_some() {
        return;
    }
    kill_group(child);
    let _ = child.wait();
}
