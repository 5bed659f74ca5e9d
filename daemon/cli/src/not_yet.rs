//! The error a subcommand returns while the capability behind it has not landed.
//!
//! `nbos` prints it and exits with [`NotYet::EXIT_CODE`], so scripts can tell
//! "not built yet" from a failure of something that exists.

/// A subcommand whose capability is not in this build yet.
#[derive(Debug, thiserror::Error)]
#[error("`nbos {command}` is not available in this build yet: it arrives with {arrives_with}")]
pub struct NotYet {
    /// The subcommand as the user typed it, e.g. `bench raft`.
    pub command: &'static str,
    /// Which piece of work brings it, e.g. `the raft-store (issue 3)`.
    pub arrives_with: &'static str,
}

impl NotYet {
    /// Exit status for a subcommand that is not available yet (distinct from 1 = failed).
    pub const EXIT_CODE: i32 = 3;
}

/// Shorthand: `Err(NotYet { .. }.into())`.
pub fn not_yet<T>(command: &'static str, arrives_with: &'static str) -> anyhow::Result<T> {
    Err(NotYet { command, arrives_with }.into())
}
