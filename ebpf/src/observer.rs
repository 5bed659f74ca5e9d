//! `Observer`: the API the daemon embeds. Picks eBPF or procfs, runs the background thread
//! that delivers exit events and folds counts into metrics, and answers `snapshot`/`idle_for`.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use aya::maps::{MapData, RingBuf};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::mpsc::{channel, Receiver, Sender};

use crate::activity::{ExitEvent, Mode, ProcessActivity, Sources};
use crate::bpf_abi::{comm_to_string, RawActivity, RawExitEvent};
use crate::clock::{monotonic_ns, since};
use crate::config::{ModeRequest, ObserverConfig};
use crate::driver_library::{self, DriverLibrary};
use crate::ebpf_backend::EbpfBackend;
use crate::entry_points::{CallKind, EntryPoint, ENTRY_POINTS};
use crate::error::ObserverError;
use crate::metrics::{KernelLabels, ObserverMetrics};
use crate::procfs_sampler::{self, ProcTracker};
use crate::shim_counters::{self, ShimCounts};

/// Label for processes the daemon has not named.
const UNMANAGED: &str = "unmanaged";

/// Observes per-process GPU activity. Dropping it detaches the probes and stops its thread.
pub struct Observer {
    shared: Arc<Shared>,
    worker: Option<JoinHandle<()>>,
}

struct Shared {
    mode: Mode,
    counters_dir: Option<PathBuf>,
    libraries: Vec<PathBuf>,
    probes: usize,
    state: Mutex<State>,
    subscribers: Mutex<Vec<Sender<ExitEvent>>>,
    /// Capacity of each subscriber's queue (at least 1).
    exit_queue: usize,
    stop: AtomicBool,
    metrics: ObserverMetrics,
}

struct State {
    /// `None` in procfs mode.
    bpf: Option<EbpfBackend>,
    procs: ProcTracker,
    /// Kernel label per pid, for metrics.
    labels: HashMap<u32, String>,
    /// Counters-file changes seen, per pid.
    counter_seen: HashMap<u32, CounterSeen>,
    /// Exit drops already added to the metric.
    drops_folded: u64,
    /// Counts already added to the Prometheus counters, per pid.
    folded: HashMap<u32, ProcessActivity>,
    /// The shim's lease-protocol `Activity` reports: gated calls and when the count last grew.
    lease_reports: HashMap<u32, LeaseReport>,
}

/// When the observer saw a process's counters file change (the reference shim stamps no time).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct CounterSeen {
    calls: u64,
    first_ns: u64,
    changed_ns: u64,
    /// The file's owner, checked against the live process's uids: after the process is gone
    /// (its final counts) the file is believed only with this owner.
    owner: u32,
}

impl CounterSeen {
    /// The (first, latest) activity times implied by reading `calls` at `now`, given what was
    /// seen before: a count never seen, or different from the last one, changed just now.
    fn times(seen: Option<&CounterSeen>, calls: u64, now: u64) -> (u64, u64) {
        match seen {
            None if calls > 0 => (now, now),
            None => (0, 0),
            Some(s) if s.calls != calls => (if s.first_ns == 0 { now } else { s.first_ns }, now),
            Some(s) => (s.first_ns, s.changed_ns),
        }
    }
}

/// The latest `Activity { calls }` of one process, and when its count last grew.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct LeaseReport {
    calls: u64,
    changed_ns: u64,
}

