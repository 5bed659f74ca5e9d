//! One `notebookosd` started from a config file the builder wrote, on a loopback port
//! it picks itself, for the tests that talk to one host's HTTP API.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::config::DaemonConfig;
use crate::{bins, signal, TOKEN};

/// A temporary directory kernels can pass through (0711: enter, not list): a root
/// daemon's kernels run as another uid (kernel.user) and refuse to start under a 0700 one.
pub fn kernel_traversable_tempdir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).expect("chmod 0711");
    dir
}

/// A daemon child process, stopped with SIGTERM and reaped on drop.
pub struct Daemon {
    pub child: Child,
    pub url: String,
    dir: tempfile::TempDir,
}

impl Daemon {
    /// Its directory: `token`, `c.toml`, `state/`, `run/`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        signal::term(&self.child);
        let _ = self.child.wait();
    }
}

/// The configuration [`start_daemon`] starts from: its own state and runtime directories
/// under `dir`, a loopback port the daemon picks, [`TOKEN`] (written to `dir/token`) and
/// the repository's venv as the kernels' Python.
pub fn base_config(dir: &Path) -> DaemonConfig {
    let token = dir.join("token");
    std::fs::write(&token, format!("{TOKEN}\n")).expect("token");
    let mut config = DaemonConfig::new(dir);
    config.tokens(&token, None).python(&bins::python());
    config
}

/// Starts a daemon from [`base_config`] as `edit` changes it, its command line run by
/// `wrapper` (a program and its arguments, e.g. `setpriv …`, which must exec the command
/// it is given; empty: none). Returns once its endpoint file names its URL.
pub fn start_daemon(wrapper: &[&str], stderr: Stdio, edit: impl FnOnce(&mut DaemonConfig)) -> Daemon {
    start_daemon_in(kernel_traversable_tempdir(), wrapper, stderr, edit, |_| {})
}

/// [`start_daemon`] in `dir` (which holds its token, config, `state/` and `run/`), with
/// `prepare` changing the command before it is spawned (e.g. a sandbox its child enters).
pub fn start_daemon_in(
    dir: tempfile::TempDir,
    wrapper: &[&str],
    stderr: Stdio,
    edit: impl FnOnce(&mut DaemonConfig),
    prepare: impl FnOnce(&mut Command),
) -> Daemon {
    let mut config = base_config(dir.path());
    edit(&mut config);
    let path = config.write(&dir.path().join("c.toml")).expect("config");
    let daemon = bins::notebookosd();
    let mut command = match wrapper.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(&daemon);
            c
        }
        None => Command::new(&daemon),
    };
    command.arg("--config").arg(&path).stdout(Stdio::null()).stderr(stderr);
    prepare(&mut command);
    let child = command.spawn().expect("spawn");
    // Owned from here on, so a failed start still stops and reaps the child.
    let mut daemon = Daemon { child, url: String::new(), dir };
    daemon.url = wait_for_endpoint(&daemon.dir.path().join("run"));
    daemon
}

/// The URL a daemon with runtime directory `run_dir` serves, once it wrote its endpoint
/// file (within 30 s).
pub fn wait_for_endpoint(run_dir: &Path) -> String {
    let endpoint = run_dir.join("endpoint.json");
    crate::wait::wait_for(Duration::from_secs(30), "the daemon to start (its endpoint file)", || {
        read_endpoint(&endpoint)
    })
}

/// The URL in a daemon's endpoint file, once it is there and whole.
pub fn read_endpoint(endpoint: &Path) -> Option<String> {
    let text = std::fs::read_to_string(endpoint).ok()?;
    serde_json::from_str::<notebookosd::link::endpoint::Endpoint>(&text).ok().map(|e| e.url)
}
