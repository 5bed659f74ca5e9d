//! `kernel.run_as = "owner"`: the system account a kernel runs as is the one named as its
//! owner (the authenticated user who created it, kept in its cluster record), found by
//! NSS (`getpwnam_r`), with that account's groups (`getgrouplist`, as initgroups(3) gives
//! a login) and home. Never root, and never the pool's own account: pool processes hold
//! CAP_SETUID until they become a kernel, so no kernel may share their uid. Nor a system
//! account (uid or primary gid below `kernel.owner_uid_min`: `daemon`, `www-data`,
//! `syslog`...) or a member of a privileged group (`kernel.owner_denied_groups`: `sudo`,
//! `adm`, `disk`, `docker`...): an owner's name is whatever a login (an OIDC
//! `preferred_username`, a Hub name) claims, so it must never reach a service's account.

use std::ffi::CString;
use std::path::PathBuf;

/// What an owner's account must satisfy beyond "not root": the host's rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRules {
    /// `kernel.user`'s uid: the pre-warm pool's account, never a kernel's.
    pub pool_uid: u32,
    /// `kernel.owner_uid_min`: the lowest uid (and primary gid) an owner's account may have.
    pub uid_min: u32,
    /// `kernel.owner_denied_groups`: an account in one of these groups is refused.
    pub denied_groups: Vec<String>,
}

/// An owner's system account, as NSS gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerAccount {
    /// The owner's (and the account's) name.
    pub name: String,
    /// User id (never 0).
    pub uid: u32,
    /// Primary group id (never 0).
    pub gid: u32,
    /// Every group of the account, the primary one included (never 0).
    pub groups: Vec<u32>,
    /// Its home directory (`None`: not an absolute path).
    pub home: Option<PathBuf>,
}

/// Why a kernel cannot run as its owner. Each message names the account and
/// `kernel.run_as`: it is what the client that created the kernel reads.
#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    /// No owner: no users are configured, so nobody is known to run the kernel as.
    #[error(
        "kernel.run_as = \"owner\" runs each kernel as its owner's account, and this kernel has no owner \
         (no users are configured: see [auth] in docs/users.md)"
    )]
    NoOwner,
    /// The owner's name is no system account.
    #[error(
        "kernel.run_as = \"owner\": the owner {owner:?} has no system account on this host; \
         create it (useradd {owner}) or make it known to NSS (LDAP, SSSD)"
    )]
    NoAccount {
        /// The owner's name.
        owner: String,
    },
    /// The owner's account is root's (uid or gid 0).
    #[error("kernel.run_as = \"owner\": the owner {owner:?}'s account has {id} 0 (root); kernels never run as root")]
    Root {
        /// The owner's name.
        owner: String,
        /// `uid` or `gid`.
        id: &'static str,
    },
    /// The owner's account is `kernel.user`, the pre-warm pool's account.
    #[error(
        "kernel.run_as = \"owner\": the owner {owner:?}'s account is kernel.user's (uid {uid}), the account \
         pre-warmed processes run as before they become a kernel; kernels never share it"
    )]
    PoolAccount {
        /// The owner's name.
        owner: String,
        /// The shared uid.
        uid: u32,
    },
    /// The owner's account is a system account (uid or primary gid below the minimum).
    #[error(
        "kernel.run_as = \"owner\": the owner {owner:?}'s account has {id} {value}, below \
         kernel.owner_uid_min = {min}: kernels never run as a system account"
    )]
    SystemAccount {
        /// The owner's name.
        owner: String,
        /// `uid` or `gid`.
        id: &'static str,
        /// The account's uid or gid.
        value: u32,
        /// `kernel.owner_uid_min`.
        min: u32,
    },
    /// The owner's account is a member of a group of `kernel.owner_denied_groups`.
    #[error(
        "kernel.run_as = \"owner\": the owner {owner:?}'s account is a member of the group {group:?}, \
         which kernel.owner_denied_groups lists: kernels never run with a privileged group"
    )]
    DeniedGroup {
        /// The owner's name.
        owner: String,
        /// The denied group's name.
        group: String,
    },
    /// The name cannot be an account's (a NUL byte, or empty).
    #[error("kernel.run_as = \"owner\": the owner {owner:?} cannot name a system account")]
    BadName {
        /// The owner's name.
        owner: String,
    },
    /// The account database could not be read.
    #[error("kernel.run_as = \"owner\": looking up the owner {owner:?}'s account: {source}")]
    Lookup {
        /// The owner's name.
        owner: String,
        /// The error of getpwnam_r/getgrouplist.
        source: nix::Error,
    },
}

