//! Whether a name an identity source vouches for is safe as a system account name: with
//! `kernel.run_as = "owner"` it becomes the kernel's account, and it appears in paths and logs.

/// The longest account name (`LOGIN_NAME_MAX` is 256, but useradd and utmp stop at 32).
const MAX_LEN: usize = 32;

/// A conservative POSIX account name: lower-case ASCII letters, digits, `_`, `-` and `.`,
/// starting with a letter or `_`, at most 32 bytes. No `/`, `@`, spaces, upper case or
/// leading `-` (option-like), and never all digits (read as a uid by chown and friends).
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
        for name in ["alice", "bob-smith", "j.doe", "_svc", "user42", "a"] {
            assert!(is_safe_account_name(name), "{name}");
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
        }
    }
}
