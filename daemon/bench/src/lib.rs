//! `nbos-bench`: what the `nbos` CLI runs against real or simulated clusters, as a library.
//!
//! - `nbos bench …`: benchmarks that print human-readable figures, or one JSON object with
//!   `--json` ([`BenchCmd`], one module each); the cluster benches start the test-support
//!   crate's `TestCluster` ([`loopback`]) and drive it with its `CellClient`.
//! - [`replay`]: `nbos replay`, a session template on a real cluster; [`sim`]: `nbos sim`, the
//!   simulator's front end (its files; the simulation itself is `nbos_sched::sim`), with
//!   `--each-window` and `--sweep` in its own files; [`flags`]: numeric flag parsers.
//! - [`client`]: how `nbos` finds and talks to the local daemon; [`progress`]: progress bars.
//!
//! The only crate of the workspace that needs etcd's client (and protoc to build it).

pub mod cell;
pub mod client;
mod costs_file;
pub mod election;
pub mod flags;
pub mod kernel_start;
pub mod kernel_start_owner;
pub mod loopback;
pub mod migration;
pub mod observe;
pub mod progress;
pub mod raft;
pub mod replay;
pub mod shim;
pub mod sim;
mod stats;

/// Which benchmark to run.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCmd {
    /// Raft store: commit latency, throughput, failover, idle-group memory (and etcd side by side).
    Raft(raft::Args),
    /// CUDA shim: per-call overhead, lease acquire latency, evict/restore bandwidth.
    Shim(shim::Args),
    /// eBPF observer: the price of observation per probed call.
    Observe(observe::Args),
    /// Gateway: trivial-cell round trip through the gateway vs straight to ipykernel.
    Cell(cell::Args),
    /// Cluster: executor election latency and state-sync throughput on 3 local hosts.
    Election(election::Args),
    /// Cluster: a cell whose every replica's host is busy, until it runs on a moved replica.
    Migration(migration::Args),
    /// Cluster: a new kernel until its first cell is answered, with and without the pre-warm pool.
    KernelStart(kernel_start::Args),
}

/// Runs the chosen benchmark.
pub fn run(cmd: BenchCmd) -> anyhow::Result<()> {
    match cmd {
        BenchCmd::Raft(a) => raft::run(a),
        BenchCmd::Shim(a) => shim::run(a),
        BenchCmd::Observe(a) => observe::run(a),
        BenchCmd::Cell(a) => cell::run(a),
        BenchCmd::Election(a) => election::run(a),
        BenchCmd::Migration(a) => migration::run(a),
        BenchCmd::KernelStart(a) => kernel_start::run(a),
    }
}