impl Observer {
    /// Validates the configured libraries, loads and attaches the BPF programs (or falls back to
    /// procfs when `mode = auto` and BPF is not permitted), and starts the background thread.
    pub fn start(config: ObserverConfig) -> Result<Self, ObserverError> {
        let ObserverConfig {
            mode,
            libraries,
            launch_probes,
            ioctl_probe,
            ioctl_devices,
            counters_dir,
            max_processes,
            poll_interval,
            metrics_interval,
            exit_queue,
        } = config;
        let wanted: Vec<EntryPoint> =
            ENTRY_POINTS.iter().filter(|e| launch_probes || e.kind != CallKind::Launch).copied().collect();
        // Configured paths are checked in every mode: a wrong path is a config error to fix,
        // not something to discover only once BPF becomes available.
        let libs: Vec<DriverLibrary> = if mode == ModeRequest::Procfs && libraries.is_empty() {
            Vec::new()
        } else {
            driver_library::resolve(&libraries, &wanted)?
        };

        let devices = if ioctl_probe { Some(crate::gpu_devices::resolve(&ioctl_devices)?) } else { None };
        let (bpf, ring) = match mode {
            ModeRequest::Procfs => (None, None),
            ModeRequest::Ebpf => {
                let (b, r) = EbpfBackend::load(&libs, max_processes, devices.as_deref())?;
                (Some(b), Some(r))
            }
            ModeRequest::Auto => match EbpfBackend::load(&libs, max_processes, devices.as_deref()) {
                Ok((b, r)) => (Some(b), Some(r)),
                Err(e) => {
                    tracing::warn!(
                        error = %e,
                        "eBPF GPU observer unavailable; falling back to procfs mode \
                         (CPU time, context switches and shim counters; exits found by polling)"
                    );
                    (None, None)
                }
            },
        };
        let mode = if bpf.is_some() { Mode::Ebpf } else { Mode::Procfs };
        let probes = bpf.as_ref().map_or(0, |b| b.probes);
        if mode == Mode::Ebpf && libs.is_empty() {
            tracing::warn!("no CUDA driver library found to probe; observing process exits and shim counters only");
        }
        let metrics = ObserverMetrics::default();
        metrics.set_mode(mode);
        let shared = Arc::new(Shared {
            mode,
            counters_dir,
            libraries: libs.iter().map(|l| l.path.clone()).collect(),
            probes,
            state: Mutex::new(State {
                bpf,
                procs: ProcTracker::default(),
                labels: HashMap::new(),
                folded: HashMap::new(),
                drops_folded: 0,
                counter_seen: HashMap::new(),
                lease_reports: HashMap::new(),
            }),
            subscribers: Mutex::new(Vec::new()),
            exit_queue: exit_queue.max(1),
            stop: AtomicBool::new(false),
            metrics,
        });
        tracing::info!(
            mode = %mode,
            uprobes = probes,
            libraries = ?shared.libraries,
            launch_probes,
            ioctl_devices = devices.as_ref().map(Vec::len),
            "GPU activity observer started"
        );
        let worker_shared = Arc::clone(&shared);
        let worker = std::thread::Builder::new()
            .name("nbos-observer".into())
            .spawn(move || worker_shared.run(ring, poll_interval, metrics_interval))
            .map_err(ObserverError::Thread)?;
        Ok(Self { shared, worker: Some(worker) })
    }

    /// The active mode.
    pub fn mode(&self) -> Mode {
        self.shared.mode
    }

    /// Driver libraries probed (empty in procfs mode unless configured).
    pub fn libraries(&self) -> &[PathBuf] {
        &self.shared.libraries
    }

    /// Number of uprobes attached.
    pub fn probe_count(&self) -> usize {
        self.shared.probes
    }

    /// The metrics, to register with the daemon's registry.
    pub fn metrics(&self) -> &ObserverMetrics {
        &self.shared.metrics
    }

    /// GPU activity of `pid`; `None` if it has made no observed GPU call.
    pub fn snapshot(&self, pid: u32) -> Option<ProcessActivity> {
        let state = self.shared.lock();
        self.shared.activity_of(&state, pid)
    }

    /// Every process with observed GPU activity, by pid.
    pub fn snapshot_all(&self) -> Vec<ProcessActivity> {
        let state = self.shared.lock();
        let mut pids: Vec<u32> =
            state.bpf.as_ref().map(|b| b.all().into_iter().map(|(p, _)| p).collect()).unwrap_or_default();
        if let Some(dir) = &self.shared.counters_dir {
            pids.extend(shim_counters::list(dir));
        }
        pids.extend(state.lease_reports.keys());
        pids.sort_unstable();
        pids.dedup();
        pids.into_iter().filter_map(|p| self.shared.activity_of(&state, p)).collect()
    }

