//! The replay's compressed clock: the workload's time (trace milliseconds) runs `speedup`
//! times faster than the real clock, and whatever is measured in real time converts back
//! to trace time × `speedup` for the report.

use std::time::{Duration, Instant, SystemTime};

use nbos_sched::Millis;

/// Trace time ↔ real time.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
    start_unix_us: u64,
    trace_t0: Millis,
    speedup: f64,
}

/// Now, µs since the Unix epoch (what the daemons' `nbos_election` timestamps use).
pub fn unix_us_now() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(0))
}

impl Clock {
    /// Trace time `trace_t0` is now; `speedup` > 0.
    pub fn start(trace_t0: Millis, speedup: f64) -> Self {
        Self { start: Instant::now(), start_unix_us: unix_us_now(), trace_t0, speedup }
    }

    /// The compression factor.
    pub fn speedup(&self) -> f64 {
        self.speedup
    }

    /// A trace duration compressed to real time.
    pub fn real(&self, trace_ms: Millis) -> Duration {
        #[expect(clippy::cast_precision_loss, reason = "milliseconds of a workload")]
        Duration::from_secs_f64(trace_ms as f64 / 1000.0 / self.speedup)
    }

    /// When trace time `trace_ms` comes on the real clock.
    pub fn instant_at(&self, trace_ms: Millis) -> Instant {
        self.start + self.real(trace_ms.saturating_sub(self.trace_t0))
    }

    /// When trace time `trace_ms` comes, µs since the Unix epoch.
    pub fn unix_us_at(&self, trace_ms: Millis) -> u64 {
        self.start_unix_us + u64::try_from(self.real(trace_ms.saturating_sub(self.trace_t0)).as_micros()).unwrap_or(0)
    }

    /// Real microseconds as trace milliseconds (× speedup).
    #[expect(clippy::cast_precision_loss, reason = "microseconds of a replay")]
    pub fn trace_ms(&self, real_us: u64) -> f64 {
        real_us as f64 / 1000.0 * self.speedup
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_time_is_compressed_and_expanded_by_the_speedup() {
        let c = Clock::start(60_000, 60.0);
        assert_eq!(c.real(120_000), Duration::from_secs(2));
        assert_eq!(c.unix_us_at(180_000) - c.unix_us_at(60_000), 2_000_000);
        assert_eq!(c.unix_us_at(0), c.unix_us_at(60_000), "before the start is the start");
        assert!((c.trace_ms(2_000_000) - 120_000.0).abs() < 1e-6);
    }
}
