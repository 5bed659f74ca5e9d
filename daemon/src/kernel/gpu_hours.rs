//! `gpu_hours_per_day`: a cell of a user who used their GPU-hours today (UTC), or whose
//! group's members did, is refused when it asks for GPUs. Pure: the binder counts the day
//! ([`super::daily_usage`]), adds the other hosts' published counts, and asks [`check`].
//!
//! The limits: a users-file entry's own `gpu_hours_per_day`, else `[limits.user]`'s; each
//! of the user's groups' `[limits.groups.NAME]` one, its members together. A cell needing no
//! GPU is never refused; a cell already running is not stopped when its user passes the limit.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::daily_usage::Usage;
use crate::config::LimitsConfig;
use crate::users::User;

/// The other hosts' counts (their load records), for the binder. Called under the binder's
/// lock: it must answer from memory.
pub trait OtherHosts: Send + Sync {
    /// The other hosts' GPU time on `day`, added up (hosts that published another day count nothing).
    fn usage(&self, day: u64) -> Usage;
}

/// A users-file entry's own `gpu_hours_per_day`. Called under the binder's lock.
pub type OwnLimit = Arc<dyn Fn(&str) -> Option<f64> + Send + Sync>;

/// The limits `[limits]` and the users file set.
#[derive(Clone)]
pub struct GpuHoursLimits {
    /// `[limits.user] gpu_hours_per_day`.
    pub user: Option<f64>,
    /// `[limits.groups.NAME] gpu_hours_per_day`, by group.
    pub groups: BTreeMap<String, f64>,
    /// A users-file entry's own value, which replaces `[limits.user]`'s.
    pub own: OwnLimit,
}

impl std::fmt::Debug for GpuHoursLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuHoursLimits").field("user", &self.user).field("groups", &self.groups).finish_non_exhaustive()
    }
}

impl GpuHoursLimits {
    /// From `[limits]`, with `own` for users-file entries.
    pub fn new(limits: &LimitsConfig, own: OwnLimit) -> Self {
        let groups =
            limits.groups.iter().filter_map(|(g, l)| l.quota.gpu_hours_per_day.map(|h| (g.clone(), h))).collect();
        Self { user: limits.user.gpu_hours_per_day, groups, own }
    }

    /// No limit at all: nothing to count against.
    pub fn is_empty(&self) -> bool {
        self.user.is_none() && self.groups.is_empty()
    }
}

/// A cell refused by `gpu_hours_per_day`; the message names the limit, who and the numbers.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{key} = {limit}: {who} used {} GPU-hours today (UTC); GPU cells run again after 00:00 UTC", hours(*.used_ms))]
pub struct GpuHoursRefused {
    /// `users_file[alice].gpu_hours_per_day`, `limits.user.gpu_hours_per_day`, `limits.groups.ml.gpu_hours_per_day`.
    pub key: String,
    /// The limit, GPU-hours.
    pub limit: f64,
    /// `alice`, `group ml's members`.
    pub who: String,
    /// GPU-milliseconds used today, all hosts.
    pub used_ms: u64,
}

/// The `reason` label of the metrics and audit.
pub const REASON: &str = "quota_gpu_hours";

/// GPU-milliseconds as GPU-hours, with the digits that show a small number.
fn hours(ms: u64) -> String {
    let h = ms as f64 / 3_600_000.0;
    if h >= 0.01 || h == 0.0 {
        format!("{h:.2}")
    } else {
        format!("{h:.6}").trim_end_matches('0').to_owned()
    }
}

