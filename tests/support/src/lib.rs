//! What the tests, benches and demo share to run daemons on one machine: the one config
//! builder ([`config::DaemonConfig`], the daemon's own config types serialised with
//! `toml`), the one loopback-cluster layout and launcher ([`layout::Layout`],
//! [`cluster::TestCluster`]), one daemon on its own ([`daemon::start_daemon`]), the one
//! walk of a cell's messages ([`cell_reader::CellReader`]) that both `run_cell`
//! ([`cell::run_cell`], JSON encoding) and [`cell_client::CellClient`] (v1 binary
//! encoding, with the benches' timings) read through, and where the binaries are
//! ([`bins`]). `nbos-test-cluster` prints a layout for the Python test kit
//! (`tests/support/python/nbos_testkit`).

pub mod bins;
pub mod cell;
pub mod cell_client;
pub mod cell_reader;
pub mod cluster;
pub mod config;
pub mod daemon;
pub mod http;
pub mod layout;
pub mod signal;
pub mod unit_sandbox;
pub mod wait;

pub use cell::{run_cell, run_cell_on, CellOutcome};
pub use cluster::{Host, TestCluster};
pub use config::DaemonConfig;
pub use daemon::{start_daemon, start_daemon_in, Daemon};
pub use http::http;
pub use layout::{Layout, Options};
pub use wait::{wait_for, wait_until};

/// The API token of every test daemon and cluster (benches and the Python kit use random ones).
pub const TOKEN: &str = "cluster-test-token-0123456789abcdef";
/// The operator token of every test cluster (membership, drain, re-placement).
pub const OPERATOR_TOKEN: &str = "cluster-test-operator-token-fedcba9876543210";
