//! `ConfigError`: why a configuration could not be used, naming the offending key.

use std::path::PathBuf;

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML, has an unknown key or a value of the wrong type.
    #[error("config {origin}: field `{field}`: {message}")]
    Parse {
        /// Where the text came from (a path, or `<string>`).
        origin: String,
        /// The full dotted path of the offending key.
        field: String,
        /// What is wrong, with the line and column when known.
        message: String,
    },
    /// The value parses but is not acceptable.
    #[error("config {origin}: field `{field}`: {reason}")]
    Invalid {
        /// Where the text came from.
        origin: String,
        /// The full dotted path of the offending key.
        field: &'static str,
        /// Why it is refused.
        reason: String,
    },
}
