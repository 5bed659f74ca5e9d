//! `kernel.run_as = "owner"`: the system account a kernel runs as is the one named as its
//! owner (the authenticated user who created it, kept in its cluster record), found by
//! NSS (`getpwnam_r`), with that account's groups (`getgrouplist`, as initgroups(3) gives
//! a login) and home. Never root, and never the pool's own account: pool processes hold
//! CAP_SETUID until they become a kernel, so no kernel may share their uid.

use std::ffi::CString;
use std::path::PathBuf;

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

/// The account kernel owner `owner` runs as; `pool_uid` is `kernel.user`'s uid.
pub fn lookup(owner: Option<&str>, pool_uid: u32) -> Result<OwnerAccount, OwnerError> {
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
    let mut groups: Vec<u32> = nix::unistd::getgrouplist(&c_name, account.gid)
        .map_err(lookup_failed)?
        .into_iter()
        .map(nix::unistd::Gid::as_raw)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_owner_a_missing_account_and_root_are_refused_naming_the_account_and_run_as() {
        let e = lookup(None, 1).expect_err("no owner").to_string();
        assert!(e.contains("kernel.run_as") && e.contains("no owner"), "{e}");
        let e = lookup(Some("nbos-no-such-owner-xyz"), 1).expect_err("missing").to_string();
        assert!(
            e.contains("kernel.run_as") && e.contains("\"nbos-no-such-owner-xyz\"") && e.contains("no system account"),
            "{e}"
        );
        let e = lookup(Some("root"), 1).expect_err("root").to_string();
        assert!(e.contains("kernel.run_as") && e.contains("\"root\"") && e.contains("uid 0"), "{e}");
        let e = lookup(Some("a\0b"), 1).expect_err("NUL").to_string();
        assert!(e.contains("cannot name"), "{e}");
        let e = lookup(Some(""), 1).expect_err("empty").to_string();
        assert!(e.contains("cannot name"), "{e}");
    }

    #[test]
    fn the_pools_account_is_refused_and_another_account_is_found_with_its_home() {
        // `nobody` exists on every Linux host we run on (uid 65534, not root).
        let Ok(Some(nobody)) = nix::unistd::User::from_name("nobody") else {
            eprintln!("skipping: no `nobody` account on this host");
            return;
        };
        let e = lookup(Some("nobody"), nobody.uid.as_raw()).expect_err("the pool's uid").to_string();
        assert!(e.contains("kernel.user"), "{e}");
        if nobody.gid.as_raw() == 0 {
            return;
        }
        let id = lookup(Some("nobody"), 1).expect("nobody");
        assert_eq!((id.uid, id.gid, id.name.as_str()), (nobody.uid.as_raw(), nobody.gid.as_raw(), "nobody"));
        assert!(id.groups.contains(&id.gid), "the primary group is among the groups: {:?}", id.groups);
        assert!(!id.groups.contains(&0));
    }
}
