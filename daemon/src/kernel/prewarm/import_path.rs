//! With `kernel.run_as = "owner"` a pool process holds CAP_SETUID and CAP_SETGID until it
//! becomes a kernel, and imports Python modules (the launcher, ipykernel) before that: a
//! module or `.pth` file an unprivileged account can put on the interpreter's import path
//! would run with those capabilities, which allow uid 0 (`setresuid(0)`) and any group.
//! So the pool is only started for owner kernels when every directory of the import path,
//! and every directory above it, is root's and writable by nobody else.

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::Context;

/// One directory a non-root account could write into, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} {why}", path.display())]
pub struct WritablePath {
    /// The directory.
    pub path: PathBuf,
    /// What makes it writable.
    pub why: String,
}

/// The interpreter's import path: `sys.path` as `python -s` starts. First without `site`
/// (`-S`: no `.pth` file runs, as this runs as root), and only once those directories pass,
/// with it (the directories `.pth` files add, which root alone could then have written).
pub fn check_interpreter(python: &Path, env: &[(OsString, OsString)]) -> anyhow::Result<Result<(), WritablePath>> {
    const NO_SITE: &str =
        "import sys, json, site; print(json.dumps([p for p in sys.path + site.getsitepackages() if p]))";
    const WITH_SITE: &str = "import sys, json; print(json.dumps([p for p in sys.path if p]))";
    for (flags, code) in [(&["-s", "-S"][..], NO_SITE), (&["-s"][..], WITH_SITE)] {
        let paths = sys_path(python, flags, code, env)?;
        if let Err(e) = check_dirs(&paths) {
            return Ok(Err(e));
        }
    }
    Ok(Ok(()))
}

/// Runs `python <flags> -c <code>` with `env` alone, which prints a JSON list of paths.
fn sys_path(python: &Path, flags: &[&str], code: &str, env: &[(OsString, OsString)]) -> anyhow::Result<Vec<PathBuf>> {
    let out = std::process::Command::new(python)
        .args(flags)
        .arg("-c")
        .arg(code)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("running {} to read its import path", python.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "{} could not print its import path ({}): {}",
        python.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let paths: Vec<String> = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("reading the import path {} printed", python.display()))?;
    Ok(paths.into_iter().map(PathBuf::from).collect())
}

/// Every existing entry of `paths` (a directory, or a zip file) and every directory above
/// it, both as written and with symlinks resolved: owned by root and writable by neither
/// group nor others. A missing entry is skipped, its parents are not: whoever could make
/// it could write their own modules into it.
pub fn check_dirs(paths: &[PathBuf]) -> Result<(), WritablePath> {
    for path in paths {
        let mut forms = vec![path.clone()];
        if let Ok(real) = std::fs::canonicalize(path) {
            forms.push(real);
        }
        for form in forms {
            for dir in form.ancestors().filter(|d| !d.as_os_str().is_empty()) {
                // The link itself (a symlink's own mode says nothing); its target is
                // checked through the resolved form, its directory as the next ancestor.
                let Ok(meta) = dir.symlink_metadata() else { continue };
                if meta.file_type().is_symlink() {
                    continue;
                }
                if let Some(why) = verdict(meta.uid(), meta.mode()) {
                    return Err(WritablePath { path: dir.to_path_buf(), why });
                }
            }
        }
    }
    Ok(())
}

/// Why a directory owned by `uid` with `mode` is writable by a non-root account, if it is.
/// A sticky bit (`/tmp`) does not help: anyone may still create a new module there.
fn verdict(uid: u32, mode: u32) -> Option<String> {
    if uid != 0 {
        return Some(format!("is owned by uid {uid}, not root"));
    }
    if mode & 0o022 != 0 {
        return Some(format!("is writable by its group or by others (mode {:o})", mode & 0o7777));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_verdict_wants_root_and_no_group_or_other_write() {
        assert_eq!(verdict(0, 0o40755), None);
        assert!(verdict(0, 0o41777).is_some_and(|w| w.contains("1777")), "a sticky /tmp fails");
        assert!(verdict(0, 0o40775).is_some());
        assert!(verdict(1000, 0o40755).is_some_and(|w| w.contains("uid 1000")));
    }

    #[test]
    fn a_world_writable_directory_fails_and_a_root_owned_0755_path_passes() {
        let tmp = tempfile::tempdir().expect("tmp");
        let open = tmp.path().join("site-packages");
        std::fs::create_dir(&open).expect("mkdir");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let e = check_dirs(std::slice::from_ref(&open)).expect_err("0777");
        // The directory itself, or one above it that is not root's (a test's temp dir).
        assert!(open.starts_with(&e.path), "{e}");
        assert!(e.to_string().contains(&*e.path.to_string_lossy()), "names the path: {e}");
        // `/usr` is root's, 0755, on every host we run on.
        let usr = Path::new("/usr").metadata().expect("/usr");
        if usr.uid() == 0 && usr.mode() & 0o022 == 0 {
            check_dirs(&[PathBuf::from("/usr"), PathBuf::from("/nbos-no-such-dir/x")]).expect("root's 0755 /usr");
        }
    }
}
