//! `reservation`: one container per session, holding the session's GPUs from its start
//! to its stop (the authors' `reservation` policy; what a notebook server on a GPU VM
//! does). Sessions are placed best-fit, first come first served; when none fits, hosts
//! are requested (15 ± 2 s). A container takes a cold start (the cost file's, a new
//! kernel has no state to load), so a training submitted sooner waits. Scale-in releases
//! empty hosts above `⌈committed × 1.1 ÷ G⌉` and the model's minimum hosts.

use std::collections::VecDeque;

use super::api::{scale_out_for, single_replica_scale_in, Policy};
use crate::sim::ctx::Ctx;
use crate::sim::events::Ev;

/// The policy's state.
#[derive(Debug)]
pub struct Reservation {
    pending: VecDeque<u32>,
    host: Vec<Option<u32>>,
    ready: Vec<bool>,
    waiting: Vec<bool>,
}

impl Reservation {
    /// For `n` sessions.
    pub fn new(n: usize) -> Self {
        Self { pending: VecDeque::new(), host: vec![None; n], ready: vec![false; n], waiting: vec![false; n] }
    }

    fn serve(&mut self, cx: &mut Ctx<'_>) {
        while let Some(&s) = self.pending.front() {
            let g = cx.session_gpus(s);
            let Some(h) = cx.c.best_fit(g, |_, _| true) else { break };
            self.pending.pop_front();
            let k = kernel(s);
            // Memory is only reported here: a host holds at most one container per GPU.
            cx.c.size_kernel(&k, cx.replica_memory_mib(s));
            cx.c.add_kernel(h, &k, g, cx.now);
            cx.c.commit(h, &k, &k, g, cx.now);
            self.host[s as usize] = Some(h);
            cx.q.push(cx.now + cx.m.costs.start_ms(false), Ev::Ready { session: s, host: h });
        }
        if !self.pending.is_empty() {
            let want: u32 = self.pending.iter().map(|&s| cx.session_gpus(s)).sum();
            scale_out_for(cx, want);
        }
    }
}

fn kernel(s: u32) -> String {
    format!("s{s}")
}

impl Policy for Reservation {
    fn session_start(&mut self, cx: &mut Ctx<'_>, s: u32) {
        self.pending.push_back(s);
        self.serve(cx);
    }

    fn submit(&mut self, cx: &mut Ctx<'_>, s: u32) {
        match self.host[s as usize] {
            Some(h) if self.ready[s as usize] => cx.start_training(s, h, 0),
            _ => self.waiting[s as usize] = true,
        }
    }

    fn ready(&mut self, cx: &mut Ctx<'_>, s: u32, host: u32) {
        self.ready[s as usize] = true;
        if std::mem::take(&mut self.waiting[s as usize]) {
            cx.start_training(s, host, 0);
        }
    }

    fn training_end(&mut self, _cx: &mut Ctx<'_>, _s: u32, _host: u32) {}

    fn session_stop(&mut self, cx: &mut Ctx<'_>, s: u32) {
        if let Some(h) = self.host[s as usize].take() {
            let k = kernel(s);
            cx.c.finish(h, &k, &k, cx.now);
            cx.c.remove_kernel(h, &k, cx.session_gpus(s), cx.now);
        }
        self.serve(cx);
    }

    fn host_up(&mut self, cx: &mut Ctx<'_>, _h: u32) {
        self.serve(cx);
    }

    fn scale_tick(&mut self, cx: &mut Ctx<'_>) {
        if self.pending.is_empty() {
            single_replica_scale_in(cx);
        }
    }
}
