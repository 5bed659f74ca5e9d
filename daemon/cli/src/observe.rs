//! `nbos observe`: a live view of per-process GPU activity from this host's observer
//! (eBPF uprobes on the CUDA driver, or the procfs fallback), as a refreshing table or as one
//! JSON object per refresh for scripts. Counts start when the command starts.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use nbos_ebpf::{ModeRequest, Observer, ObserverConfig, ProcessActivity};
use serde::Serialize;

/// Options of `nbos observe`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Show only this process (and stop when it exits).
    #[arg(long)]
    pub pid: Option<u32>,
    /// Print one JSON object per refresh (newline-delimited) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Time between refreshes, e.g. `1s`, `500ms`.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// Stop after this many refreshes (default: run until interrupted).
    #[arg(long)]
    pub count: Option<u64>,
    /// CUDA driver library to probe (repeatable); default: discovered with `ldconfig -p`.
    #[arg(long = "library")]
    pub libraries: Vec<PathBuf>,
    /// `auto` (eBPF, else procfs), `ebpf`, or `procfs`.
    #[arg(long, default_value = "auto", value_parser = parse_mode)]
    pub mode: ModeRequest,
    /// The shim's counters directory.
    #[arg(long, default_value = nbos_ebpf::DEFAULT_COUNTERS_DIR)]
    pub counters_dir: PathBuf,
}

fn parse_mode(s: &str) -> Result<ModeRequest, String> {
    match s {
        "auto" => Ok(ModeRequest::Auto),
        "ebpf" => Ok(ModeRequest::Ebpf),
        "procfs" => Ok(ModeRequest::Procfs),
        other => Err(format!("unknown mode {other:?}: use auto, ebpf or procfs")),
    }
}

/// One row of the view.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// Thread group id.
    pub pid: u32,
    /// Process name.
    pub process: String,
    /// Launches per second over the last interval.
    pub launches_per_s: f64,
    /// Copies per second.
    pub copies_per_s: f64,
    /// Bytes copied per second.
    pub bytes_per_s: f64,
    /// Time since its last GPU call, seconds.
    pub idle_for_s: f64,
    /// Totals since the view started.
    pub launches: u64,
    /// Copies since the view started.
    pub copies: u64,
    /// Bytes copied since the view started.
    pub copy_bytes: u64,
}

/// One refresh, as printed with `--json`.
#[derive(Debug, Serialize)]
struct Frame<'a> {
    mode: &'a str,
    interval_s: f64,
    processes: &'a [Row],
}

/// Rates from two snapshots of the same process `elapsed` apart (`before` is `None` for a process
/// first seen in this interval, whose counts all fall in it).
pub fn row(now: &ProcessActivity, before: Option<&ProcessActivity>, elapsed: Duration, idle_for: Duration) -> Row {
    let secs = elapsed.as_secs_f64().max(1e-9);
    let rate = |n: u64, b: u64| n.saturating_sub(b) as f64 / secs;
    let (bl, bc, bb) = before.map_or((0, 0, 0), |b| (b.launches, b.copies, b.copy_bytes));
    Row {
        pid: now.pid,
        process: now.comm.clone(),
        launches_per_s: rate(now.launches, bl),
        copies_per_s: rate(now.copies, bc),
        bytes_per_s: rate(now.copy_bytes, bb),
        idle_for_s: idle_for.as_secs_f64(),
        launches: now.launches,
        copies: now.copies,
        copy_bytes: now.copy_bytes,
    }
}

/// Bytes with a binary unit, for the table.
pub fn human_bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0} {}", UNITS[i])
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

