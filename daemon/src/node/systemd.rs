//! Readiness and the watchdog for systemd (`Type=notify`).

/// Tells systemd we are ready and, when it asks for one, keeps its watchdog fed.
pub(super) fn systemd_ready() -> Option<tokio::task::JoinHandle<()>> {
    if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
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
