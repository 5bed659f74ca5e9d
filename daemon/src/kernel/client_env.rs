//! Which environment variables an API client may give a kernel: one allow-list for the
//! gateway's `POST /api/kernels`, the cluster API's `POST /api/v1/cluster/kernels` and the
//! replica hosts that start a kernel from its record. As Kernel Gateway, `KERNEL_*`
//! (and `JPY_SESSION_NAME`); anything else, `LD_PRELOAD` or `PYTHONPATH` for instance,
//! would let a client choose code the kernel process (and its GPU shim) loads.

/// Whether a client may set `name` in a kernel's environment.
pub fn is_client_settable(name: &str) -> bool {
    // Plain identifiers only: a `=` or NUL in a name would be read back as another variable.
    let plain = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    plain && (name.starts_with("KERNEL_") || name == "JPY_SESSION_NAME")
}

/// The names in `names` a client may not set, sorted (for an error message).
pub fn refused_names<'a>(names: impl IntoIterator<Item = &'a String>) -> Vec<&'a str> {
    let mut out: Vec<&str> = names.into_iter().map(String::as_str).filter(|n| !is_client_settable(n)).collect();
    out.sort_unstable();
    out
}

/// What a client may set of `env`, keeping its order; `dropped` says how many were left out.
pub fn settable<I: IntoIterator<Item = (String, String)>>(env: I) -> (Vec<(String, String)>, usize) {
    let mut dropped = 0;
    let kept = env
        .into_iter()
        .filter(|(k, _)| {
            let ok = is_client_settable(k);
            dropped += usize::from(!ok);
            ok
        })
        .collect();
    (kept, dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kernel_variables_and_the_session_name_are_settable() {
        for ok in ["KERNEL_GPUS", "KERNEL_USERNAME", "JPY_SESSION_NAME", "KERNEL_GPU_MEMORY_MIB"] {
            assert!(is_client_settable(ok), "{ok}");
        }
        for bad in ["LD_PRELOAD", "PYTHONPATH", "PATH", "KERNEL", "kernel_x", "KERNEL_X=Y", "KERNEL_\0", "", "JPY_X"] {
            assert!(!is_client_settable(bad), "{bad:?}");
        }
    }

    #[test]
    fn settable_keeps_the_allowed_and_counts_the_rest() {
        let env = vec![
            ("KERNEL_A".to_owned(), "1".to_owned()),
            ("LD_PRELOAD".to_owned(), "/tmp/x.so".to_owned()),
            ("JPY_SESSION_NAME".to_owned(), "n".to_owned()),
        ];
        let (kept, dropped) = settable(env.clone());
        assert_eq!(kept, vec![env[0].clone(), env[2].clone()]);
        assert_eq!(dropped, 1);
        let names: Vec<String> = env.into_iter().map(|(k, _)| k).collect();
        assert_eq!(refused_names(&names), vec!["LD_PRELOAD"]);
    }
}