/// The account kernel owner `owner` runs as, if it satisfies `rules`.
pub fn lookup(owner: Option<&str>, rules: &OwnerRules) -> Result<OwnerAccount, OwnerError> {
    let pool_uid = rules.pool_uid;
    let owner = owner.ok_or(OwnerError::NoOwner)?;
    let bad_name = || OwnerError::BadName { owner: owner.to_owned() };
    let c_name = CString::new(owner).map_err(|_| bad_name())?;
    if owner.is_empty() {
        return Err(bad_name());
    }
    let lookup_failed = |source| OwnerError::Lookup { owner: owner.to_owned(), source };
    let account = nix::unistd::User::from_name(owner)
        .map_err(lookup_failed)?
        .ok_or_else(|| OwnerError::NoAccount { owner: owner.to_owned() })?;
    let root = |id| OwnerError::Root { owner: owner.to_owned(), id };
    if account.uid.is_root() {
        return Err(root("uid"));
    }
    if account.gid.as_raw() == 0 {
        return Err(root("gid"));
    }
    if account.uid.as_raw() == pool_uid {
        return Err(OwnerError::PoolAccount { owner: owner.to_owned(), uid: pool_uid });
    }
    let system = |id, value| OwnerError::SystemAccount { owner: owner.to_owned(), id, value, min: rules.uid_min };
    if account.uid.as_raw() < rules.uid_min {
        return Err(system("uid", account.uid.as_raw()));
    }
    if account.gid.as_raw() < rules.uid_min {
        return Err(system("gid", account.gid.as_raw()));
    }
    let all_groups: Vec<u32> = nix::unistd::getgrouplist(&c_name, account.gid)
        .map_err(lookup_failed)?
        .into_iter()
        .map(|g| g.as_raw())
        .collect();
    if let Some(group) = denied_group(&all_groups, &rules.denied_groups).map_err(lookup_failed)? {
        return Err(OwnerError::DeniedGroup { owner: owner.to_owned(), group });
    }
    let mut groups: Vec<u32> = all_groups
        .into_iter()
        // Membership in root's group would give a kernel root's group files.
        .filter(|g| *g != 0)
        .collect();
    groups.sort_unstable();
    groups.dedup();
    Ok(OwnerAccount {
        name: owner.to_owned(),
        uid: account.uid.as_raw(),
        gid: account.gid.as_raw(),
        groups,
        home: Some(account.dir).filter(|h| h.is_absolute()),
    })
}

/// The first of `denied` (group names) whose gid is among `groups`. A name that is no
/// group on this host denies nothing: the default list names groups of several distributions.
fn denied_group(groups: &[u32], denied: &[String]) -> Result<Option<String>, nix::Error> {
    for name in denied {
        if let Some(group) = nix::unistd::Group::from_name(name)? {
            if groups.contains(&group.gid.as_raw()) {
                return Ok(Some(name.clone()));
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(pool_uid: u32, uid_min: u32, denied_groups: &[&str]) -> OwnerRules {
        OwnerRules { pool_uid, uid_min, denied_groups: denied_groups.iter().map(|g| (*g).to_owned()).collect() }
    }

    #[test]
    fn no_owner_a_missing_account_and_root_are_refused_naming_the_account_and_run_as() {
        let e = lookup(None, &rules(1, 1, &[])).expect_err("no owner").to_string();
        assert!(e.contains("kernel.run_as") && e.contains("no owner"), "{e}");
        let e = lookup(Some("nbos-no-such-owner-xyz"), &rules(1, 1, &[])).expect_err("missing").to_string();
        assert!(
            e.contains("kernel.run_as") && e.contains("\"nbos-no-such-owner-xyz\"") && e.contains("no system account"),
            "{e}"
        );
        let e = lookup(Some("root"), &rules(1, 1, &[])).expect_err("root").to_string();
        assert!(e.contains("kernel.run_as") && e.contains("\"root\"") && e.contains("uid 0"), "{e}");
        let e = lookup(Some("a\0b"), &rules(1, 1, &[])).expect_err("NUL").to_string();
        assert!(e.contains("cannot name"), "{e}");
        let e = lookup(Some(""), &rules(1, 1, &[])).expect_err("empty").to_string();
        assert!(e.contains("cannot name"), "{e}");
    }

    #[test]
    fn the_pools_account_is_refused_and_another_account_is_found_with_its_home() {
        // `nobody` exists on every Linux host we run on (uid 65534, not root).
        let nobody = nix::unistd::User::from_name("nobody").ok().flatten().expect("a `nobody` account");
        let e = lookup(Some("nobody"), &rules(nobody.uid.as_raw(), 1, &[])).expect_err("the pool's uid").to_string();
        assert!(e.contains("kernel.user"), "{e}");
        assert_ne!(nobody.gid.as_raw(), 0, "nobody's group is not root's");
        let id = lookup(Some("nobody"), &rules(1, 1, &[])).expect("nobody");
        assert_eq!((id.uid, id.gid, id.name.as_str()), (nobody.uid.as_raw(), nobody.gid.as_raw(), "nobody"));
        assert!(id.groups.contains(&id.gid), "the primary group is among the groups: {:?}", id.groups);
        assert!(!id.groups.contains(&0));
    }

    #[test]
    fn a_system_account_and_a_member_of_a_denied_group_are_refused_naming_the_key() {
        // `daemon` (uid 1 on Debian, Ubuntu, Fedora) is a system account on every host we run on.
        let daemon = nix::unistd::User::from_name("daemon").ok().flatten().expect("a `daemon` account");
        assert!(!daemon.uid.is_root() && daemon.gid.as_raw() != 0, "daemon is not root's");
        let e = lookup(Some("daemon"), &rules(u32::MAX - 1, 1000, &[])).expect_err("system").to_string();
        assert!(e.contains("kernel.owner_uid_min = 1000") && e.contains("\"daemon\""), "{e}");
        let group = nix::unistd::Group::from_gid(daemon.gid).ok().flatten().expect("daemon's group");
        let e = lookup(Some("daemon"), &rules(u32::MAX - 1, 1, &["nbos-no-such-group", &group.name]))
            .expect_err("denied group")
            .to_string();
        assert!(e.contains("kernel.owner_denied_groups") && e.contains(&format!("{:?}", group.name)), "{e}");
        let ok = lookup(Some("daemon"), &rules(u32::MAX - 1, 1, &["nbos-no-such-group"])).expect("allowed");
        assert_eq!(ok.uid, daemon.uid.as_raw());
    }
}
