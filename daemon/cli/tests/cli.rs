//! The binaries as an operator uses them: config validation, dev mode, `nbos status`,
//! token auth, unfinished subcommands.

#[path = "../../tests/required/mod.rs"]
mod required;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nbos_test_support::bins;
const NBOS: &str = env!("CARGO_BIN_EXE_nbos");

/// The `notebookosd` binary as text (written into a unit file, run like `NBOS`).
fn notebookosd() -> String {
    bins::notebookosd().display().to_string()
}

fn run(bin: &str, args: &[&str]) -> Output {
    Command::new(bin).args(args).env_remove("NBOS_URL").env_remove("NBOS_TOKEN").output().expect("spawn")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn write_config(dir: &Path, body: &str) -> std::path::PathBuf {
    let p = dir.join("notebookosd.toml");
    std::fs::write(&p, body).expect("write config");
    p
}

/// A daemon child process, killed on drop.
struct Daemon {
    child: Child,
    url: String,
}

impl Daemon {
    fn start(args: &[&str]) -> Daemon {
        let child = Command::new(bins::notebookosd())
            .args(args)
            .env("NBOS_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn notebookosd");
        // Owned by a Daemon from here on, so a failed start below still kills and reaps it.
        let mut daemon = Daemon { child, url: String::new() };
        let out = daemon.child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line =
                rx.recv_timeout(left).unwrap_or_else(|_| panic!("notebookosd did not print its URL within 20 s"));
            if let Some(rest) = line.split("listening on ").nth(1) {
                daemon.url = rest.trim().to_owned();
                return daemon;
            }
        }
    }

    fn terminate(mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        assert_eq!(rc, 0, "kill SIGTERM");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                return st;
            }
            assert!(Instant::now() < deadline, "notebookosd did not exit within 10 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http_get(url: &str, token: Option<&str>) -> (u16, String) {
    let mut req = ureq::get(url);
    if let Some(t) = token {
        req = req.set("Authorization", &format!("token {t}"));
    }
    match req.call() {
        Ok(r) => (r.status(), r.into_string().expect("body")),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => panic!("GET {url}: {e}"),
    }
}

#[test]
fn both_binaries_answer_help_and_version() {
    for bin in [notebookosd().as_str(), NBOS] {
        let v = run(bin, &["--version"]);
        assert!(v.status.success(), "{bin} --version: {}", stderr(&v));
        assert!(stdout(&v).contains(env!("CARGO_PKG_VERSION")), "{}", stdout(&v));
        let h = run(bin, &["--help"]);
        assert!(h.status.success());
        assert!(stdout(&h).contains("Usage:"), "{}", stdout(&h));
    }
    let h = stdout(&run(NBOS, &["--help"]));
    for sub in ["status", "kernels", "bench", "sim", "replay", "kernel-proxy"] {
        assert!(h.contains(sub), "nbos --help lacks {sub}: {h}");
    }
}

/// `nbos … | head` (issue 33): a reader that stops early ends the command quietly, killed by
/// SIGPIPE as `ls` is, never with a panic and a backtrace. The pipe's reader is gone before
/// the first byte, so the first write meets it.
#[test]
fn a_reader_that_stops_early_ends_the_command_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let mut child = Command::new(NBOS)
        .args(["completions", "bash"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait");
    let err = stderr(&out);
    assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{err}");
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{:?}: {err}", out.status);
}

#[test]
fn replay_refuses_a_trace_with_the_reason() {
    let o = run(NBOS, &["replay", "traces/sensei_june_60sec.csv", "--speedup", "100"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("--trace CSV --hours H") && e.contains("span days"),
        "a whole trace is refused, a slice named: {e}"
    );
    let o = run(NBOS, &["replay", "x.json", "--speedup", "0"]);
    assert!(stderr(&o).contains("--speedup must be a positive number"), "{}", stderr(&o));
}

#[test]
fn unknown_config_key_is_refused_and_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), "[gpu]\nidle_releas = \"10s\"\n");
    let o = run(&notebookosd(), &["--config", cfg.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("idle_releas") && e.contains("gpu"), "{e}");
    assert!(e.contains("line 2"), "{e}");
}

#[test]
fn malformed_config_value_is_refused_and_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), "[gpu]\nsubscription_ratio = \"lots\"\n");
    let o = run(&notebookosd(), &["--config", cfg.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("gpu.subscription_ratio"), "{}", stderr(&o));

    let cfg = write_config(dir.path(), "[http]\nlisten = \"0.0.0.0:8888\"\n");
    let o = run(&notebookosd(), &["--config", cfg.to_str().expect("utf8"), "--check-config"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("http.token_file"), "{}", stderr(&o));
}

/// `--check-config` checks the files the config names, and the start refuses the same with
/// the same exit 2 (issue 33): the unit's `RestartPreventExitStatus=2` then stops restarting.
#[test]
fn check_config_checks_the_files_the_config_names_and_the_start_refuses_them_with_exit_2() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let pki = |args: &[&str]| {
        let o = run(NBOS, args);
        assert!(o.status.success(), "nbos {args:?}: {}", stderr(&o));
    };
    let (ours, theirs) = (d.join("ours"), d.join("theirs"));
    for ca in [&ours, &theirs] {
        let ca = ca.to_str().expect("utf8");
        pki(&["pki", "init", "--dir", ca]);
        for node in ["1", "2"] {
            pki(&["pki", "issue", "--dir", ca, "node", node, "--ip", "127.0.0.1"]);
        }
    }
    let token = d.join("token");
    std::fs::write(&token, "0123456789abcdef0123456789abcdef\n").expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let refused = |name: &str, body: String, says: &[&str]| {
        let cfg = d.join(format!("{name}.toml"));
        std::fs::write(&cfg, body).expect("config");
        let cfg = cfg.to_str().expect("utf8");
        for args in [vec!["--config", cfg, "--check-config"], vec!["--config", cfg]] {
            let o = run(&notebookosd(), &args);
            let e = stderr(&o);
            assert_eq!(o.status.code(), Some(2), "{name} {args:?}: {e}");
            for s in says {
                assert!(e.contains(s), "{name} {args:?}: {s:?} not in {e}");
            }
        }
    };
    let base = |http: &str, rest: &str| {
        format!(
            "[node]\nstate_dir = {state:?}\nruntime_dir = {run:?}\n[http]\nlisten = \"127.0.0.1:0\"\n{http}\n\
             [gpu]\ndriver = \"none\"\n{rest}",
            state = d.join("state"),
            run = d.join("run"),
        )
    };
    let tok = format!("token_file = {token:?}");

    // A token file that is missing, or that others may change.
    let missing = d.join("no-such-token");
    refused("missing-token", base(&format!("token_file = {missing:?}"), ""), &["http.token_file", "no-such-token"]);
    let shared = d.join("shared-token");
    std::fs::write(&shared, "0123456789abcdef0123456789abcdef\n").expect("token");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    refused("writable-token", base(&format!("token_file = {shared:?}"), ""), &["http.token_file", "0666"]);
    // One in a directory others may write (they could put another file in its place).
    let open_dir = d.join("open");
    std::fs::create_dir(&open_dir).expect("dir");
    std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    std::fs::copy(&token, open_dir.join("token")).expect("copy");
    let in_open_dir = open_dir.join("token");
    refused(
        "token-in-open-dir",
        base(&format!("token_file = {in_open_dir:?}"), ""),
        &["http.token_file", "lets other accounts replace it"],
    );
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        // One owned by another account, who could chmod it back and change it.
        let theirs = d.join("their-token");
        std::fs::copy(&token, &theirs).expect("copy");
        std::os::unix::fs::chown(&theirs, Some(65534), None).expect("chown");
        refused("foreign-owner", base(&format!("token_file = {theirs:?}"), ""), &["http.token_file", "uid 65534"]);
    }

    // A TLS key that is not the certificate's.
    let (cert1, key2) = (ours.join("node-1.pem"), ours.join("node-2.key"));
    let mismatched = format!("{tok}\ntls = {{ cert = {cert1:?}, key = {key2:?} }}");
    refused("mismatched-key", base(&mismatched, ""), &["http.tls"]);

    // A node certificate another CA signed.
    let cluster = |ca: &Path, cert: &Path, key: &Path| {
        format!(
            "[cluster]\nenabled = true\nnode_id = 1\nraft_listen = \"127.0.0.1:1\"\nseeds = [\"1=127.0.0.1:1\"]\n\
             object_store = \"file://{objects}\"\ntls = {{ ca_cert = {ca:?}, cert = {cert:?}, key = {key:?} }}\n",
            objects = d.join("objects").display()
        )
    };
    let foreign = cluster(&ours.join("ca.pem"), &theirs.join("node-1.pem"), &theirs.join("node-1.key"));
    refused("foreign-cert", base(&tok, &foreign), &["cluster.tls.cert", "not signed by"]);

    // A driver library that is not one.
    let not_a_library = d.join("libcuda.so.1");
    std::fs::write(&not_a_library, "not ELF").expect("fake driver");
    let gpu = base(&tok, "").replace(
        "driver = \"none\"",
        &format!("driver = \"fake\"\nfake_gpus = 1\ncuda_driver_path = {not_a_library:?}"),
    );
    refused("bad-driver", gpu, &["CUDA driver", "does not load"]);

    // A shared object store the daemon cannot write: a read-only mount (what the unit's
    // ProtectSystem=strict makes of /srv or /mnt without a drop-in), or, not root, a 0555 directory.
    let good = base(&tok, &cluster(&ours.join("ca.pem"), &ours.join("node-1.pem"), &ours.join("node-1.key")));
    let store = d.join("objects");
    std::fs::create_dir(&store).expect("store");
    let cfg = d.join("read-only-store.toml");
    std::fs::write(&cfg, &good).expect("config");
    let o = if root {
        let script = format!(
            "mount --bind {s} {s} && mount -o remount,bind,ro {s} && exec {bin} --config {cfg} --check-config",
            s = store.display(),
            bin = notebookosd(),
            cfg = cfg.display()
        );
        run("unshare", &["--mount", "--propagation", "private", "sh", "-c", &script])
    } else {
        std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o555)).expect("chmod");
        let o = run(&notebookosd(), &["--config", cfg.to_str().expect("utf8"), "--check-config"]);
        std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        o
    };
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    for s in ["cluster.object_store", "objects"] {
        assert!(stderr(&o).contains(s), "{s:?} not in {}", stderr(&o));
    }
    if root {
        assert!(stderr(&o).contains("ReadWritePaths="), "the drop-in is not named: {}", stderr(&o));
    }

    // The same files, right, pass.
    let cfg = d.join("good.toml");
    std::fs::write(&cfg, good).expect("config");
    let o = run(&notebookosd(), &["--config", cfg.to_str().expect("utf8"), "--check-config"]);
    assert!(o.status.success(), "{}", stderr(&o));

    // The unit does not restart a refused configuration.
    let unit = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../packaging/notebookosd.service"))
        .expect("unit");
    assert!(unit.lines().any(|l| l.trim() == "RestartPreventExitStatus=2"), "{unit}");
}

