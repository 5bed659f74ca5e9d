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
    let deadline = std::time::Instant::now() + grace;
    while std::time::Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    kill_group(child);
    let _ = child.wait();
}
