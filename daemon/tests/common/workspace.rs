//! Where the workspace's binaries and files are, for the test crates of every package
//! (notebookosd's, the CLI's, the benchmarks'). Cargo names a package's own binaries to its tests
//! (`CARGO_BIN_EXE_<name>`); the tests of the other packages (notebookosd's tests run `nbos`,
//! the CLI's and the benchmarks' run `notebookosd`) find them where `cargo build --workspace`
//! put them: the directory above the test executable's `deps/`.

use std::path::{Path, PathBuf};
use std::sync::LazyLock;

/// The `notebookosd` binary.
#[allow(dead_code)] // not every test crate starts a daemon
pub static NOTEBOOKOSD: LazyLock<&'static str> =
    LazyLock::new(|| option_env!("CARGO_BIN_EXE_notebookosd").unwrap_or_else(|| beside_tests("notebookosd")));

/// The `nbos` binary.
#[allow(dead_code)] // not every test crate runs the CLI
pub static NBOS: LazyLock<&'static str> =
    LazyLock::new(|| option_env!("CARGO_BIN_EXE_nbos").unwrap_or_else(|| beside_tests("nbos")));

/// `<target>/<profile>/<name>`, for a test running as `<target>/<profile>/deps/<test>-<hash>`.
fn beside_tests(name: &str) -> &'static str {
    let exe = std::env::current_exe().expect("the test's own path");
    let dir = exe.parent().and_then(Path::parent).expect("a test runs from <target>/<profile>/deps");
    let bin = dir.join(name);
    assert!(
        bin.exists(),
        "{} is missing: build the workspace first (cargo build --workspace --all-targets)",
        bin.display()
    );
    // Once per binary and test process: the path lives as long as the tests.
    Box::leak(bin.into_os_string().into_string().expect("a UTF-8 target directory").into_boxed_str())
}

/// The repository's root (the workspace's, with `Cargo.lock`), whichever package's test this is.
#[allow(dead_code)] // not every test crate reads the repository's files
pub fn repo() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.ancestors().find(|d| d.join("Cargo.lock").is_file()).unwrap_or(manifest).to_path_buf()
}
