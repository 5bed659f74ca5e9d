//! Progress of long CLI operations (drain, join, benchmarks, the simulator) on stderr.
//!
//! Drawn only when stderr is a terminal (indicatif hides it otherwise, so logs and pipes
//! stay clean) and never with `--json`.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// A bar of `len` steps, or a spinner when `len` is 0, prefixed with `what`; hidden when
/// `hidden` (the command prints JSON).
pub fn bar(hidden: bool, len: usize, what: &str) -> ProgressBar {
    if hidden {
        return ProgressBar::hidden();
    }
    let (bar, template) = if len == 0 {
        (ProgressBar::new_spinner(), "{spinner} {elapsed} {prefix}")
    } else {
        (ProgressBar::new(u64::try_from(len).unwrap_or(u64::MAX)), "{bar:30} {pos}/{len} {prefix} {msg} ({elapsed})")
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar.set_prefix(what.to_owned());
    bar
}

/// A spinner that names the stage a multi-stage operation is in (`set_message`), ticking by
/// itself: for benchmarks whose stages run for seconds each with nothing to count.
pub fn stages(hidden: bool, what: &str) -> ProgressBar {
    let spinner = bar(hidden, 0, what);
    if let Ok(style) = ProgressStyle::with_template("{spinner} {elapsed} {prefix} {msg}") {
        spinner.set_style(style);
    }
    spinner.enable_steady_tick(Duration::from_millis(200));
    spinner
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_run_gets_a_hidden_bar_that_still_counts() {
        let b = bar(true, 3, "samples");
        assert!(b.is_hidden());
        b.inc(2);
        assert_eq!(b.position(), 2);
        assert_eq!(bar(false, 0, "joining").length(), None, "a spinner has no length");
        let s = stages(true, "bench");
        s.set_message("loading");
        assert_eq!(s.message(), "loading");
    }
}
