//! One session of the workload as a kernel of the cluster: created at its compressed
//! start time with the session's GPUs, its trainings run one at a time as cells that
//! hold the kernel's GPUs for `duration ÷ speedup` (`time.sleep`: the daemon's binder
//! commits the kernel's GPUs for the cell whatever it does with them), deleted at its
//! compressed stop time.

use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::clock::{unix_us_now, Clock};
use crate::election::CellClient;
use nbos_sched::sim::workload::Session;
use notebookosd::link::client::GatewayClient;

/// How long a cell may run past its own duration before the replay gives up on it.
const CELL_SLACK: Duration = Duration::from_secs(300);

/// What one cell measured (µs since the Unix epoch; all hosts share the machine's clock
/// or, across machines, must be NTP-synchronised).
#[derive(Debug, Clone)]
pub struct CellRecord {
    /// Its submission: the training's compressed submit time, or the previous cell's
    /// reply if that came later (the notebook runs one cell at a time).
    pub due_unix_us: u64,
    /// The executor wrote it to its ipykernel, its GPUs committed (`nbos_election.dispatched_unix_us`).
    pub started_unix_us: u64,
    /// Its `execute_reply` reached the replay.
    pub replied_unix_us: u64,
    /// GPUs it held (the kernel's: the daemon binds a kernel's GPUs for each of its cells).
    pub gpus: u32,
    /// The host that ran it.
    pub executor: Option<u64>,
}

/// What one session measured.
#[derive(Debug, Clone)]
pub struct SessionRecord {
    /// `POST /api/kernels` sent → answered (the kernel's replicas placed and started).
    pub kernel_start: Duration,
    /// Its kernel's creation was answered (µs since the Unix epoch).
    pub ready_unix_us: u64,
    /// Its cells.
    pub cells: Vec<CellRecord>,
    /// The kernel's deletion was answered.
    pub stopped_unix_us: u64,
}

/// Python for a cell that runs `secs` seconds.
fn cell_code(secs: f64) -> String {
    format!("import time\ntime.sleep({secs:.6})")
}

async fn sleep_until(at: Instant) {
    tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
}

/// Replays session `index` through `gateway` on `clock`.
pub async fn replay(gateway: GatewayClient, index: usize, s: &Session, clock: Clock) -> anyhow::Result<SessionRecord> {
    sleep_until(clock.instant_at(s.start)).await;
    let asked = Instant::now();
    let gpus = s.gpus;
    let g = gateway.clone();
    let model =
        tokio::task::spawn_blocking(move || g.create_kernel(notebookosd::kernel::spec::DEFAULT_SPEC, Some(gpus)))
            .await?
            .with_context(|| format!("session {index}: creating its kernel ({gpus} GPUs)"))?;
    let kernel_start = asked.elapsed();
    let ready_unix_us = unix_us_now();
    tracing::info!(session = index, kernel = %model.id, ms = kernel_start.as_millis(), "kernel started");
    let mut client = CellClient::connect(&gateway, &model.id)
        .await
        .with_context(|| format!("session {index}: opening kernel {}'s channels", model.id))?;
    let mut cells = Vec::with_capacity(s.trainings.len());
    let mut previous_reply = 0;
    for (n, t) in s.trainings.iter().enumerate() {
        sleep_until(clock.instant_at(t.submit)).await;
        let due_unix_us = clock.unix_us_at(t.submit).max(previous_reply);
        let run_for = clock.real(t.duration);
        let (id, sent) = client.send(&cell_code(run_for.as_secs_f64())).await?;
        let run = client
            .wait(&id, sent, run_for + CELL_SLACK)
            .await
            .with_context(|| format!("session {index}, training {n}: waiting for the cell's reply"))?;
        let replied_unix_us = unix_us_now();
        anyhow::ensure!(
            run.reply.get("status").and_then(|v| v.as_str()) == Some("ok"),
            "session {index}, training {n}: the cell failed: {} {}",
            run.reply,
            run.stderr
        );
        let election = run.reply_metadata.get("nbos_election");
        let started_unix_us = election
            .and_then(|e| e.get("dispatched_unix_us"))
            .and_then(serde_json::Value::as_u64)
            .with_context(|| {
                format!(
                    "session {index}, training {n}: the reply has no nbos_election.dispatched_unix_us \
                     (is {} a NotebookOS cluster?): {}",
                    gateway.url, run.reply_metadata
                )
            })?;
        cells.push(CellRecord {
            due_unix_us,
            started_unix_us,
            replied_unix_us,
            gpus,
            executor: election.and_then(|e| e.get("node_id")).and_then(serde_json::Value::as_u64),
        });
        previous_reply = replied_unix_us;
    }
    drop(client);
    sleep_until(clock.instant_at(s.stop)).await;
    let g = gateway.clone();
    let id = model.id.clone();
    tokio::task::spawn_blocking(move || g.delete_kernel(&id))
        .await?
        .with_context(|| format!("session {index}: deleting kernel {}", model.id))?;
    Ok(SessionRecord { kernel_start, ready_unix_us, cells, stopped_unix_us: unix_us_now() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_sleeps_for_its_compressed_duration() {
        assert_eq!(cell_code(1.5), "import time\ntime.sleep(1.500000)");
    }
}
