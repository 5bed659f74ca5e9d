//! `tracing` set-up: JSON lines for journald and files, text on a terminal.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::{LogConfig, LogFormat};

/// Installs the global subscriber. `NBOS_LOG` overrides `log.level`.
pub fn init(cfg: &LogConfig) {
    let filter = std::env::var("NBOS_LOG")
        .ok()
        .and_then(|s| EnvFilter::try_new(s).ok())
        .unwrap_or_else(|| EnvFilter::try_new(&cfg.level).unwrap_or_else(|_| EnvFilter::new("info")));
    let json = match cfg.format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    // A second init (tests that start several nodes in one process) is harmless.
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}
