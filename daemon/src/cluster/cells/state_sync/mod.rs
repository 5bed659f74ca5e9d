//! Namespace synchronisation of a kernel's replicas (F-cluster steps 4 and 6).
//!
//! Executor side ([`export_and_commit`]): after a cell, the local kernel exports what
//! the cell changed (`nbos_kernel.sync.export_cell(dir)` writes `manifest.json` and one
//! payload file per object); payloads up to `inline_max_bytes` go into the raft log
//! inline, larger ones (and any that would take the group's inline total past
//! [`GROUP_INLINE_BUDGET`]) into the large-object store first, then ONE transaction puts
//! and deletes `ns/{name}` and puts `ns-cell`.
//!
//! Follower side ([`Applier`], one per local replica): watches `ns` (which covers `ns/`
//! and `ns-cell`) in the kernel group, and for each committed cell materialises a
//! manifest directory and runs `nbos_kernel.sync.apply_cell(dir)` silently in the local
//! kernel, in revision order. On start, after a snapshot, or when the watch history is
//! compacted, it applies the whole namespace as one batch. Cells the local replica
//! executed itself are only recorded, not re-applied.
//!
//! One file per idea:
//! - [`export`]: the executor side, and the namespace reset after a restart.
//! - [`applier`]: the follower side's handle; [`apply_task`]: its task.
//! - [`records`]: the `ns/{name}` values and the `ns-cell` marker in the kernel group.
//! - [`manifest`]: the manifest directory `nbos_kernel.sync` reads and writes.
//! - [`kernel_calls`]: calls into `nbos_kernel.sync` in the kernel.
//! - [`refs`]: the large objects this host's kernel groups point to (for the collector).
//! - [`config`]: the settings.

pub mod applier;
pub mod apply_task;
pub mod config;
pub mod export;
pub mod kernel_calls;
pub mod manifest;
pub mod records;
pub mod refs;

pub use applier::Applier;
pub use config::SyncConfig;
pub use export::{export_and_commit, reset_namespace, Exported, GROUP_INLINE_BUDGET};
pub use kernel_calls::namespace_digest;
pub use manifest::{Manifest, ManifestEntry, Unpicklable};
pub use records::NsCell;
pub use refs::{referenced_objects, HostRefs};
