//! Polling until a condition holds, for the tests' and launchers' waits.

use std::time::{Duration, Instant};

/// How often a wait looks again.
const POLL_EVERY: Duration = Duration::from_millis(50);

/// Polls `f` until it returns `Some` (that value), or `None` once `within` has passed: the
/// one deadline loop of the support crate; the waits below and the launchers' use it.
pub fn poll<T>(within: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(POLL_EVERY);
    }
}

/// Polls `f` until it returns `Some`, panicking with `what` after `within`.
pub fn wait_for<T>(within: Duration, what: &str, f: impl FnMut() -> Option<T>) -> T {
    poll(within, f).unwrap_or_else(|| panic!("timed out after {within:?} waiting for {what}"))
}

/// Polls `done` until it holds; fails the test after `timeout`, naming `what`.
pub fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    wait_for(timeout, what, || done().then_some(()));
}