/// The shipped config with its commented credential lines (`token_file`,
/// `operator_token_file`, both `tls`) uncommented names one set of files, the ones
/// operations.md installs: with them there (under a scratch /etc/notebookos), a cluster host
/// starts from it, serves HTTPS with that certificate, and its endpoint file gives local
/// clients its URL and CA (issue 33).
#[test]
fn the_shipped_config_with_its_credential_lines_uncommented_starts_a_tls_cluster_host() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let etc = d.join("etc");
    let pki = etc.join("pki");
    for args in [
        vec!["pki", "init", "--dir", pki.to_str().expect("utf8")],
        vec!["pki", "issue", "--dir", pki.to_str().expect("utf8"), "node", "1", "--ip", "127.0.0.1"],
    ] {
        let o = run(NBOS, &args);
        assert!(o.status.success(), "nbos {args:?}: {}", stderr(&o));
    }
    // Where operations.md's `install` lines put them.
    std::fs::rename(pki.join("node-1.pem"), pki.join("node.pem")).expect("node.pem");
    std::fs::rename(pki.join("node-1.key"), pki.join("node.key")).expect("node.key");
    for name in ["token", "operator-token"] {
        std::fs::write(etc.join(name), format!("{name}-0123456789abcdef0123456789\n")).expect("token");
        std::fs::set_permissions(etc.join(name), std::fs::Permissions::from_mode(0o600)).expect("chmod");
    }
    let raft_port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let shipped = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../packaging/notebookosd.toml"))
        .expect("shipped config");
    let mut uncommented = 0;
    let mut config = String::new();
    for line in shipped.lines() {
        let line = match line.strip_prefix("# ") {
            Some(rest) if ["token_file = ", "operator_token_file = ", "tls = "].iter().any(|k| rest.starts_with(k)) => {
                uncommented += 1;
                rest.to_owned()
            }
            _ => line.to_owned(),
        };
        let line = match line.split_once(" = ").map(|(k, _)| k) {
            Some("listen") => "listen = \"127.0.0.1:0\"".to_owned(),
            Some("state_dir") => format!("state_dir = {:?}", d.join("state")),
            Some("runtime_dir") => format!("runtime_dir = {:?}", d.join("run")),
            Some("enabled") => "enabled = true".to_owned(),
            Some("node_id") => "node_id = 1".to_owned(),
            Some("raft_listen") => format!("raft_listen = \"127.0.0.1:{raft_port}\""),
            Some("seeds") => format!("seeds = [\"1=127.0.0.1:{raft_port}\"]"),
            Some("object_store") => format!("object_store = \"file://{}\"", d.join("objects").display()),
            _ => line,
        };
        config.push_str(&line.replace("/etc/notebookos/", &format!("{}/", etc.display())));
        config.push('\n');
    }
    assert_eq!(uncommented, 4, "token_file, operator_token_file and two tls lines are commented in the shipped config");
    let cfg = write_config(d, &config);
    let o = run(&notebookosd(), &["--config", cfg.to_str().expect("utf8"), "--check-config"]);
    assert!(o.status.success(), "{}", stderr(&o));

    let daemon = Daemon::start(&["--config", cfg.to_str().expect("utf8")]);
    assert!(daemon.url.starts_with("https://127.0.0.1:"), "{}", daemon.url);
    let endpoint: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("run/endpoint.json")).expect("endpoint.json"))
            .expect("endpoint json");
    assert_eq!(endpoint["url"], daemon.url.as_str());
    assert_eq!(endpoint["ca_cert"], pki.join("ca.pem").to_str().expect("utf8"));
    let mode = std::fs::metadata(d.join("run/endpoint.json")).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode, 0o644, "local users' clients must read the endpoint file");
    // Which every account may: no token in it, only where the daemon's (0600) is.
    let text = std::fs::read_to_string(d.join("run/endpoint.json")).expect("endpoint.json");
    let token = std::fs::read_to_string(etc.join("token")).expect("token");
    assert!(!text.contains(token.trim()), "the endpoint file holds the token: {text}");
    // What nbos does with those two: the host answers over HTTPS with the operations.md certificate.
    let o = Command::new(NBOS)
        .args(["--url", &daemon.url, "--ca-cert", pki.join("ca.pem").to_str().expect("utf8"), "status", "--json"])
        .env("NBOS_TOKEN_FILE", etc.join("token"))
        .output()
        .expect("nbos status");
    assert!(o.status.success(), "nbos status: {}", stderr(&o));
    assert_eq!(daemon.terminate().code(), Some(0));
}

