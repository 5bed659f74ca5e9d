//! A fresh single-replica container per training, first come first served (a strict FIFO:
//! the head is never overtaken, as a batch queue does):
//!
//! - `fcfs-batch` (the authors' `fcfs-batch`): every training starts a cold container
//!   and loads the notebook's state (its namespace) before it runs.
//! - `middle-ground` (the authors' `middle-ground`): each host keeps `prewarm_per_host`
//!   started, GPU-less containers; a training takes one on a host with its GPUs free
//!   (a pre-warmed start) and loads state; the pool refills in the background. Without a
//!   warm container where GPUs are free, it starts cold.
//!
//! Starts and state loads cost what the cost file says ([`crate::sim::costs`]), as a
//! replicated policy's moves do.
//!
//! GPUs are committed from the container's start to the training's end. Hosts are
//! requested when the queue's head fits nowhere; scale-in as the authors' single-replica
//! rule (empty hosts above `⌈committed × 1.1 ÷ G⌉`).

use std::collections::VecDeque;

use super::api::{scale_out_for, single_replica_scale_in, Policy};
use crate::sim::ctx::Ctx;
use crate::sim::events::Ev;

/// The policy's state.
#[derive(Debug)]
pub struct Batch {
    warm_pool: bool,
    queue: VecDeque<u32>,
}

impl Batch {
    /// For `n` sessions; `warm_pool` selects middle-ground.
    pub fn new(_n: usize, warm_pool: bool) -> Self {
        Self { warm_pool, queue: VecDeque::new() }
    }

    fn serve(&mut self, cx: &mut Ctx<'_>) {
        while let Some(&s) = self.queue.front() {
            let g = cx.training(s).gpus;
            let warm = if self.warm_pool { cx.c.best_fit(g, |_, host| host.warm > 0) } else { None };
            let Some(h) = warm.or_else(|| cx.c.best_fit(g, |_, _| true)) else { break };
            self.queue.pop_front();
            let k = kernel(cx, s);
            // Memory is only reported here: a host holds at most one container per GPU.
            cx.c.size_kernel(&k, cx.replica_memory_mib(s));
            cx.c.add_kernel(h, &k, g, cx.now);
            cx.c.commit(h, &k, &k, g, cx.now);
            let extra = if warm.is_some() {
                let host = cx.c.host_mut(h);
                host.warm -= 1;
                host.warming += 1;
                cx.q.push(cx.now + cx.m.costs.start_ms(false), Ev::Refill(h));
                cx.m.costs.move_ms(true, cx.namespace_mib(s))
            } else {
                cx.m.costs.move_ms(false, cx.namespace_mib(s))
            };
            cx.start_training(s, h, extra);
        }
        if !self.queue.is_empty() {
            let want: u32 = self.queue.iter().map(|&s| cx.training(s).gpus).sum();
            scale_out_for(cx, want);
        }
    }
}

fn kernel(cx: &Ctx<'_>, s: u32) -> String {
    format!("s{s}t{}", cx.training_index(s))
}

impl Policy for Batch {
    fn session_start(&mut self, _cx: &mut Ctx<'_>, _s: u32) {}

    fn submit(&mut self, cx: &mut Ctx<'_>, s: u32) {
        self.queue.push_back(s);
        self.serve(cx);
    }

    fn training_end(&mut self, cx: &mut Ctx<'_>, s: u32, host: u32) {
        let k = kernel(cx, s);
        cx.c.finish(host, &k, &k, cx.now);
        cx.c.remove_kernel(host, &k, cx.training(s).gpus, cx.now);
        self.serve(cx);
    }

    fn session_stop(&mut self, _cx: &mut Ctx<'_>, _s: u32) {}

    fn host_up(&mut self, cx: &mut Ctx<'_>, h: u32) {
        if self.warm_pool {
            let n = cx.m.prewarm_per_host;
            cx.c.host_mut(h).warming += n;
            for _ in 0..n {
                cx.q.push(cx.now + cx.m.costs.start_ms(false), Ev::Refill(h));
            }
        }
        self.serve(cx);
    }

    fn scale_tick(&mut self, cx: &mut Ctx<'_>) {
        if self.queue.is_empty() {
            single_replica_scale_in(cx);
        }
    }
}
