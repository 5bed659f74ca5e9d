//! The endpoint file: what a running daemon tells local clients (`nbos`, the kernel
//! proxy, benches) about where its API is and where its token lives. The daemon writes it
//! in its runtime directory once it listens; clients read it when given no URL.

use std::path::PathBuf;

/// What a running node tells whoever started it, once it listens.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Endpoint {
    /// Base URL of the HTTP API.
    pub url: String,
    /// Process id of the daemon.
    pub pid: u32,
    /// File holding the API token, if the API needs one.
    pub token_file: Option<PathBuf>,
    /// Durable state directory.
    pub state_dir: PathBuf,
}

/// Name of the file in `runtime_dir` where a running node describes its endpoint.
pub const ENDPOINT_FILE: &str = "endpoint.json";

/// Runtime directory of a packaged daemon (where its endpoint file lives).
pub fn default_runtime_dir() -> PathBuf {
    PathBuf::from("/run/notebookos")
}
