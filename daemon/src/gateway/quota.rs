//! Per-user and per-group quotas of kernels and GPUs at once (`[limits.user]`, a
//! users-file entry's own keys, `[limits.groups.NAME]`), checked at create against the
//! kernels that exist (the cluster's records in cluster mode). Pure: the handlers gather
//! the kernels, this decides. `gpu_hours_per_day` is checked elsewhere.
//!
//! Kernels being created at the same moment (here or on other hosts) are not counted yet:
//! two creates racing may each pass with one place left.

use crate::config::{LimitsConfig, Quota};
use crate::users::UserCaller;

/// One kernel that exists, as quotas count it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelUse {
    /// Its owner.
    pub owner: Option<String>,
    /// Its owner's groups when it was created.
    pub groups: Vec<String>,
    /// GPUs per cell (committed while it exists).
    pub gpus: u32,
}

/// A create refused by a quota; the message names the limit, the user and the numbers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key} = {limit}: {who} {has}; delete a kernel first")]
pub struct QuotaRefused {
    /// The limit's key: `limits.user.kernels`, `users_file[alice].gpus`, `limits.groups.ml.gpus`.
    pub key: String,
    /// The limit.
    pub limit: u32,
    /// Who it counts (`alice`, `group ml`).
    pub who: String,
    /// What they have (and ask).
    pub has: String,
    /// `quota_kernels` or `quota_gpus` (metric and audit reason).
    pub reason: &'static str,
}

impl From<QuotaRefused> for super::error::ApiError {
    /// 429, as the other caps of `[limits]`: the client may retry after a delete.
    fn from(e: QuotaRefused) -> Self {
        Self { status: axum::http::StatusCode::TOO_MANY_REQUESTS, message: e.to_string() }
    }
}

fn plural(n: u64, one: &str) -> String {
    if n == 1 {
        format!("{n} {one}")
    } else {
        format!("{n} {one}s")
    }
}

/// Whether `user` may create one more kernel of `gpus` GPUs per cell, given the kernels that exist.
pub fn check(limits: &LimitsConfig, user: &UserCaller, kernels: &[KernelUse], gpus: u32) -> Result<(), QuotaRefused> {
    let name = &user.user.name;
    let own: Vec<&KernelUse> = kernels.iter().filter(|k| k.owner.as_deref() == Some(name)).collect();
    // The users-file entry's keys first, then [limits.user]'s.
    let pick = |mine: Option<u32>, every: Option<u32>, key: &str| match (mine, every) {
        (Some(l), _) => Some((l, format!("users_file[{name}].{key}"))),
        (None, Some(l)) => Some((l, format!("limits.user.{key}"))),
        (None, None) => None,
    };
    let who = name.clone();
    check_one(
        pick(user.quota.kernels, limits.user.kernels, "kernels"),
        pick(user.quota.gpus, limits.user.gpus, "gpus"),
        &who,
        &own,
        gpus,
    )?;
    for group in &user.user.groups {
        let Some(g) = limits.groups.get(group) else { continue };
        let members: Vec<&KernelUse> = kernels.iter().filter(|k| k.groups.iter().any(|x| x == group)).collect();
        let Quota { kernels: k, gpus: gp, .. } = &g.quota;
        let key = |what: &str| format!("limits.groups.{group}.{what}");
        check_one(
            k.map(|l| (l, key("kernels"))),
            gp.map(|l| (l, key("gpus"))),
            &format!("group {group}'s members"),
            &members,
            gpus,
        )?;
    }
    Ok(())
}