    /// How long `pid` has done no GPU work: since its last observed GPU call, or since it
    /// started if it made none. In procfs mode a process without shim counters counts as
    /// active while its CPU time advances. `None` when there is no such process.
    pub fn idle_for(&self, pid: u32) -> Option<Duration> {
        let mut state = self.shared.lock();
        let gpu_last = self.shared.activity_of(&state, pid).map(|a| a.last_activity_ns).filter(|&t| t > 0);
        let alive = procfs_sampler::start_ns(pid);
        if self.shared.mode == Mode::Procfs {
            let now = monotonic_ns();
            if alive.is_some() {
                state.procs.track(pid, now);
            }
            let cpu_last = if gpu_last.is_none() { state.procs.cpu_changed_ns(pid) } else { None };
            return gpu_last.or(cpu_last).or(alive).map(since);
        }
        match gpu_last {
            Some(t) => Some(since(t)),
            None => alive.map(since),
        }
    }

    /// A new stream of exit events of processes that had GPU activity or were watched.
    /// Works in blocking code (`blocking_recv`) and in async code (`recv().await`). The queue
    /// holds `exit_queue` events: a subscriber that stops reading loses the newer ones (counted
    /// in `notebookos_observer_exit_events_lagged_total`) instead of growing memory without bound.
    pub fn exit_events(&self) -> Receiver<ExitEvent> {
        let (tx, rx) = channel(self.shared.exit_queue);
        lock(&self.shared.subscribers).push(tx);
        rx
    }

    /// Reports `pid`'s exit on the event stream even if it never uses the GPU (kernel processes).
    pub fn watch(&self, pid: u32) -> Result<(), ObserverError> {
        let mut state = self.shared.lock();
        match (state.bpf.as_mut(), NonZeroU32::new(pid)) {
            (Some(bpf), Some(pid)) => bpf.watch(pid)?,
            (Some(_), None) => {}
            // Procfs mode finds exits by sampling the processes it tracks.
            (None, _) => {
                state.procs.track(pid, monotonic_ns());
            }
        }
        Ok(())
    }

    /// Feeds a shim's lease-protocol `Activity { calls }` report (gated calls since the process
    /// started) for `pid`: the process counts as GPU-active when the number grows, and its exit
    /// will be reported. The lease server calls this; the count is trusted only about `pid`,
    /// whose identity the server checked with `SO_PEERCRED`.
    pub fn record_shim_activity(&self, pid: u32, calls: u64) -> Result<(), ObserverError> {
        let now = monotonic_ns();
        let first = {
            let mut state = self.shared.lock();
            let entry = state.lease_reports.entry(pid).or_insert(LeaseReport { calls: 0, changed_ns: 0 });
            let first = entry.changed_ns == 0;
            if calls > entry.calls || first {
                *entry = LeaseReport { calls: calls.max(entry.calls), changed_ns: now };
            }
            first
        };
        if first {
            self.watch(pid)?;
        }
        Ok(())
    }

    /// Names the notebook kernel `pid` belongs to, for the `kernel` label of the metrics.
    pub fn set_kernel_label(&self, pid: u32, kernel: impl Into<String>) {
        self.shared.lock().labels.insert(pid, kernel.into());
    }

    /// Folds the current counts into the metrics now (the thread does it every `metrics_interval`).
    pub fn refresh_metrics(&self) {
        self.shared.sweep();
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(worker) = self.worker.take() {
            worker.thread().unpark();
            if worker.join().is_err() {
                tracing::error!("observer thread panicked");
            }
        }
    }
}

