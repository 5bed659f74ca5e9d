//! [`Caller`]: who made a request, as the gateway resolved it, and what they may see.

use super::account_name::{ANONYMOUS, HOST_PREFIX, OPERATOR};
use super::User;
use crate::config::Quota;

/// A user the request's credential named.
#[derive(Debug, Clone, PartialEq)]
pub struct UserCaller {
    /// The user.
    pub user: User,
    /// A member of `auth.admin_group`: sees and acts on every kernel.
    pub admin: bool,
    /// Their own quota keys (a users-file entry), which override `[limits.user]` key by key.
    pub quota: Quota,
}

/// Who made a request (handlers find it in the request's extensions).
#[derive(Debug, Clone, PartialEq)]
pub enum Caller {
    /// No users are configured: the users' shared token, a client certificate, or the
    /// token-less loopback API. Kernels have no owner; everyone sees every kernel.
    Anonymous,
    /// A user (their kernels are theirs).
    User(UserCaller),
    /// The operator token: sees and acts on every kernel.
    Operator,
    /// Another host of the cluster (its node certificate): acts for a user it checked.
    Host(u64),
}

impl Caller {
    /// The owner of a kernel this caller creates.
    pub fn owner(&self) -> Option<&str> {
        match self {
            Caller::User(u) => Some(&u.user.name),
            _ => None,
        }
    }

    /// The user, when the caller is one.
    pub fn user(&self) -> Option<&UserCaller> {
        match self {
            Caller::User(u) => Some(u),
            _ => None,
        }
    }

    /// Sees and acts on every kernel (admins, operators, hosts, and everyone without users).
    pub fn sees_every_kernel(&self) -> bool {
        match self {
            Caller::User(u) => u.admin,
            Caller::Anonymous | Caller::Operator | Caller::Host(_) => true,
        }
    }

    /// May see (and act on) a kernel owned by `owner`.
    pub fn may_see(&self, owner: Option<&str>) -> bool {
        self.sees_every_kernel() || (owner.is_some() && owner == self.owner())
    }

    /// The name the audit log and metrics give the caller (no user may take the names of the
    /// others: [`super::account_name::check_user_name`]).
    pub fn audit_name(&self) -> String {
        match self {
            Caller::Anonymous => ANONYMOUS.to_owned(),
            Caller::User(u) => u.user.name.clone(),
            Caller::Operator => OPERATOR.to_owned(),
            Caller::Host(id) => format!("{HOST_PREFIX}{id}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str, admin: bool) -> Caller {
        Caller::User(UserCaller { user: User { name: name.into(), groups: vec![] }, admin, quota: Quota::default() })
    }

    #[test]
    fn users_see_their_own_kernels_and_admins_all() {
        let alice = user("alice", false);
        assert!(alice.may_see(Some("alice")));
        assert!(!alice.may_see(Some("bob")));
        assert!(!alice.may_see(None), "a kernel without an owner is not every user's");
        assert!(user("root", true).may_see(Some("alice")));
        assert!(Caller::Operator.may_see(Some("alice")));
        assert!(Caller::Anonymous.may_see(None));
        assert_eq!(alice.owner(), Some("alice"));
        assert_eq!(Caller::Operator.owner(), None);
    }
}
