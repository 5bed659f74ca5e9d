//! `nbos-observer-check [--mode auto|ebpf|procfs] [--library PATH]...`: starts the GPU activity
//! observer the way the daemon does, prints which mode it got as one JSON object, and exits.
//! Operators run it to see whether eBPF works on a host; the tests run it without privileges.

use std::path::PathBuf;
use std::process::ExitCode;

use nbos_ebpf::{ModeRequest, Observer, ObserverConfig};

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let mut config = ObserverConfig { counters_dir: None, ..ObserverConfig::default() };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--mode", Some(m)) => {
                config.mode = match m.as_str() {
                    "auto" => ModeRequest::Auto,
                    "ebpf" => ModeRequest::Ebpf,
                    "procfs" => ModeRequest::Procfs,
                    other => return usage(&format!("unknown mode {other:?}")),
                }
            }
            ("--library", Some(p)) => config.libraries.push(PathBuf::from(p)),
            (other, _) => return usage(&format!("unexpected argument {other:?}")),
        }
    }
    match Observer::start(config) {
        Ok(o) => {
            let out = serde_json::json!({
                "mode": o.mode().as_str(),
                "uprobes": o.probe_count(),
                "libraries": o.libraries(),
            });
            println!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("nbos-observer-check: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage(problem: &str) -> ExitCode {
    eprintln!(
        "nbos-observer-check: {problem}\nusage: nbos-observer-check [--mode auto|ebpf|procfs] [--library PATH]..."
    );
    ExitCode::from(2)
}
