//! CLOCK_MONOTONIC, the clock `bpf_ktime_get_ns` reads, so user space and BPF timestamps compare.

use std::time::Duration;

/// Now, CLOCK_MONOTONIC, in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec owned by this frame; CLOCK_MONOTONIC always
    // exists on Linux, so the call cannot fail and only writes `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// Time from `then_ns` to now; zero if `then_ns` is in the future.
pub fn since(then_ns: u64) -> Duration {
    Duration::from_nanos(monotonic_ns().saturating_sub(then_ns))
}