/// Locks a mutex, taking the data even if a panicking thread poisoned it (the state stays
/// consistent: every update is a single insert or remove).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// `pid`'s counters, from a file owned by one of the live process's uids, or once it is
    /// gone by `known_owner` (the owner seen while it lived). Another owner's file is ignored
    /// here; [`Self::note_counters`] counts and removes it.
    fn counters(&self, pid: u32, known_owner: Option<u32>) -> Option<ShimCounts> {
        let dir = self.counters_dir.as_deref()?;
        let live = shim_counters::process_uids(pid);
        let owner_ok = |owner: u32| match live {
            Some(uids) => uids.contains(&owner),
            None => known_owner == Some(owner),
        };
        shim_counters::read_owned(dir, pid, owner_ok).ok().flatten().map(|(c, _)| c)
    }

    fn activity_of(&self, state: &State, pid: u32) -> Option<ProcessActivity> {
        let raw = match state.bpf.as_ref().map(|b| b.activity(pid)) {
            Some(Ok(a)) => a,
            Some(Err(e)) => {
                self.metrics.errors.inc();
                tracing::debug!(pid, error = %e, "reading activity map");
                None
            }
            None => None,
        };
        let shim = self.counters(pid, state.counter_seen.get(&pid).map(|s| s.owner)).map(|mut c| {
            let (first, last) = CounterSeen::times(state.counter_seen.get(&pid), c.calls(), monotonic_ns());
            c.first_ns = [c.first_ns, first].into_iter().filter(|&t| t > 0).min().unwrap_or(0);
            c.last_ns = c.last_ns.max(last);
            c
        });
        let mut a = merge(pid, raw.as_ref(), shim.as_ref(), state.lease_reports.get(&pid))?;
        if self.mode == Mode::Procfs {
            if let Some(s) = state.procs.last(pid).or_else(|| procfs_sampler::sample(pid)) {
                a.cpu_time_ns = Some(procfs_sampler::ticks_to_ns(s.cpu_ticks));
                a.context_switches = s.context_switches;
            }
        }
        Some(a)
    }

    fn run(&self, mut ring: Option<RingBuf<MapData>>, poll_interval: Duration, metrics_interval: Duration) {
        let timeout_ms = i32::try_from(poll_interval.as_millis()).unwrap_or(i32::MAX).max(1);
        let mut last_sweep = monotonic_ns();
        while !self.stop.load(Ordering::Relaxed) {
            match ring.as_mut() {
                Some(ring) => {
                    wait_readable(ring, timeout_ms);
                    while let Some(item) = ring.next() {
                        match RawExitEvent::from_bytes(&item) {
                            Some(raw) => self.deliver_bpf_exit(raw),
                            None => {
                                self.metrics.errors.inc();
                                tracing::error!(len = item.len(), "short exit record on the ring buffer");
                            }
                        }
                    }
                }
                None => {
                    std::thread::park_timeout(poll_interval);
                    self.poll_procfs();
                }
            }
            self.note_counters();
            if since(last_sweep) >= metrics_interval {
                self.sweep();
                last_sweep = monotonic_ns();
            }
        }
    }

    /// Records when each counters file's count changed (every poll, so `idle_for` is exact to
    /// `poll_interval` even when nobody asks in between).
    /// A file its process cannot have written (another uid's: another kernel speaking for
    /// this pid) is counted, logged and removed, so the process's own shim can create its file.
    fn note_counters(&self) {
        let Some(dir) = &self.counters_dir else { return };
        let pids = shim_counters::list(dir);
        let now = monotonic_ns();
        let mut state = self.lock();
        for pid in pids {
            // A process already gone cannot be checked; its exit path decides (known owner).
            let Some(uids) = shim_counters::process_uids(pid) else { continue };
            let (c, owner) = match shim_counters::read_owned(dir, pid, |o| uids.contains(&o)) {
                Ok(Some(read)) => read,
                Ok(None) => continue,
                Err(foreign) => {
                    self.metrics.counters_rejected.inc();
                    let removed = shim_counters::remove_foreign(dir, pid, &foreign);
                    tracing::warn!(
                        pid,
                        file_owner = foreign.owner,
                        process_uids = ?uids,
                        removed,
                        "ignored a shim counters file not owned by the process it names"
                    );
                    continue;
                }
            };
            let calls = c.calls();
            let (first_ns, changed_ns) = CounterSeen::times(state.counter_seen.get(&pid), calls, now);
            state.counter_seen.insert(pid, CounterSeen { calls, first_ns, changed_ns, owner });
        }
    }

    fn deliver_bpf_exit(&self, raw: RawExitEvent) {
        let RawExitEvent { tgid, exit_code, exit_ns, had_activity, pad: _, activity } = raw;
        let bpf_activity = (had_activity != 0).then_some(activity);
        let (report, known_owner) = {
            let state = self.lock();
            (state.lease_reports.get(&tgid).copied(), state.counter_seen.get(&tgid).map(|s| s.owner))
        };
        let counters = self.counters(tgid, known_owner);
        let activity = merge(tgid, bpf_activity.as_ref(), counters.as_ref(), report.as_ref());
        self.deliver(ExitEvent { pid: tgid, exit_code: Some(exit_code), exited_at_ns: exit_ns, activity });
    }

    /// Procfs mode: track processes with counters files, report the ones that are gone.
    fn poll_procfs(&self) {
        let now = monotonic_ns();
        let gone = {
            let mut state = self.lock();
            if let Some(dir) = &self.counters_dir {
                for pid in shim_counters::list(dir) {
                    if !state.procs.track(pid, now) {
                        // A counters file of a process already gone before we saw it.
                        let report = state.lease_reports.get(&pid).copied();
                        let known_owner = state.counter_seen.get(&pid).map(|s| s.owner);
                        drop(state);
                        self.deliver(ExitEvent {
                            pid,
                            exit_code: None,
                            exited_at_ns: now,
                            activity: merge(pid, None, self.counters(pid, known_owner).as_ref(), report.as_ref()),
                        });
                        state = self.lock();
                    }
                }
            }
            state.procs.tick(now)
        };
        for g in gone {
            let (report, known_owner) = self.report_and_owner(g.pid);
            let activity = merge(g.pid, None, self.counters(g.pid, known_owner).as_ref(), report.as_ref());
            self.deliver(ExitEvent { pid: g.pid, exit_code: g.exit_code, exited_at_ns: now, activity });
        }
    }

    /// `pid`'s latest lease report and the owner its counters file had while it lived.
    fn report_and_owner(&self, pid: u32) -> (Option<LeaseReport>, Option<u32>) {
        let state = self.lock();
        (state.lease_reports.get(&pid).copied(), state.counter_seen.get(&pid).map(|s| s.owner))
    }

    fn deliver(&self, event: ExitEvent) {
        let pid = event.pid;
        {
            let mut state = self.lock();
            if let Some(a) = &event.activity {
                self.fold(&mut state, a);
            }
            state.folded.remove(&pid);
            state.labels.remove(&pid);
            state.lease_reports.remove(&pid);
            state.counter_seen.remove(&pid);
        }
        if let Some(dir) = &self.counters_dir {
            remove_counters(dir, pid);
        }
        self.metrics.exits.inc();
        tracing::debug!(pid, exit_code = ?event.exit_code, "process exit");
        lock(&self.subscribers).retain(|tx| match tx.try_send(event.clone()) {
            Ok(()) => true,
            Err(TrySendError::Full(lost)) => {
                self.metrics.exit_events_lagged.inc();
                tracing::warn!(pid = lost.pid, "exit event not delivered: a subscriber's queue is full");
                true
            }
            Err(TrySendError::Closed(_)) => false,
        });
    }

    /// Adds what each process did since the last sweep to the Prometheus counters.
    fn sweep(&self) {
        // Whose each counters file is, while its process lives: a process that exits before
        // the worker's next poll is then still credited with its own file's counts.
        self.note_counters();
        let mut dead = Vec::new();
        self.sweep_counts(&mut dead);
        dead.sort_unstable();
        dead.dedup();
        for pid in dead {
            let (report, known_owner) = self.report_and_owner(pid);
            let activity = merge(pid, None, self.counters(pid, known_owner).as_ref(), report.as_ref());
            self.deliver(ExitEvent { pid, exit_code: None, exited_at_ns: monotonic_ns(), activity });
        }
    }

    /// Folds counts into the metrics; collects counters-file pids already gone in `dead`.
    fn sweep_counts(&self, dead: &mut Vec<u32>) {
        let mut state = self.lock();
        let mut pids: Vec<u32> =
            state.bpf.as_ref().map(|b| b.all().into_iter().map(|(p, _)| p).collect()).unwrap_or_default();
        let with_counters = self.counters_dir.as_deref().map(shim_counters::list).unwrap_or_default();
        let drops = state.bpf.as_ref().map(EbpfBackend::exit_drops);
        match drops {
            Some(Ok(d)) if d > state.drops_folded => {
                tracing::error!(lost = d - state.drops_folded, "exit events lost: the ring buffer was full");
                self.metrics.exit_events_dropped.inc_by(d - state.drops_folded);
                state.drops_folded = d;
            }
            Some(Err(e)) => {
                self.metrics.errors.inc();
                tracing::debug!(error = %e, "reading exit drops");
            }
            _ => {}
        }
        if let Some(bpf) = state.bpf.as_mut() {
            // A watch or counters file whose process was reaped before the exit program watched
            // it would never see an exit: report those here. (The exit program deletes its
            // `watched` entry, so a watched pid without a /proc entry never exited under it.)
            for pid in bpf.watched_pids() {
                if !procfs_sampler::exists(pid) {
                    bpf.unwatch(pid);
                    dead.push(pid);
                }
            }
            for &pid in &with_counters {
                if !procfs_sampler::exists(pid) {
                    dead.push(pid);
                    continue;
                }
                // A process known only by its counters file must still produce an exit event:
                // ask the exit program to watch it (not once it has exited: it is a zombie).
                if let (Some(nz), Some(_)) = (NonZeroU32::new(pid), procfs_sampler::start_ns(pid)) {
                    if let Err(e) = bpf.watch(nz) {
                        self.metrics.errors.inc();
                        tracing::debug!(pid, error = %e, "watching a shim process");
                    }
                }
            }
        }
        pids.extend(with_counters);
        pids.extend(state.lease_reports.keys());
        pids.sort_unstable();
        pids.dedup();
        self.metrics.processes.set(i64::try_from(pids.len()).unwrap_or(i64::MAX));
        for pid in pids {
            if let Some(a) = self.activity_of(&state, pid) {
                self.fold(&mut state, &a);
            }
        }
    }

    fn fold(&self, state: &mut State, now: &ProcessActivity) {
        let label =
            KernelLabels { kernel: state.labels.get(&now.pid).cloned().unwrap_or_else(|| UNMANAGED.to_owned()) };
        let before = state.folded.get(&now.pid).cloned().unwrap_or_default();
        let m = &self.metrics;
        m.launches.get_or_create(&label).inc_by(now.launches.saturating_sub(before.launches));
        m.copies.get_or_create(&label).inc_by(now.copies.saturating_sub(before.copies));
        m.copy_bytes.get_or_create(&label).inc_by(now.copy_bytes.saturating_sub(before.copy_bytes));
        m.memsets.get_or_create(&label).inc_by(now.memsets.saturating_sub(before.memsets));
        m.syncs.get_or_create(&label).inc_by(now.syncs.saturating_sub(before.syncs));
        state.folded.insert(now.pid, now.clone());
    }
}

