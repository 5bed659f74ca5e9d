//! Kernel ids: canonical hyphenated lowercase UUIDs, checked on every path that takes one,
//! because an id becomes a directory name (`<state_dir>/kernels/<id>`), a cgroup name and
//! a raft key, so `..` or `a/b` must never get that far.

/// True when `s` is a kernel id: a UUID in its canonical form (hyphenated, lowercase), so
/// one kernel has one spelling and no id can name another path.
pub fn is_kernel_id(s: &str) -> bool {
    // Parsing alone accepts braces, `urn:uuid:`, the simple form and uppercase.
    uuid::Uuid::parse_str(s).is_ok_and(|u| u.hyphenated().to_string() == s)
}

#[cfg(test)]
mod tests {
    use super::is_kernel_id;

    #[test]
    fn a_fresh_v4_uuid_is_a_kernel_id() {
        assert!(is_kernel_id(&uuid::Uuid::new_v4().to_string()));
        assert!(is_kernel_id("6f1c1a7e-2b9d-4c3e-8f00-0123456789ab"));
    }

    #[test]
    fn paths_and_other_uuid_spellings_are_not() {
        let u = uuid::Uuid::new_v4();
        let refused = [
            String::new(),
            "..".to_owned(),
            ".".to_owned(),
            "../x".to_owned(),
            "a/b".to_owned(),
            "not-a-uuid".to_owned(),
            format!("{{{u}}}"),
            format!("urn:uuid:{u}"),
            u.to_string().to_uppercase(),
            u.simple().to_string(),
            format!("{u}\n"),
            format!(" {u}"),
            format!("{u}/.."),
        ];
        for s in refused {
            assert!(!is_kernel_id(&s), "{s:?} was taken as a kernel id");
        }
    }
}
