//! Each user's (and each group's) GPU time on this host today, UTC: the GPU-milliseconds
//! committed to their cells since midnight, running cells' time so far included. What
//! `gpu_hours_per_day` counts ([`super::gpu_hours`]); the host publishes it in its load
//! record so the other hosts count it too.
//!
//! Pure: the caller passes the wall-clock time (Unix milliseconds). A cell running across
//! midnight counts its time before midnight for the old day (forgotten) and after it for
//! the new one. A wall clock set back to an earlier day starts that day's count afresh.

use std::collections::{BTreeMap, HashMap};

use crate::users::User;

/// Milliseconds in a day.
pub const DAY_MS: u64 = 86_400_000;

/// The UTC day (days since the Unix epoch) of `unix_ms`.
pub fn day_of(unix_ms: u64) -> u64 {
    unix_ms / DAY_MS
}

/// GPU time today, by user and by group, in GPU-milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// The UTC day counted.
    pub day: u64,
    /// By user name.
    pub users: BTreeMap<String, u64>,
    /// By group: the GPU time of the cells of its members (as they were when the cell started).
    pub groups: BTreeMap<String, u64>,
}

impl Usage {
    /// Adds `other`'s counts when it counts the same day (another day's counts are stale).
    pub fn add(&mut self, other: &Usage) {
        if other.day != self.day {
            return;
        }
        for (u, ms) in &other.users {
            let e = self.users.entry(u.clone()).or_default();
            *e = e.saturating_add(*ms);
        }
        for (g, ms) in &other.groups {
            let e = self.groups.entry(g.clone()).or_default();
            *e = e.saturating_add(*ms);
        }
    }
}

/// A running cell as the day's count needs it.
#[derive(Debug, Clone)]
struct Running {
    user: User,
    gpus: u32,
    /// When its time starts counting today (its start, or midnight).
    since: u64,
}

/// The day's count of one host.
#[derive(Debug, Default)]
pub struct DailyUsage {
    /// Ended cells' time today.
    done: Usage,
    /// Running cells, by cell id.
    running: HashMap<String, Running>,
}

impl DailyUsage {
    /// Nothing counted yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts the day of `now` when it is not the one counted: the ended cells' counts are
    /// forgotten, running cells count from the day's start.
    fn roll(&mut self, now: u64) {
        let day = day_of(now);
        if day == self.done.day {
            return;
        }
        self.done = Usage { day, ..Usage::default() };
        let start = day.saturating_mul(DAY_MS);
        for r in self.running.values_mut() {
            // A clock set back: the cell counts from now.
            r.since = if r.since > now { now } else { r.since.max(start) };
        }
    }

    /// `cell` of `user` was committed `gpus` GPUs at `now`.
    pub fn started(&mut self, cell: &str, user: &User, gpus: u32, now: u64) {
        self.roll(now);
        if gpus == 0 {
            return;
        }
        self.running.insert(cell.to_owned(), Running { user: user.clone(), gpus, since: now });
    }

    /// `cell` gave its GPUs back at `now` (it ended, or its kernel died or restarted).
    pub fn ended(&mut self, cell: &str, now: u64) {
        self.roll(now);
        let Some(r) = self.running.remove(cell) else { return };
        let ms = now.saturating_sub(r.since).saturating_mul(u64::from(r.gpus));
        add(&mut self.done, &r.user, ms);
    }

    /// Today's counts at `now`, running cells' time so far included.
    pub fn today(&mut self, now: u64) -> Usage {
        self.roll(now);
        let mut usage = self.done.clone();
        for r in self.running.values() {
            add(&mut usage, &r.user, now.saturating_sub(r.since).saturating_mul(u64::from(r.gpus)));
        }
        usage
    }

    /// Cells counted as running (a bound: it must not outgrow the running cells).
    pub fn running(&self) -> usize {
        self.running.len()
    }
}

fn add(usage: &mut Usage, user: &User, ms: u64) {
    let e = usage.users.entry(user.name.clone()).or_default();
    *e = e.saturating_add(ms);
    for g in &user.groups {
        let e = usage.groups.entry(g.clone()).or_default();
        *e = e.saturating_add(ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str, groups: &[&str]) -> User {
        User { name: name.into(), groups: groups.iter().map(|g| (*g).to_owned()).collect() }
    }

    const DAY2: u64 = 2 * DAY_MS;

    #[test]
    fn ended_and_running_cells_count_by_user_and_group() {
        let mut d = DailyUsage::new();
        let alice = user("alice", &["ml"]);
        d.started("c1", &alice, 2, DAY2 + 1_000);
        d.ended("c1", DAY2 + 4_000);
        d.started("c2", &user("bob", &["ml", "ops"]), 1, DAY2 + 5_000);
        d.started("c0", &alice, 0, DAY2 + 5_000);
        let u = d.today(DAY2 + 7_000);
        assert_eq!(u.day, 2);
        assert_eq!(u.users["alice"], 6_000, "2 GPUs for 3 s");
        assert_eq!(u.users["bob"], 2_000, "a running cell's time so far");
        assert_eq!(u.groups["ml"], 8_000);
        assert_eq!(u.groups["ops"], 2_000);
        assert_eq!(d.running(), 1, "a 0-GPU cell is not counted");
        d.ended("c2", DAY2 + 8_000);
        d.ended("c2", DAY2 + 9_000);
        assert_eq!(d.today(DAY2 + 10_000).users["bob"], 3_000, "ended once");
        assert_eq!(d.running(), 0);
    }

    #[test]
    fn a_new_day_forgets_yesterday_and_a_running_cell_counts_from_midnight() {
        let mut d = DailyUsage::new();
        d.started("c1", &user("alice", &[]), 1, DAY2 + 1_000);
        d.ended("c1", DAY2 + 11_000);
        d.started("c2", &user("bob", &["ml"]), 2, DAY2 + DAY_MS - 1_000);
        let u = d.today(DAY2 + DAY_MS + 3_000);
        assert_eq!(u.day, 3);
        assert_eq!(u.users.get("alice"), None, "yesterday's cell is forgotten");
        assert_eq!(u.users["bob"], 6_000, "2 GPUs for the 3 s after midnight");
        d.ended("c2", DAY2 + DAY_MS + 4_000);
        assert_eq!(d.today(DAY2 + DAY_MS + 9_000).groups["ml"], 8_000);
    }

    #[test]
    fn another_days_counts_are_not_added() {
        let mut mine = Usage { day: 5, ..Usage::default() };
        mine.users.insert("alice".into(), 1_000);
        let mut theirs = Usage { day: 5, ..Usage::default() };
        theirs.users.insert("alice".into(), 2_000);
        theirs.groups.insert("ml".into(), 2_000);
        mine.add(&theirs);
        mine.add(&Usage { day: 4, users: BTreeMap::from([("alice".into(), 9_000)]), ..Usage::default() });
        assert_eq!(mine.users["alice"], 3_000);
        assert_eq!(mine.groups["ml"], 2_000);
    }
}
