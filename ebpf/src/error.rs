//! Errors of the observer, named after the operation that failed.

use std::path::PathBuf;

/// Why the observer could not start or answer.
#[derive(Debug, thiserror::Error)]
pub enum ObserverError {
    /// A configured (or discovered) driver library cannot be probed.
    #[error("CUDA driver library {path}: {reason}")]
    Library {
        /// The library path as configured.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A configured GPU device file for the ioctl probe is unusable.
    #[error("GPU device file {path}: {reason}")]
    Device {
        /// The path as configured.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Loading the BPF object into the kernel failed (no permission, old kernel, verifier).
    #[error("loading the eBPF observer programs: {0}")]
    Load(String),
    /// Attaching a program failed.
    #[error("attaching {what}: {reason}")]
    Attach {
        /// What was being attached (symbol and library, or the tracepoint).
        what: String,
        /// The kernel's or aya's answer.
        reason: String,
    },
    /// Reading or writing a BPF map failed.
    #[error("BPF map {map}: {reason}")]
    Map {
        /// The map's name.
        map: &'static str,
        /// The error.
        reason: String,
    },
    /// A shim counters file could not be created or mapped.
    #[error("shim counters file {path}: {source}")]
    Counters {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The observer's background thread could not be started.
    #[error("starting the observer thread: {0}")]
    Thread(std::io::Error),
}

/// An error with its chain of causes: aya's top-level message omits the OS error (e.g.
/// "failed to create map" without "Operation not permitted").
pub(crate) fn with_sources(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        source = s.source();
    }
    msg
}
