//! Readiness, status and the watchdog for systemd (`Type=notify`).

/// Tells systemd we are ready (with a one-line status `systemctl status` shows) and, when it
/// asks for one, keeps its watchdog fed. `sd_notify::watchdog_enabled` honours
/// `WATCHDOG_PID`: a watchdog meant for another process is not fed.
pub(super) fn systemd_ready(status: &str) -> Option<tokio::task::JoinHandle<()>> {
    let ready = [sd_notify::NotifyState::Ready, sd_notify::NotifyState::Status(status)];
    if let Err(e) = sd_notify::notify(&ready) {
        tracing::debug!(error = %e, "sd_notify READY failed (not under systemd?)");
    }
    let interval = sd_notify::watchdog_enabled().filter(|d| !d.is_zero())?;
    // Ping at half the interval, as sd_watchdog_enabled(3) recommends.
    let period = interval / 2;
    tracing::info!(?period, "systemd watchdog enabled");
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        loop {
            tick.tick().await;
            let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
        }
    }))
}

/// Tells systemd the daemon is stopping (after the last watchdog ping).
pub(super) fn systemd_stopping() {
    let _ = sd_notify::notify(&[
        sd_notify::NotifyState::Stopping,
        sd_notify::NotifyState::Status("stopping: stopping kernels, releasing GPU leases"),
    ]);
}