fn remove_counters(dir: &Path, pid: u32) {
    let path = shim_counters::path_for(dir, pid);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(path = %path.display(), error = %e, "removing the counters file of an exited process"),
    }
}

/// Waits until the ring buffer has data or `timeout_ms` passes.
fn wait_readable(ring: &RingBuf<MapData>, timeout_ms: i32) {
    use std::os::fd::AsRawFd;
    let mut pfd = libc::pollfd { fd: ring.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: `pfd` is one valid pollfd on this stack frame and nfds is 1; the fd stays open
    // for the call because `ring` is borrowed. poll only writes `revents`.
    let rc = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            tracing::warn!(error = %e, "polling the exit ring buffer");
            std::thread::sleep(Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(20)));
        }
    }
}

/// Combines the uprobe counts, the shim's counters file and its lease-protocol reports. Where
/// two count the same calls (a shim process on a probed driver), the larger is the truth, so
/// nothing is counted twice.
fn merge(
    pid: u32,
    bpf: Option<&RawActivity>,
    shim: Option<&ShimCounts>,
    report: Option<&LeaseReport>,
) -> Option<ProcessActivity> {
    if bpf.is_none() && shim.is_none() && report.is_none() {
        return None;
    }
    let b = bpf.copied().unwrap_or_default();
    let s = shim.copied().unwrap_or_default();
    let r = report.copied().unwrap_or_default();
    // A report with no call yet says nothing about activity.
    let r_ns = if r.calls > 0 { r.changed_ns } else { 0 };
    let first = [b.first_ns, s.first_ns, r_ns].into_iter().filter(|&t| t > 0).min().unwrap_or(0);
    Some(ProcessActivity {
        pid,
        comm: if bpf.is_some() { comm_to_string(&b.comm) } else { read_comm(pid) },
        launches: b.launches.max(s.launches),
        copies: b.copies.max(s.copies),
        copy_bytes: b.copy_bytes.max(s.copy_bytes),
        memsets: b.memsets.max(s.memsets),
        memset_bytes: b.memset_bytes.max(s.memset_bytes),
        syncs: b.syncs.max(s.syncs),
        driver_ioctls: b.driver_ioctls,
        shim_calls: r.calls,
        first_activity_ns: first,
        last_activity_ns: b.last_ns.max(s.last_ns).max(r_ns),
        sources: Sources { uprobes: bpf.is_some(), shim_counters: shim.is_some(), lease_reports: report.is_some() },
        cpu_time_ns: None,
        context_switches: None,
    })
}