fn check_one(
    kernels_limit: Option<(u32, String)>,
    gpus_limit: Option<(u32, String)>,
    who: &str,
    counted: &[&KernelUse],
    gpus: u32,
) -> Result<(), QuotaRefused> {
    let n = counted.len() as u64;
    if let Some((limit, key)) = kernels_limit {
        if n >= u64::from(limit) {
            let has = format!("{} {}", if who.starts_with("group ") { "have" } else { "has" }, plural(n, "kernel"));
            return Err(QuotaRefused { key, limit, who: who.to_owned(), has, reason: "quota_kernels" });
        }
    }
    if let Some((limit, key)) = gpus_limit {
        let committed: u64 = counted.iter().map(|k| u64::from(k.gpus)).sum();
        if committed + u64::from(gpus) > u64::from(limit) {
            let verb = if who.starts_with("group ") { "have" } else { "has" };
            let has = format!("{verb} {} committed, {gpus} more asked", plural(committed, "GPU"));
            return Err(QuotaRefused { key, limit, who: who.to_owned(), has, reason: "quota_gpus" });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::config::GroupLimits;
    use crate::users::User;

    use super::*;

    fn user(name: &str, groups: &[&str], quota: Quota) -> UserCaller {
        UserCaller {
            user: User { name: name.into(), groups: groups.iter().map(|g| (*g).to_owned()).collect() },
            admin: false,
            quota,
        }
    }

    fn k(owner: &str, groups: &[&str], gpus: u32) -> KernelUse {
        KernelUse { owner: Some(owner.into()), groups: groups.iter().map(|g| (*g).to_owned()).collect(), gpus }
    }

    #[test]
    fn user_quotas_name_the_limit_the_user_and_the_numbers() {
        let limits = LimitsConfig {
            user: Quota { kernels: Some(2), gpus: Some(3), ..Quota::default() },
            ..LimitsConfig::default()
        };
        let alice = user("alice", &[], Quota::default());
        let two = [k("alice", &[], 1), k("alice", &[], 1), k("bob", &[], 1)];
        let e = check(&limits, &alice, &two, 0).expect_err("third kernel");
        assert_eq!(e.to_string(), "limits.user.kernels = 2: alice has 2 kernels; delete a kernel first");
        assert_eq!(e.reason, "quota_kernels");
        check(&limits, &alice, &two[..1], 2).expect("1 + 2 GPUs fit in 3");
        let e = check(&limits, &alice, &two[..1], 3).expect_err("1 + 3 GPUs");
        assert_eq!(
            e.to_string(),
            "limits.user.gpus = 3: alice has 1 GPU committed, 3 more asked; delete a kernel first"
        );
        check(&limits, &user("bob", &[], Quota::default()), &two, 0).expect("bob has one");
        // A users-file entry's key replaces [limits.user]'s, key by key.
        let generous = user("alice", &[], Quota { kernels: Some(5), ..Quota::default() });
        check(&limits, &generous, &two, 0).expect("alice's own kernels quota");
        let e = check(&limits, &generous, &two, 2).expect_err("gpus still from [limits.user]");
        assert_eq!(e.key, "limits.user.gpus");
        let strict = user("alice", &[], Quota { kernels: Some(1), ..Quota::default() });
        assert_eq!(check(&limits, &strict, &two, 0).expect_err("own").key, "users_file[alice].kernels");
    }

    #[test]
    fn group_quotas_count_the_members_together() {
        let mut limits = LimitsConfig::default();
        limits.groups.insert(
            "ml".into(),
            GroupLimits { quota: Quota { gpus: Some(4), kernels: Some(3), ..Quota::default() }, weight: 1.0 },
        );
        let carol = user("carol", &["ml"], Quota::default());
        let kernels = [k("alice", &["ml"], 2), k("bob", &["ml"], 1), k("dave", &["other"], 8)];
        check(&limits, &carol, &kernels, 1).expect("2 + 1 + 1 = 4");
        let e = check(&limits, &carol, &kernels, 2).expect_err("2 + 1 + 2 > 4");
        assert_eq!(
            e.to_string(),
            "limits.groups.ml.gpus = 4: group ml's members have 3 GPUs committed, 2 more asked; delete a kernel first"
        );
        let more = [k("alice", &["ml"], 0), k("bob", &["ml"], 0), k("carol", &["ml"], 0)];
        assert_eq!(check(&limits, &carol, &more, 0).expect_err("kernels").key, "limits.groups.ml.kernels");
        check(&limits, &user("erin", &["other"], Quota::default()), &more, 0).expect("not in ml");
    }
}
