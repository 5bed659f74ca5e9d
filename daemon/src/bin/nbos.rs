//! `nbos`: the NotebookOS operator CLI.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use notebookosd::cli::{self, client::Target, NotYet};

/// Operate a NotebookOS host: status, kernels, benchmarks, simulation.
#[derive(Debug, Parser)]
#[command(name = "nbos", version, about)]
struct Args {
    #[command(flatten)]
    target: Target,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Show this host: GPUs, kernels, endpoint.
    Status(cli::status::Args),
    /// List kernels, their replicas and who holds which GPU.
    Kernels(cli::kernels::Args),
    /// The hosts of a cluster: status, join, leave.
    #[command(subcommand)]
    Cluster(cli::cluster::ClusterCmd),
    /// Run a benchmark.
    #[command(subcommand)]
    Bench(cli::bench::BenchCmd),
    /// Replay a workload trace under the scheduling policies.
    Sim(cli::sim::Args),
    /// Replay a session template on a real cluster (a loopback one it starts, or --url),
    /// time compressed by --speedup, and report what `nbos sim` reports.
    Replay(cli::replay::Args),
    /// Live view of per-process GPU activity.
    Observe(cli::observe::Args),
    /// Local ZMQ kernel facade that forwards to the gateway (used by kernelspecs).
    KernelProxy(cli::proxy::Args),
    /// A cluster's own CA and certificates (raft TLS, HTTPS, host and client identities).
    #[command(subcommand)]
    Pki(cli::pki::PkiCmd),
    /// Install a Jupyter kernelspec that runs `nbos kernel-proxy` (for nbclient, papermill, VS Code).
    InstallKernelspec(cli::proxy::InstallArgs),
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match args.cmd {
        Cmd::Status(a) => cli::status::run(&args.target, a),
        Cmd::Kernels(a) => cli::kernels::run(&args.target, a),
        Cmd::Cluster(c) => cli::cluster::run(&args.target, c),
        Cmd::Bench(b) => cli::bench::run(b),
        Cmd::Sim(a) => cli::sim::run(a),
        Cmd::Replay(a) => cli::replay::run(&args.target, a),
        Cmd::Pki(c) => cli::pki::run(c),
        Cmd::Observe(a) => cli::observe::run(a),
        Cmd::KernelProxy(a) => {
            // The proxy runs as a kernel: its logs go to stderr, which Jupyter clients show or keep.
            notebookosd::logging::init(&notebookosd::config::LogConfig {
                level: "info,zeromq=warn".to_owned(),
                ..notebookosd::config::LogConfig::default()
            });
            cli::proxy::run(&args.target, a)
        }
        Cmd::InstallKernelspec(a) => cli::proxy::install_kernelspec(&args.target, a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nbos: {e:#}");
            if e.downcast_ref::<NotYet>().is_some() {
                ExitCode::from(NotYet::EXIT_CODE as u8)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
