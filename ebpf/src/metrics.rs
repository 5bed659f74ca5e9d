//! Prometheus metrics of the observer. Names start with `notebookos_` and carry their unit.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::activity::Mode;

/// Label of the per-kernel activity counters: the notebook kernel the daemon assigned to the
/// process with [`crate::Observer::set_kernel_label`], or `"unmanaged"`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KernelLabels {
    /// Notebook kernel id.
    pub kernel: String,
}

/// Label of `notebookos_observer_mode`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabels {
    /// `ebpf` or `procfs`.
    pub mode: String,
}

/// The observer's metrics; cheap to clone (handles to shared atomics).
#[derive(Clone, Debug, Default)]
pub struct ObserverMetrics {
    /// Kernel and graph launches.
    pub launches: Family<KernelLabels, Counter>,
    /// Memory copies.
    pub copies: Family<KernelLabels, Counter>,
    /// Bytes copied.
    pub copy_bytes: Family<KernelLabels, Counter>,
    /// Memsets.
    pub memsets: Family<KernelLabels, Counter>,
    /// Synchronisations.
    pub syncs: Family<KernelLabels, Counter>,
    /// 1 for the active mode, 0 for the other.
    pub mode: Family<ModeLabels, Gauge>,
    /// Processes with GPU activity being tracked now.
    pub processes: Gauge,
    /// Exit events delivered.
    pub exits: Counter,
    /// Ring buffer records or map reads that failed.
    pub errors: Counter,
    /// Exit events lost in the kernel because the ring buffer was full.
    pub exit_events_dropped: Counter,
    /// Exit events not delivered to a subscriber whose queue was full (it stopped reading).
    pub exit_events_lagged: Counter,
    /// Shim counters files ignored (and removed) because their owner is not a uid of the
    /// process they are named after.
    pub counters_rejected: Counter,
}

impl ObserverMetrics {
    /// Sets the mode gauge.
    pub(crate) fn set_mode(&self, active: Mode) {
        for m in [Mode::Ebpf, Mode::Procfs] {
            self.mode.get_or_create(&ModeLabels { mode: m.as_str().to_owned() }).set(i64::from(m == active));
        }
    }

    /// Registers every metric (the `_total` suffix of counters is added by the encoder).
    pub fn register(&self, registry: &mut Registry) {
        registry.register("notebookos_gpu_launches", "GPU kernel and graph launches observed", self.launches.clone());
        registry.register("notebookos_gpu_copies", "GPU memory copies observed", self.copies.clone());
        registry.register("notebookos_gpu_copy_bytes", "Bytes copied to, from or within GPUs", self.copy_bytes.clone());
        registry.register("notebookos_gpu_memsets", "GPU memsets observed", self.memsets.clone());
        registry.register("notebookos_gpu_syncs", "GPU context/stream/event synchronisations", self.syncs.clone());
        registry.register("notebookos_observer_mode", "Active GPU observer mode (1) by mode", self.mode.clone());
        registry.register(
            "notebookos_observer_processes",
            "Processes with observed GPU activity",
            self.processes.clone(),
        );
        registry.register("notebookos_observer_exits", "Process exit events delivered", self.exits.clone());
        registry.register("notebookos_observer_errors", "Observer read errors", self.errors.clone());
        registry.register(
            "notebookos_observer_exit_events_dropped",
            "Exit events lost because the ring buffer was full",
            self.exit_events_dropped.clone(),
        );
        registry.register(
            "notebookos_observer_exit_events_lagged",
            "Exit events not delivered because a subscriber's queue was full",
            self.exit_events_lagged.clone(),
        );
        registry.register(
            "notebookos_observer_counters_rejected",
            "Shim counters files ignored and removed: not owned by the process they name",
            self.counters_rejected.clone(),
        );
    }
}
