//! A linearizability checker for a single register with read / write / compare-and-swap
//! (Wing & Gong search with memoisation of (linearized set, register value), as in Knossos/Porcupine).
//!
//! The store's own kill loops check their histories with it (`tests/cluster.rs`), and so does
//! the daemon's fault campaign, through a register in the meta group (`nbos chaos
//! check-history`). Keep histories to a few hundred operations with few unanswered writes:
//! the search is exponential in the operations that may be concurrent.

use std::collections::HashSet;

/// An operation on the register, with the result its client saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// A write of the value.
    Write(String),
    /// A read and the value it returned (`None` = absent).
    Read(Option<String>),
    /// CAS from `expected` to `new`; `ok` is the reported outcome (`None` when unknown).
    Cas {
        /// The value it expected (`None` = absent).
        expected: Option<String>,
        /// The value it writes when `expected` holds.
        new: String,
        /// Whether it swapped (`None` when the client got no answer).
        ok: Option<bool>,
    },
}

/// One operation: invoked at `call`, answered at `ret` (`None`: no answer, outcome unknown).
#[derive(Debug, Clone)]
pub struct Event {
    /// What the client did and saw.
    pub op: Op,
    /// When it was invoked (any clock all clients share, e.g. nanoseconds).
    pub call: u128,
    /// When its answer came (`None`: never, e.g. a timeout).
    pub ret: Option<u128>,
}

/// Applies `op` to `state`; `None` when the op's reported result is impossible in `state`.
fn step(state: &Option<String>, op: &Op) -> Option<Option<String>> {
    match op {
        Op::Write(v) => Some(Some(v.clone())),
        Op::Read(v) => (v == state).then(|| state.clone()),
        Op::Cas { expected, new, ok } => {
            let matches = expected == state;
            match ok {
                Some(true) if matches => Some(Some(new.clone())),
                Some(false) if !matches => Some(state.clone()),
                Some(_) => None,
                None if matches => Some(Some(new.clone())),
                None => Some(state.clone()),
            }
        }
    }
}

/// True when the history is linearizable from an absent register. Operations without an
/// answer may take effect at any time after their call, or never; unanswered reads are ignored.
pub fn check(history: &[Event]) -> bool {
    let events: Vec<&Event> = history.iter().filter(|e| !(e.ret.is_none() && matches!(e.op, Op::Read(_)))).collect();
    let n = events.len();
    let ret = |i: usize| events[i].ret.unwrap_or(u128::MAX);
    let must: usize = events.iter().filter(|e| e.ret.is_some()).count();
    let words = n.div_ceil(64);
    let mut seen: HashSet<(Vec<u64>, Option<String>)> = HashSet::new();
    // DFS stack of (linearized bitset, count of answered ops linearized, state).
    let mut stack = vec![(vec![0u64; words], 0usize, None::<String>)];
    while let Some((done, answered, state)) = stack.pop() {
        if answered == must {
            return true;
        }
        if !seen.insert((done.clone(), state.clone())) {
            continue;
        }
        let is_done = |i: usize| done[i / 64] & (1 << (i % 64)) != 0;
        // An op may go next only if no pending op returned before it was called.
        let min_ret = (0..n).filter(|&i| !is_done(i)).map(ret).min().unwrap_or(u128::MAX);
        for i in (0..n).filter(|&i| !is_done(i) && events[i].call < min_ret) {
            if let Some(next) = step(&state, &events[i].op) {
                let mut d = done.clone();
                d[i / 64] |= 1 << (i % 64);
                let a = answered + usize::from(events[i].ret.is_some());
                stack.push((d, a, next));
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(op: Op, call: u128, ret: Option<u128>) -> Event {
        Event { op, call, ret }
    }

    #[test]
    fn accepts_concurrent_overlap_and_rejects_stale_read() {
        let w = |v: &str| Op::Write(v.into());
        let r = |v: Option<&str>| Op::Read(v.map(Into::into));
        // Read overlapping a write may see either value.
        assert!(check(&[ev(w("a"), 0, Some(10)), ev(w("b"), 20, Some(30)), ev(r(Some("a")), 25, Some(40))]));
        assert!(check(&[ev(w("a"), 0, Some(10)), ev(w("b"), 20, Some(30)), ev(r(Some("b")), 25, Some(40))]));
        // A read after a completed write must not see the older value.
        assert!(!check(&[ev(w("a"), 0, Some(10)), ev(w("b"), 20, Some(30)), ev(r(Some("a")), 35, Some(40))]));
        // Two successful CAS from the same value cannot both win.
        let cas = |e: &str, n: &str, ok| Op::Cas { expected: Some(e.into()), new: n.into(), ok: Some(ok) };
        assert!(!check(&[
            ev(w("a"), 0, Some(1)),
            ev(cas("a", "b", true), 2, Some(5)),
            ev(cas("a", "c", true), 3, Some(6))
        ]));
        assert!(check(&[
            ev(w("a"), 0, Some(1)),
            ev(cas("a", "b", true), 2, Some(5)),
            ev(cas("a", "c", false), 3, Some(6))
        ]));
        // An unanswered write may explain a later read, or never happen.
        assert!(check(&[ev(w("a"), 0, None), ev(r(Some("a")), 5, Some(6))]));
        assert!(check(&[ev(w("a"), 0, None), ev(r(None), 5, Some(6))]));
    }
}
