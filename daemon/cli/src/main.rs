//! `nbos`: the NotebookOS operator CLI.

use std::process::ExitCode;

use clap::{FromArgMatches as _, Parser, Subcommand};
use nbos_cli::{self as cli, client::ConnectArgs, NotYet};

/// Operate a NotebookOS host: status, kernels, benchmarks, simulation.
#[derive(Debug, Parser)]
#[command(
    name = "nbos",
    version,
    about = "NotebookOS operator CLI: hosts, kernels, cluster membership, benchmarks, simulation"
)]
struct Args {
    #[command(flatten)]
    target: ConnectArgs,
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
    /// The cluster's large-object store: what it holds, and collecting what no replica needs.
    #[command(subcommand)]
    Objects(cli::objects::ObjectsCmd),
    /// Run a benchmark.
    #[command(subcommand)]
    Bench(cli::bench::BenchCmd),
    /// The fault campaign's checks (the campaign itself: `make chaos`, docs/chaos.md).
    #[command(subcommand)]
    Chaos(cli::chaos::ChaosCmd),
    /// Replay a workload trace under the scheduling policies.
    Sim(Box<cli::sim::Args>),
    /// Replay a session template or a trace slice (--trace) on a real cluster (a loopback
    /// one it starts, or --url), time compressed by --speedup, and report what `nbos sim` reports.
    #[command(after_long_help = "\
Sessions become kernels (created at their compressed start with the session's GPUs, deleted \
at their stop); trainings become cells that sleep for duration / K while the daemon's binder \
holds the kernel's GPUs. Measured per cell: submission -> the executor wrote the cell to \
ipykernel with its GPUs committed (the reply's nbos_election.dispatched_unix_us); GPUs \
committed and idle-held: the hosts' /metrics gauges, sampled every --sample-ms; provisioned: \
the GPUs of the hosts that are up, sampled with them. Every real time is multiplied by K back into trace time. Migrations \
and scale events are read from /metrics counters when the daemons have them, else 0.

The output prints the nbos sim flags that model the same cluster; docs/simulator.md \
(\"Replay against a real cluster\") gives the tolerance within which both agree.

With --trace, a slice of a trace (its sessions generated as nbos sim generates them) runs on \
a loopback cluster at the daemon's defaults that autoscales through the exec provider \
(examples/autoscale/local-dev-provider.py), and each figure is compared with nbos sim of the \
same cluster and slice within a stated tolerance (\"replay\".comparison).

Example: nbos replay traces/templates/single_session_3_trainings.json --speedup 10 --json
Example: nbos replay --trace traces/sensei_june_60sec.csv --start-min 6960 --hours 1 --speedup 60 --hosts 4")]
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
    /// Print a shell completion script (e.g. `nbos completions bash > /etc/bash_completion.d/nbos`).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Write the manual pages nbos(1) and nbos-SUBCOMMAND(1) into DIR (used to build the packages).
    #[command(hide = true)]
    Manpages {
        /// Where to write them.
        dir: std::path::PathBuf,
    },
}

/// The subcommands that never talk to a daemon: the connection flags (global, so that
/// `nbos --url U status` and `nbos status --url U` both work) stay accepted there but are
/// left out of their help, which then lists only what the subcommand uses.
const OFFLINE: [&str; 6] = ["sim", "bench", "chaos", "pki", "observe", "completions"];

/// The command line: `Args` with the connection flags hidden in [`OFFLINE`] subcommands.
fn command() -> clap::Command {
    let cmd = <Args as clap::CommandFactory>::command();
    // A subcommand that already has an argument of a global's id does not get the global
    // propagated: give it a hidden copy first.
    let hidden: Vec<clap::Arg> =
        cmd.get_arguments().filter(|a| a.is_global_set()).map(|a| a.clone().hide(true)).collect();
    OFFLINE.iter().fold(cmd, |cmd, name| cmd.mut_subcommand(name, |sc| sc.args(hidden.iter().cloned())))
}

fn main() -> ExitCode {
    let args = match Args::from_arg_matches(&command().get_matches()) {
        Ok(args) => args,
        Err(e) => e.exit(),
    };
    if let Err(e) = args.target.check() {
        eprintln!("nbos: {e:#}");
        return ExitCode::from(2);
    }
    if matches!(
        args.cmd,
        Cmd::Status(_)
            | Cmd::Kernels(_)
            | Cmd::Cluster(_)
            | Cmd::Objects(_)
            | Cmd::Sim(_)
            | Cmd::Pki(_)
            | Cmd::Completions { .. }
    ) {
        quiet_on_a_closed_pipe();
    }
    let result = match args.cmd {
        Cmd::Status(a) => cli::status::run(&args.target, a),
        Cmd::Kernels(a) => cli::kernels::run(&args.target, a),
        Cmd::Cluster(c) => cli::cluster::run(&args.target, c),
        Cmd::Objects(c) => cli::objects::run(&args.target, c),
        Cmd::Bench(b) => cli::bench::run(b),
        Cmd::Chaos(c) => cli::chaos::run(c),
        Cmd::Sim(a) => cli::sim::run(*a),
        Cmd::Replay(a) => cli::replay::run(&args.target, a),
        Cmd::Pki(c) => cli::pki::run(c),
        Cmd::Observe(a) => cli::observe::run(a),
        Cmd::KernelProxy(a) => {
            // The proxy runs as a kernel: its stderr is the Jupyter server's terminal or log, so
            // it says only what needs a person (a gateway lost, a failover), as plain text.
            // `NBOS_LOG=info` (any filter) asks for more.
            notebookosd::logging::init(&notebookosd::config::LogConfig {
                level: "warn,zeromq=error".to_owned(),
                format: notebookosd::config::LogFormat::Text,
            });
            cli::proxy::run(&args.target, a)
        }
        Cmd::InstallKernelspec(a) => cli::proxy::install_kernelspec(&args.target, a),
        Cmd::Completions { shell } => {
            clap_complete::generate(shell, &mut command(), "nbos", &mut std::io::stdout());
            Ok(())
        }
        Cmd::Manpages { dir } => manpages(&dir),
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

/// `nbos kernels | head`: a reader that stops early ends the command quietly, as it does
/// `ls` (death by SIGPIPE), not with a panic and a backtrace from `println!`. Only for the
/// commands that print a result and exit: the long-running ones (the kernel proxy, benches,
/// replays) write to sockets and pipes whose peers may go, and must see EPIPE instead.
fn quiet_on_a_closed_pipe() {
    // SAFETY: called on the main thread before any other thread starts; SIG_DFL is a valid
    // disposition for SIGPIPE and no handler of ours is replaced.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// nbos(1) and a page per subcommand (nbos-cluster(1), nbos-cluster-join(1), …).
fn manpages(dir: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let cmd = command();
    clap_mangen::generate_to(cmd, dir).with_context(|| format!("writing manual pages into {}", dir.display()))
}