/// The table, busiest first.
pub fn table(mode: &str, rows: &[Row]) -> String {
    let mut out = format!("GPU activity ({mode} mode)\n");
    out.push_str(&format!(
        "{:>8}  {:<16} {:>12} {:>10} {:>12} {:>10}\n",
        "PID", "PROCESS", "LAUNCHES/S", "COPIES/S", "BYTES/S", "IDLE FOR"
    ));
    for r in rows {
        out.push_str(&format!(
            "{:>8}  {:<16} {:>12.0} {:>10.0} {:>12} {:>9.1}s\n",
            r.pid,
            r.process,
            r.launches_per_s,
            r.copies_per_s,
            human_bytes(r.bytes_per_s),
            r.idle_for_s
        ));
    }
    if rows.is_empty() {
        out.push_str("(no process has made an observed GPU call yet)\n");
    }
    out
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    let Args { pid, json, interval, count, libraries, mode, counters_dir } = args;
    let config = ObserverConfig { mode, libraries, counters_dir: Some(counters_dir), ..ObserverConfig::default() };
    let observer = Observer::start(config).context("starting the GPU activity observer")?;
    if let Some(p) = pid {
        observer.watch(p).with_context(|| format!("watching pid {p}"))?;
    }
    let mut exits = observer.exit_events();
    let tty = std::io::stdout().is_terminal() && !json;
    let mut previous: HashMap<u32, ProcessActivity> = HashMap::new();
    let mut last = Instant::now();
    let mut frames = 0u64;
    loop {
        std::thread::sleep(interval);
        let elapsed = last.elapsed();
        last = Instant::now();
        let mut snaps = match pid {
            Some(p) => observer.snapshot(p).into_iter().collect(),
            None => observer.snapshot_all(),
        };
        snaps.sort_by_key(|a| a.pid);
        let mut rows: Vec<Row> = snaps
            .iter()
            .map(|a| row(a, previous.get(&a.pid), elapsed, observer.idle_for(a.pid).unwrap_or_default()))
            .collect();
        rows.sort_by(|a, b| b.launches_per_s.total_cmp(&a.launches_per_s).then(a.pid.cmp(&b.pid)));
        previous = snaps.into_iter().map(|a| (a.pid, a)).collect();
        let mut out = std::io::stdout().lock();
        if json {
            let frame = Frame { mode: observer.mode().as_str(), interval_s: elapsed.as_secs_f64(), processes: &rows };
            writeln!(out, "{}", serde_json::to_string(&frame)?)?;
        } else {
            if tty {
                write!(out, "\x1b[2J\x1b[H")?;
            }
            write!(out, "{}", table(observer.mode().as_str(), &rows))?;
        }
        out.flush()?;
        frames += 1;
        let watched_exited = std::iter::from_fn(|| exits.try_recv().ok()).any(|e| Some(e.pid) == pid);
        if watched_exited {
            eprintln!("process {} exited", pid.unwrap_or_default());
            return Ok(());
        }
        if count.is_some_and(|c| frames >= c) {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn activity(pid: u32, launches: u64, copies: u64, bytes: u64) -> ProcessActivity {
        ProcessActivity { pid, comm: "python".into(), launches, copies, copy_bytes: bytes, ..Default::default() }
    }

    #[test]
    fn rates_are_deltas_over_the_interval() {
        let before = activity(7, 100, 10, 1 << 20);
        let now = activity(7, 300, 14, 3 << 20);
        let r = row(&now, Some(&before), Duration::from_secs(2), Duration::from_millis(1500));
        assert_eq!((r.launches_per_s, r.copies_per_s, r.bytes_per_s), (100.0, 2.0, f64::from(1 << 20)));
        assert_eq!(r.idle_for_s, 1.5);
        let first = row(&now, None, Duration::from_secs(1), Duration::ZERO);
        assert_eq!(first.launches_per_s, 300.0);
    }

    #[test]
    fn table_shows_every_column_and_an_empty_hint() {
        let r = row(&activity(42, 10, 1, 2048), None, Duration::from_secs(1), Duration::from_secs(3));
        let t = table("ebpf", &[r]);
        for col in
            ["PID", "PROCESS", "LAUNCHES/S", "COPIES/S", "BYTES/S", "IDLE FOR", "42", "python", "2.0 KiB", "3.0s"]
        {
            assert!(t.contains(col), "{col} missing in\n{t}");
        }
        assert!(table("procfs", &[]).contains("no process"));
    }

    #[test]
    fn bytes_get_binary_units() {
        assert_eq!(human_bytes(512.0), "512 B");
        assert_eq!(human_bytes(1536.0), "1.5 KiB");
        assert_eq!(human_bytes(3.0 * 1024.0 * 1024.0 * 1024.0), "3.0 GiB");
    }

    #[test]
    fn unknown_mode_is_refused_with_the_choices() {
        assert!(parse_mode("kprobe").unwrap_err().contains("auto, ebpf or procfs"));
        assert_eq!(parse_mode("procfs"), Ok(ModeRequest::Procfs));
    }
}