/// Whether a cell of `user` asking for `gpus` GPUs may run, given today's `usage` (all hosts).
pub fn check(limits: &GpuHoursLimits, user: &User, gpus: u32, usage: &Usage) -> Result<(), GpuHoursRefused> {
    if gpus == 0 {
        return Ok(());
    }
    let name = &user.name;
    let mine = match ((limits.own)(name), limits.user) {
        (Some(l), _) => Some((l, format!("users_file[{name}].gpu_hours_per_day"))),
        (None, Some(l)) => Some((l, "limits.user.gpu_hours_per_day".to_owned())),
        (None, None) => None,
    };
    let over = |limit: f64, used_ms: u64| used_ms as f64 >= limit * 3_600_000.0;
    if let Some((limit, key)) = mine {
        let used_ms = usage.users.get(name).copied().unwrap_or(0);
        if over(limit, used_ms) {
            return Err(GpuHoursRefused { key, limit, who: name.clone(), used_ms });
        }
    }
    for group in &user.groups {
        let Some(&limit) = limits.groups.get(group) else { continue };
        let used_ms = usage.groups.get(group).copied().unwrap_or(0);
        if over(limit, used_ms) {
            return Err(GpuHoursRefused {
                key: format!("limits.groups.{group}.gpu_hours_per_day"),
                limit,
                who: format!("group {group}'s members"),
                used_ms,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::config::{GroupLimits, Quota};

    use super::*;

    fn user(name: &str, groups: &[&str]) -> User {
        User { name: name.into(), groups: groups.iter().map(|g| (*g).to_owned()).collect() }
    }

    fn limits(user: Option<f64>, groups: &[(&str, f64)], own: &'static [(&'static str, f64)]) -> GpuHoursLimits {
        let config = LimitsConfig {
            user: Quota { gpu_hours_per_day: user, ..Quota::default() },
            groups: groups
                .iter()
                .map(|(g, h)| {
                    let quota = Quota { gpu_hours_per_day: Some(*h), ..Quota::default() };
                    ((*g).to_owned(), GroupLimits { quota, weight: 1.0 })
                })
                .collect(),
            ..LimitsConfig::default()
        };
        GpuHoursLimits::new(&config, Arc::new(move |n| own.iter().find(|(u, _)| *u == n).map(|(_, h)| *h)))
    }

    fn usage(users: &[(&str, u64)], groups: &[(&str, u64)]) -> Usage {
        Usage {
            day: 1,
            users: users.iter().map(|(u, ms)| ((*u).to_owned(), *ms)).collect(),
            groups: groups.iter().map(|(g, ms)| ((*g).to_owned(), *ms)).collect(),
        }
    }

    const H: u64 = 3_600_000;

    #[test]
    fn a_user_over_the_limit_is_refused_with_the_key_and_the_numbers() {
        let l = limits(Some(2.0), &[], &[]);
        let alice = user("alice", &[]);
        check(&l, &alice, 1, &usage(&[("alice", 2 * H - 1)], &[])).expect("just under");
        let e = check(&l, &alice, 1, &usage(&[("alice", 2 * H + 36_000)], &[])).expect_err("over");
        assert_eq!(
            e.to_string(),
            "limits.user.gpu_hours_per_day = 2: alice used 2.01 GPU-hours today (UTC); GPU cells run again after 00:00 UTC"
        );
        check(&l, &alice, 0, &usage(&[("alice", 9 * H)], &[])).expect("a cell needing no GPU runs");
        check(&l, &user("bob", &[]), 1, &usage(&[("alice", 9 * H)], &[])).expect("bob used none");
        let tiny = limits(Some(0.0001), &[], &[]);
        let e = check(&tiny, &alice, 1, &usage(&[("alice", 1_000)], &[])).expect_err("1 s > 0.36 s");
        assert!(
            e.to_string().starts_with("limits.user.gpu_hours_per_day = 0.0001: alice used 0.000278 GPU-hours"),
            "{e}"
        );
        check(&limits(None, &[], &[]), &alice, 8, &usage(&[("alice", 99 * H)], &[])).expect("no limit");
    }

    #[test]
    fn the_users_file_entry_replaces_limits_user_and_groups_count_their_members() {
        let l = limits(Some(1.0), &[("ml", 3.0)], &[("alice", 5.0), ("erin", 0.5)]);
        let alice = user("alice", &["ml"]);
        check(&l, &alice, 1, &usage(&[("alice", 2 * H)], &[("ml", 2 * H)])).expect("her own 5 h");
        let e = check(&l, &user("erin", &[]), 1, &usage(&[("erin", H / 2)], &[])).expect_err("her own 0.5 h");
        assert_eq!(e.key, "users_file[erin].gpu_hours_per_day");
        let e = check(&l, &user("bob", &["ml"]), 1, &usage(&[("bob", H)], &[("ml", H)])).expect_err("[limits.user]");
        assert_eq!(e.key, "limits.user.gpu_hours_per_day");
        let e = check(&l, &alice, 1, &usage(&[("alice", 2 * H)], &[("ml", 3 * H)])).expect_err("the group's 3 h");
        assert_eq!(
            e.to_string(),
            "limits.groups.ml.gpu_hours_per_day = 3: group ml's members used 3.00 GPU-hours today (UTC); \
             GPU cells run again after 00:00 UTC"
        );
        check(&l, &user("carol", &["other"]), 1, &usage(&[], &[("ml", 9 * H)])).expect("not in ml");
    }
}