fn read_comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|s| s.trim_end().to_owned()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_takes_the_larger_count_and_both_sources() {
        let b =
            RawActivity { launches: 10, copies: 1, copy_bytes: 100, first_ns: 50, last_ns: 90, ..Default::default() };
        let s = ShimCounts { launches: 12, syncs: 3, first_ns: 40, last_ns: 80, ..Default::default() };
        let m = merge(7, Some(&b), Some(&s), None).unwrap();
        assert_eq!((m.launches, m.copies, m.copy_bytes, m.syncs), (12, 1, 100, 3));
        assert_eq!((m.first_activity_ns, m.last_activity_ns), (40, 90));
        assert!(m.sources.uprobes && m.sources.shim_counters);
        assert_eq!(merge(7, None, None, None), None);
        let r = LeaseReport { calls: 5, changed_ns: 95 };
        let m = merge(7, Some(&b), None, Some(&r)).unwrap();
        assert_eq!((m.shim_calls, m.last_activity_ns), (5, 95));
        assert!(m.sources.lease_reports && m.sources.uprobes && !m.sources.shim_counters);
    }
}

#[cfg(test)]
mod thread_safety {
    /// The daemon shares one observer between its async tasks.
    #[test]
    fn observer_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<super::Observer>();
    }
}

#[cfg(test)]
mod counter_seen_tests {
    use super::CounterSeen;

    #[test]
    fn a_count_change_is_activity_now_and_a_steady_count_keeps_its_time() {
        assert_eq!(CounterSeen::times(None, 0, 100), (0, 0));
        assert_eq!(CounterSeen::times(None, 5, 100), (100, 100));
        let seen = CounterSeen { calls: 5, first_ns: 100, changed_ns: 100, owner: 0 };
        assert_eq!(CounterSeen::times(Some(&seen), 5, 900), (100, 100));
        assert_eq!(CounterSeen::times(Some(&seen), 6, 900), (100, 900));
        let never = CounterSeen { calls: 0, first_ns: 0, changed_ns: 0, owner: 0 };
        assert_eq!(CounterSeen::times(Some(&never), 1, 50), (50, 50));
    }
}
