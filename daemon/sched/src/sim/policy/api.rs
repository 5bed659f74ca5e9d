//! The interface between the engine and the policies ([`Policy`]), and the helpers the
//! single-replica policies share.

use crate::sim::ctx::Ctx;
use crate::{drain, scale};

/// A policy's event handlers. Defaults do nothing.
pub trait Policy {
    /// Before the first event.
    fn init(&mut self, _cx: &mut Ctx<'_>) {}
    /// A session starts.
    fn session_start(&mut self, cx: &mut Ctx<'_>, s: u32);
    /// The session's current training is submitted: the policy must start it, now or later.
    fn submit(&mut self, cx: &mut Ctx<'_>, s: u32);
    /// The session's running training ended on `host`.
    fn training_end(&mut self, cx: &mut Ctx<'_>, s: u32, host: u32);
    /// The session stops (its trainings are done).
    fn session_stop(&mut self, cx: &mut Ctx<'_>, s: u32);
    /// A host is up.
    fn host_up(&mut self, cx: &mut Ctx<'_>, h: u32);
    /// A container or a session's replicas are ready.
    fn ready(&mut self, _cx: &mut Ctx<'_>, _s: u32, _host: u32) {}
    /// A pre-warmed container is ready on `h`.
    fn refill(&mut self, cx: &mut Ctx<'_>, h: u32) {
        let host = cx.c.host_mut(h);
        if host.warming > 0 {
            host.warming -= 1;
            host.warm += 1;
        }
    }
    /// Idle-held GPUs on `h` may be due.
    fn idle_check(&mut self, _cx: &mut Ctx<'_>, _h: u32) {}
    /// The autoscaler's turn.
    fn scale_tick(&mut self, cx: &mut Ctx<'_>);
}

/// Requests hosts so that `waiting_gpus` GPUs of queued requests fit in what is booting.
pub(crate) fn scale_out_for(cx: &mut Ctx<'_>, waiting_gpus: u32) {
    let g = cx.c.gpus_per_host();
    let booting = cx.c.provisioning() * g;
    if waiting_gpus > booting {
        for _ in 0..(waiting_gpus - booting).div_ceil(g) {
            cx.request_host();
        }
    }
}

/// Single-replica scale-in (the authors' `defaultTryScaleIn`): above
/// `⌈committed × 1.1 ÷ G⌉` hosts (and the model's minimum), release up to 2 hosts that
/// hold nothing.
pub(crate) fn single_replica_scale_in(cx: &mut Ctx<'_>) {
    let rule = scale::PaperRule { buffer: 0, min_hosts: cx.m.min_hosts(), ..scale::PaperRule::default() };
    if let scale::Scale::In(n) = scale::paper(&rule, cx.c.alive(), cx.c.committed_now(), cx.c.gpus_per_host()) {
        let cands: Vec<drain::Candidate> =
            cx.c.up_hosts()
                .iter()
                .map(|&h| (h, cx.c.host(h)))
                .filter(|(_, host)| host.replicas == 0)
                .map(|(h, host)| drain::Candidate {
                    node_id: u64::from(h),
                    committed_gpus: host.sched.committed(),
                    bound_gpus: host.sched.bound(),
                    replicas: host.replicas,
                })
                .collect();
        for id in drain::choose(&cands, n as usize) {
            let h = u32::try_from(id).unwrap_or(u32::MAX);
            cx.c.release(h, cx.now);
        }
    }
}
