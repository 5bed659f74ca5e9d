//! Polling until a condition holds, for the tests' and launchers' waits.

use std::time::{Duration, Instant};

/// Polls `f` until it returns `Some`, panicking with `what` after `within`.
pub fn wait_for<T>(within: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {within:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls `done` until it holds; fails the test after `timeout`, naming `what`.
pub fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    wait_for(timeout, what, || done().then_some(()));
}
