//! The one rule for the user names every identity source vouches for (the users file, a
//! client certificate's Common Name, JupyterHub, OIDC): [`check_user_name`]. With
//! `kernel.run_as = "owner"` a name becomes the kernel's system account, it appears in paths,
//! logs and metric labels, and the audit log and metrics give some callers names of their own,
//! which no user may take (or a user could pass for a host, the operator, or the crowd).

/// The longest account name (`LOGIN_NAME_MAX` is 256, but useradd and utmp stop at 32).
const MAX_LEN: usize = 32;

/// The audit name of a host of the cluster is `node-<id>` ([`super::Caller::audit_name`]), and a
/// certificate whose Common Name starts so is a host's.
pub const HOST_PREFIX: &str = "node-";
/// The audit name of a caller without a user (no users are configured).
pub const ANONYMOUS: &str = "anonymous";
/// The audit name of the operator token.
pub const OPERATOR: &str = "operator";
/// The audit name of a request whose credential was refused (no one is known).
pub const UNKNOWN: &str = "unknown";

/// Names the daemon gives callers that are not users, or a group of users (the metrics'
/// overflow label). No source may vouch for them.
const RESERVED: [&str; 4] = [ANONYMOUS, OPERATOR, UNKNOWN, super::metrics::OTHER_USERS];

/// Why a name cannot be a user's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UserNameError {
    /// Not a conservative POSIX account name.
    #[error(
        "{name:?} is not a POSIX account name ([a-z_][a-z0-9_.-]*: lower-case letters, digits, _ - ., at most 32 bytes)"
    )]
    NotAnAccountName {
        /// The name (at most 64 characters of it: it may come from a certificate or a token).
        name: String,
    },
    /// A name the daemon uses for a caller that is not a user.
    #[error(
        "{name:?} is a name the daemon gives callers that are not users (node-* are the cluster's hosts; operator, anonymous, unknown and other are reserved)"
    )]
    Reserved {
        /// The name.
        name: String,
    },
}

/// Whether `name` may be a user's: a safe account name ([`is_safe_account_name`]) and none the
/// daemon uses for itself (`node-*`, `operator`, `anonymous`, `unknown`, `other`).
pub fn check_user_name(name: &str) -> Result<(), UserNameError> {
    if !is_safe_account_name(name) {
        return Err(UserNameError::NotAnAccountName { name: name.chars().take(64).collect() });
    }
    if name.starts_with(HOST_PREFIX) || RESERVED.contains(&name) {
        return Err(UserNameError::Reserved { name: name.to_owned() });
    }
    Ok(())
}

/// A conservative POSIX account name: lower-case ASCII letters, digits, `_`, `-` and `.`
/// (POSIX's portable set, lower-cased), starting with a letter or `_`, at most 32 bytes. No
/// `/`, `@`, spaces, upper case, leading `-` (option-like) or `.` (hidden, `..`), and never all
/// digits (read as a uid by chown and friends).
pub fn is_safe_account_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    let Some(first) = bytes.next() else { return false };
    name.len() <= MAX_LEN
        && (first.is_ascii_lowercase() || first == b'_')
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_names_are_safe() {
        for name in ["alice", "bob-smith", "j.doe", "_svc", "user42", "a", "nodes", "node", "others"] {
            assert!(is_safe_account_name(name), "{name}");
            assert_eq!(check_user_name(name), Ok(()), "{name}");
        }
    }

    #[test]
    fn names_that_could_escape_or_confuse_are_refused() {
        let long = "a".repeat(33);
        for name in [
            "",
            "Alice",
            "-rf",
            ".hidden",
            "1000",
            "../etc",
            "a/b",
            "a b",
            "alice@example.com",
            "ali\u{e7}e",
            "a\n",
            &long,
        ] {
            assert!(!is_safe_account_name(name), "{name:?}");
            assert!(matches!(check_user_name(name), Err(UserNameError::NotAnAccountName { .. })), "{name:?}");
        }
    }

    #[test]
    fn the_daemons_own_names_are_refused() {
        for name in ["node-1", "node-", "node-x", "operator", "anonymous", "unknown", "other"] {
            let error = check_user_name(name).expect_err(name);
            assert_eq!(error, UserNameError::Reserved { name: name.to_owned() });
        }
        assert_eq!(super::super::metrics::OTHER_USERS, "other", "the metrics' overflow label is reserved");
    }

    #[test]
    fn a_long_name_is_cut_in_the_error() {
        let name = "A".repeat(1000);
        let error = check_user_name(&name).expect_err("upper case");
        assert!(error.to_string().len() < 300, "{error}");
    }
}