/// Every environment variable an operator can set is in configuration.md's table (issue 33):
/// the CLI's `env = "NBOS_…"` options, the token variables and the daemon's `NBOS_LOG`.
#[test]
fn the_environment_table_names_every_variable() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let doc = std::fs::read_to_string(root.join("docs/configuration.md")).expect("configuration.md");
    let table = &doc[doc.find("## Environment").expect("an Environment section")..];
    let mut names = vec!["NBOS_TOKEN".to_owned(), "NBOS_OPERATOR_TOKEN".to_owned(), "NBOS_LOG".to_owned()];
    let mut dirs = vec![root.join("daemon/cli/src"), root.join("daemon/bench/src")];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).expect("source dir").flatten() {
            let path = e.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&path).expect("source");
                for part in text.split("env = \"NBOS_").skip(1) {
                    let name: String = part.chars().take_while(|c| c.is_ascii_uppercase() || *c == '_').collect();
                    names.push(format!("NBOS_{name}"));
                }
            }
        }
    }
    assert!(names.len() > 6, "no env options found: {names:?}");
    for name in names {
        assert!(table.contains(&format!("`{name}`")), "{name} is not in docs/configuration.md's Environment table");
    }
}

#[test]
fn missing_config_file_is_named() {
    let o = run(&notebookosd(), &["--config", "/nonexistent/notebookosd.toml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("/nonexistent/notebookosd.toml"), "{}", stderr(&o));
}

#[test]
fn shipped_config_passes_check_config() {
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/../../packaging/notebookosd.toml");
    let o = run(&notebookosd(), &["--config", shipped, "--check-config"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("configuration OK"));
}

#[test]
fn dev_mode_refuses_a_non_loopback_address() {
    let o = run(&notebookosd(), &["--dev", "--listen", "0.0.0.0:0"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("loopback"), "{}", stderr(&o));
}

#[test]
fn dev_daemon_serves_status_health_and_metrics_then_cleans_up() {
    let d = Daemon::start(&["--dev", "--listen", "127.0.0.1:0", "--fake-gpus", "2"]);
    assert!(d.url.starts_with("http://127.0.0.1:"), "{}", d.url);

    let (code, body) = http_get(&format!("{}/healthz", d.url), None);
    assert_eq!((code, body.trim()), (200, "ok"));

    let o = Command::new(NBOS).args(["status", "--json"]).env("NBOS_URL", &d.url).output().expect("nbos");
    assert!(o.status.success(), "{}", stderr(&o));
    let status: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json status");
    assert_eq!(status["dev"], true);
    assert_eq!(status["inventory"]["source"], "fake");
    let gpus = status["inventory"]["gpus"].as_array().expect("gpus");
    assert_eq!(gpus.len(), 2);
    assert!(gpus.iter().all(|g| g["simulated"] == true));
    let state_dir = status["state_dir"].as_str().expect("state_dir").to_owned();
    assert!(Path::new(&state_dir).is_dir(), "{state_dir}");

    let table = Command::new(NBOS).arg("status").env("NBOS_URL", &d.url).output().expect("nbos");
    assert!(stdout(&table).contains("SIMULATED"), "{}", stdout(&table));

    let (code, metrics) = http_get(&format!("{}/metrics", d.url), None);
    assert_eq!(code, 200);
    assert!(metrics.contains("notebookos_gpus 2"), "{metrics}");
    assert!(metrics.contains("notebookos_http_requests_total{route=\"/api/v1/status\",code=\"200\"}"), "{metrics}");

    let st = d.terminate();
    assert!(st.success(), "graceful shutdown exits 0, got {st}");
    assert!(!Path::new(&state_dir).exists(), "temporary dev state dir {state_dir} must be removed on exit");
}

/// One raw HTTP/1.1 request (so `Host` and `Origin` are exactly what an attacker sends);
/// returns the status code.
fn raw_status(url: &str, request: &str) -> u16 {
    use std::io::{Read, Write};
    let addr = url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.write_all(request.as_bytes()).expect("write");
    let mut head = [0u8; 12];
    s.read_exact(&mut head).expect("status line");
    String::from_utf8_lossy(&head[9..12]).parse().expect("status code")
}

#[test]
fn the_token_less_dev_api_answers_only_local_programs() {
    let d = Daemon::start(&["--dev", "--listen", "127.0.0.1:0"]);
    let port = d.url.rsplit(':').next().expect("port").to_owned();
    let get = |host: &str, extra: &str| {
        raw_status(&d.url, &format!("GET /api/v1/status HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n"))
    };
    // What a local client sends.
    assert_eq!(get(&format!("127.0.0.1:{port}"), ""), 200);
    assert_eq!(get(&format!("localhost:{port}"), &format!("Origin: http://localhost:{port}\r\n")), 200);
    // DNS rebinding: a web page's name resolved to 127.0.0.1.
    assert_eq!(get(&format!("rebound.evil.example:{port}"), ""), 403);
    // A web page on another origin calling the loopback port.
    assert_eq!(get(&format!("127.0.0.1:{port}"), "Origin: https://evil.example\r\n"), 403);
    // A form post (no preflight) must not start a kernel.
    let form = "name=python3";
    let post = format!(
        "POST /api/kernels HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{form}",
        form.len()
    );
    assert_eq!(raw_status(&d.url, &post), 415);
    let (code, kernels) = http_get(&format!("{}/api/kernels", d.url), None);
    assert_eq!((code, kernels.trim()), (200, "[]"), "no kernel was started");
    let (_, metrics) = http_get(&format!("{}/metrics", d.url), None);
    assert!(metrics.contains("code=\"403\"") && metrics.contains("code=\"415\""), "{metrics}");
}

#[test]
fn token_is_required_when_configured() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token = "0123456789abcdef-test-token";
    std::fs::write(dir.path().join("token"), format!("{token}\n")).expect("token");
    let cfg = write_config(
        dir.path(),
        &format!(
            "[node]\nstate_dir = \"{0}/state\"\nruntime_dir = \"{0}/run\"\n[http]\nlisten = \"127.0.0.1:0\"\ntoken_file = \"{0}/token\"\n[gpu]\ndriver = \"none\"\n",
            dir.path().display()
        ),
    );
    let d = Daemon::start(&["--config", cfg.to_str().expect("utf8")]);
    let status = format!("{}/api/v1/status", d.url);
    assert_eq!(http_get(&status, None).0, 401);
    assert_eq!(http_get(&status, Some("wrong-token-wrong-token")).0, 401);
    assert_eq!(http_get(&status, Some(token)).0, 200);
    assert_eq!(http_get(&format!("{status}?token={token}"), None).0, 200);
    // Probes stay open for load balancers and Prometheus.
    assert_eq!(http_get(&format!("{}/healthz", d.url), None).0, 200);

    let nbos = |args: &[&str], env_token: Option<&str>| {
        let mut c = Command::new(NBOS);
        c.args(args).env("NBOS_URL", &d.url).env_remove("NBOS_TOKEN").env_remove("NBOS_TOKEN_FILE");
        if let Some(t) = env_token {
            c.env("NBOS_TOKEN", t);
        }
        c.output().expect("nbos")
    };
    let o = nbos(&["status"], Some("nope-nope-nope"));
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("401"), "{}", stderr(&o));
    // The token from the environment or from a file, which other local users cannot read.
    let o = nbos(&["status"], Some(token));
    assert!(o.status.success(), "{}", stderr(&o));
    let file = dir.path().join("token").display().to_string();
    let o = nbos(&["status", "--token-file", &file], None);
    assert!(o.status.success(), "{}", stderr(&o));
    // In argv (/proc/PID/cmdline, readable by every local user) a secret is refused before
    // anything is sent, naming what to use instead.
    for (flag, env) in [("--token", "NBOS_TOKEN"), ("--operator-token", "NBOS_OPERATOR_TOKEN")] {
        let o = nbos(&["status", flag, token], None);
        assert_eq!(o.status.code(), Some(2), "{flag}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.contains("command line") && e.contains(env) && e.contains(&format!("{flag}-file")), "{e}");
        let o = nbos(&[flag, token, "kernels"], None);
        assert_eq!(o.status.code(), Some(2), "{flag} before the subcommand: {}", stderr(&o));
    }

    let (_, m) = http_get(&format!("{}/metrics", d.url), None);
    assert!(m.contains("notebookos_http_auth_failures_total 3"), "{m}");
    assert!(d.terminate().success());
}

#[test]
fn nbos_status_without_a_daemon_says_where_it_looked() {
    let o = Command::new(NBOS).args(["status"]).env("NBOS_URL", "http://127.0.0.1:9").output().expect("nbos");
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(e.contains("cannot reach notebookosd at http://127.0.0.1:9"), "{e}");
    assert!(!e.contains("panicked"), "{e}");
}

#[test]
fn systemd_unit_verifies_against_the_built_daemon() {
    let Ok(analyze) = which("systemd-analyze") else {
        required::cannot_run("systemd_unit_verifies", "systemd-analyze is not installed (Debian package systemd)");
        return;
    };
    let unit = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../packaging/notebookosd.service"))
        .expect("unit file");
    assert!(unit.contains("Type=notify") && unit.contains("WatchdogSec="), "{unit}");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("notebookosd.service");
    std::fs::write(&path, unit.replace("/usr/bin/notebookosd", &notebookosd())).expect("write unit");
    let o = Command::new(analyze).arg("verify").arg(&path).output().expect("systemd-analyze");
    assert!(o.status.success(), "systemd-analyze verify: {}{}", stdout(&o), stderr(&o));
    let noise = stderr(&o);
    assert!(!noise.contains("notebookosd.service:"), "unit has warnings: {noise}");
}

fn which(name: &str) -> Result<std::path::PathBuf, ()> {
    std::env::var_os("PATH")
        .and_then(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|c| c.is_file()))
        .ok_or(())
}
