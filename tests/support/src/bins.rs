//! Where the binaries a launcher starts are: `NBOS_BIN_DIR` if set, else next to the
//! running program (a test binary in `target/<profile>/deps/` finds them one directory up).

use std::path::{Path, PathBuf};

/// The directory holding `notebookosd` and `nbos`.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("NBOS_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe.parent().map(Path::to_owned).unwrap_or_default();
    if dir.ends_with("deps") {
        return dir.parent().map(Path::to_owned).unwrap_or(dir);
    }
    dir
}

/// The `notebookosd` binary.
pub fn notebookosd() -> PathBuf {
    bin_dir().join("notebookosd")
}

/// The `nbos` binary.
pub fn nbos() -> PathBuf {
    bin_dir().join("nbos")
}

/// The project's Python with ipykernel (requirements-dev.txt), `.venv/bin/python` at the
/// repository root (a symbolic link is kept as is: the venv's Python finds its packages
/// through the path it was started as).
pub fn python() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    assert!(p.exists(), "{} is missing: create the venv (make deps)", p.display());
    p
}
