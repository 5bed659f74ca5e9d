//! The scheduling policies. Each reacts to the engine's events through [`api::Policy`]
//! and acts on the cluster through [`crate::sim::ctx::Ctx`].
//!
//! - [`reservation`]: one container per session, GPUs held for the session.
//! - [`batch`]: a container per training, first come first served: `fcfs-batch` (cold
//!   containers) and `middle-ground` (a pre-warmed pool per host).
//! - [`replicated`]: three replicas per session, GPUs bound per training:
//!   `notebookos-paper` (the authors' rules) and `notebookos` (ours).

pub mod api;
pub mod batch;
pub mod replicated;
pub mod reservation;
