//! Bridges raft's `slog` logging into `tracing`.

/// A slog drain that forwards records to `tracing` (raft's own chatter goes to debug level).
pub(crate) struct TracingDrain;

impl slog::Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &slog::Record<'_>, _values: &slog::OwnedKVList) -> Result<(), slog::Never> {
        match record.level() {
            slog::Level::Critical | slog::Level::Error => tracing::warn!(target: "raft", "{}", record.msg()),
            slog::Level::Warning | slog::Level::Info => tracing::debug!(target: "raft", "{}", record.msg()),
            _ => tracing::trace!(target: "raft", "{}", record.msg()),
        }
        Ok(())
    }
}
