//! A real `notebookosd` started from a config file, for the integration tests that
//! talk to its HTTP API.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const NOTEBOOKOSD: &str = env!("CARGO_BIN_EXE_notebookosd");
/// The API token every test daemon is started with.
pub const TOKEN: &str = "integration-test-token-0123456789";

/// The project's Python with ipykernel (requirements-dev.txt).
pub fn python() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    assert!(p.exists(), "{} is missing: create the venv (make deps)", p.display());
    p
}

/// A temporary directory kernels can pass through (0711: enter, not list): a root
/// daemon's kernels run as another uid (kernel.user) and refuse to start under a 0700 one.
#[allow(dead_code)] // used by the start helpers below and by some test crates directly
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
    _dir: tempfile::TempDir,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill(2) on our own unreaped child.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let _ = self.child.wait();
    }
}

/// Starts a daemon on a loopback port with its own state, runtime dir and [`TOKEN`];
/// `extra_toml` adds sections. Returns once its endpoint file names its URL.
#[allow(dead_code)] // each test crate compiles this module and uses one of the two starts
pub fn start_daemon(extra_toml: &str, stderr: Stdio) -> Daemon {
    start_daemon_under(&[], extra_toml, stderr)
}

/// [`start_daemon`] with the daemon's command line run by `wrapper` (a program and its
/// arguments, e.g. `setpriv …`), which must exec the command it is given.
pub fn start_daemon_under(wrapper: &[&str], extra_toml: &str, stderr: Stdio) -> Daemon {
    let dir = kernel_traversable_tempdir();
    let token = dir.path().join("token");
    std::fs::write(&token, format!("{TOKEN}\n")).expect("token");
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        format!(
            "[node]\nstate_dir = {:?}\nruntime_dir = {:?}\n[http]\nlisten = \"127.0.0.1:0\"\ntoken_file = {:?}\n{extra_toml}",
            dir.path().join("state"),
            dir.path().join("run"),
            token,
        ),
    )
    .expect("config");
    let mut command = match wrapper.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(NOTEBOOKOSD);
            c
        }
        None => Command::new(NOTEBOOKOSD),
    };
    let child = command.arg("--config").arg(&config).stdout(Stdio::null()).stderr(stderr).spawn().expect("spawn");
    // Owned from here on, so a failed start still stops and reaps the child.
    let mut daemon = Daemon { child, url: String::new(), _dir: dir };
    daemon.url = wait_for_endpoint(&daemon._dir.path().join("run"));
    daemon
}

/// The URL a daemon with runtime directory `run_dir` serves, once it wrote its endpoint
/// file (within 30 s).
pub fn wait_for_endpoint(run_dir: &Path) -> String {
    let endpoint = run_dir.join("endpoint.json");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(e) = std::fs::read_to_string(&endpoint)
            .ok()
            .and_then(|t| serde_json::from_str::<notebookosd::link::endpoint::Endpoint>(&t).ok())
        {
            return e.url;
        }
        assert!(Instant::now() < deadline, "daemon did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One HTTP request; returns the status code and body whatever the status.
pub fn http(method: &str, url: &str, token: Option<&str>, body: Option<&str>) -> (u16, String) {
    let mut req = ureq::request(method, url);
    if let Some(t) = token {
        req = req.set("Authorization", &format!("token {t}"));
    }
    let res = match body {
        Some(b) => req.set("Content-Type", "application/json").send_string(b),
        None => req.call(),
    };
    match res {
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => panic!("{method} {url}: {e}"),
    }
}

/// Polls `done` until it holds; fails the test after `timeout`, naming `what`.
#[allow(dead_code)] // used by some test crates only
pub fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `code` in kernel `kernel` over its channels WebSocket, to its reply and `idle`:
/// the execute_result's text, or `ename: evalue` (JSON-quoted) of an error.
#[allow(dead_code)] // used by some test crates only
pub async fn run_cell(url: &str, kernel: &str, code: &str) -> String {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message as WsFrame;
    let ws = format!("{}/api/kernels/{kernel}/channels?token={TOKEN}", url.replacen("http", "ws", 1));
    let (socket, _) = tokio_tungstenite::connect_async(ws).await.expect("websocket");
    let (mut tx, mut rx) = socket.split();
    let msg_id = uuid::Uuid::new_v4().to_string();
    let req = serde_json::json!({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "session": "s", "version": "5.3"},
        "parent_header": {}, "metadata": {}, "content": {"code": code, "silent": false},
    });
    tx.send(WsFrame::Text(req.to_string().into())).await.expect("send");
    let (mut replied, mut value, mut idle) = (false, String::new(), false);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while !replied || !idle {
        let frame =
            tokio::time::timeout_at(deadline, rx.next()).await.expect("reply in time").expect("open").expect("ok");
        let WsFrame::Text(t) = frame else { continue };
        let v: serde_json::Value = serde_json::from_str(t.as_str()).expect("json");
        if v["parent_header"]["msg_id"] != msg_id.as_str() {
            continue;
        }
        match v["msg_type"].as_str() {
            Some("execute_result") => value = v["content"]["data"]["text/plain"].as_str().unwrap_or("").to_owned(),
            Some("error") => value = format!("{}: {}", v["content"]["ename"], v["content"]["evalue"]),
            Some("status") => idle |= v["content"]["execution_state"] == "idle",
            Some("execute_reply") => replied = true,
            _ => {}
        }
    }
    value
}
