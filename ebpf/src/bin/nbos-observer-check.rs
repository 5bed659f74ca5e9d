//! `nbos-observer-check [--mode auto|ebpf|procfs] [--library PATH]... [--counters-dir DIR] [--pid P]`:
//! starts the GPU activity observer the way the daemon does, prints which mode it got as one
//! JSON object (with `--pid`, also that process's `snapshot` and `idle_for`), and exits.
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
    let mut pid: Option<u32> = None;
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
            ("--counters-dir", Some(d)) => config.counters_dir = Some(PathBuf::from(d)),
            ("--pid", Some(p)) => match p.parse() {
                Ok(p) => pid = Some(p),
                Err(e) => return usage(&format!("--pid {p:?}: {e}")),
            },
            (other, _) => return usage(&format!("unexpected argument {other:?}")),
        }
    }
    match Observer::start(config) {
        Ok(o) => {
            let mut out = serde_json::json!({
                "mode": o.mode().as_str(),
                "uprobes": o.probe_count(),
                "libraries": o.libraries(),
            });
            if let Some(p) = pid {
                out["pid"] = p.into();
                out["snapshot"] = serde_json::to_value(o.snapshot(p)).unwrap_or_default();
                out["idle_for_ms"] = o.idle_for(p).map(|d| d.as_millis() as u64).into();
            }
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
        "nbos-observer-check: {problem}\nusage: nbos-observer-check [--mode auto|ebpf|procfs] [--library PATH]... \
         [--counters-dir DIR] [--pid P]"
    );
    ExitCode::from(2)
}
