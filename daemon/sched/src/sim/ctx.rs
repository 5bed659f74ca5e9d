//! What a policy sees and acts through while the engine replays a workload: the
//! workload, the model, the event queue, the cluster, the seeded randomness and virtual
//! now, plus what the engine measures for every policy alike.

use super::cluster::SimCluster;
use super::events::{Ev, Queue};
use super::rng::Rng;
use super::workload::{Training, Workload};
use super::Model;
use crate::Millis;

/// What policies see and act through.
pub struct Ctx<'a> {
    /// The workload.
    pub w: &'a Workload,
    /// The cluster model.
    pub m: &'a Model,
    /// Future events.
    pub q: Queue,
    /// The hosts.
    pub c: SimCluster,
    /// Randomness, from the seed.
    pub rng: Rng,
    /// Virtual now.
    pub now: Millis,
    pub(crate) next: Vec<u32>,
    pub(crate) submitted_at: Vec<Millis>,
    /// Per session: its current training is submitted and not started (what a window's
    /// end finds waiting).
    pub(crate) waiting: Vec<bool>,
    pub(crate) delays_ms: Vec<Millis>,
    /// The session of each delay in `delays_ms` (per-user figures).
    pub(crate) delay_sessions: Vec<u32>,
    /// Per session: GPU-ms its trainings ran, up to the window's end (per-user figures).
    pub(crate) served_gpu_ms: Vec<u128>,
    /// Migrations performed (replicas moved to run a cell).
    pub migrations: u64,
    /// Idle replicas moved in the background (off a host being drained, or to cover a kernel).
    pub background_moves: u64,
    /// Placements refused because no host had the memory for the replicas (each attempt).
    pub memory_refusals: u64,
    /// The scheduler-core decisions the policy called ([`Ctx::decided`]).
    pub decisions: std::collections::BTreeSet<&'static str>,
    /// Time charged to moves (replica start + state transfer), ms.
    pub migration_ms: u64,
    pub(crate) completed: usize,
}

impl Ctx<'_> {
    /// Notes that the policy called the scheduler-core decision `name` (`module::function`),
    /// so that a test can check the daemon calls it too.
    pub fn decided(&mut self, name: &'static str) {
        self.decisions.insert(name);
    }

    /// The session's current (next or running) training.
    pub fn training(&self, s: u32) -> &Training {
        let sess = &self.w.sessions[s as usize];
        &sess.trainings[(self.next[s as usize] as usize).min(sess.trainings.len().saturating_sub(1))]
    }

    /// The current training's index in its session.
    pub fn training_index(&self, s: u32) -> u32 {
        self.next[s as usize]
    }

    /// Host memory each replica (or container) of session `s` uses, MiB: an idle kernel
    /// with its imports plus the session's namespace (every replica holds all of it).
    pub fn replica_memory_mib(&self, s: u32) -> u64 {
        self.m.replica_base_mib.saturating_add(self.w.sessions[s as usize].namespace_mib)
    }

    /// The session's GPUs.
    pub fn session_gpus(&self, s: u32) -> u32 {
        self.w.sessions[s as usize].gpus
    }

    /// MiB of state the session's kernel holds.
    pub fn namespace_mib(&self, s: u32) -> u64 {
        self.w.sessions[s as usize].namespace_mib
    }

    /// The current training starts running on `host` after `extra` ms (container start,
    /// state load, election): the delay is measured from its submission.
    pub fn start_training(&mut self, s: u32, host: u32, extra: Millis) {
        let begins = self.now + extra;
        self.waiting[s as usize] = false;
        self.delays_ms.push(begins - self.submitted_at[s as usize]);
        self.delay_sessions.push(s);
        let end = begins + self.training(s).duration;
        let until = self.w.end.map_or(end, |e| end.min(e));
        let ran = until.saturating_sub(begins.min(until));
        self.served_gpu_ms[s as usize] += u128::from(ran) * u128::from(self.training(s).gpus);
        self.q.push(end, Ev::TrainingEnd { session: s, host });
    }

    /// Requests a host; a `HostUp` follows after the provisioning delay. A fixed cluster
    /// (`Model::fixed_hosts`) gets none: the request is dropped and `None` returned, and
    /// whatever waited for the host waits for GPUs or room to free up instead.
    pub fn request_host(&mut self) -> Option<u32> {
        if self.m.fixed_hosts > 0 {
            return None;
        }
        let h = self.c.request(self.now);
        let j = self.m.provision_jitter_ms;
        let delay = self.m.provision_ms.saturating_sub(j) + self.rng.below(2 * j + 1);
        self.q.push(self.now + delay, Ev::HostUp(h));
        Some(h)
    }
}
