//! An S3-compatible server for the tests (moto from the project's venv,
//! `tests/s3/moto_server.py`) and a fault proxy that stalls or breaks uploads on demand.
//!
//! Use from a test file with `#[path = "common/s3.rs"] mod s3;`.

#![allow(dead_code, reason = "each test binary uses a different part of the harness")]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use notebookosd::cluster::cells::objects::S3Options;

/// Credentials of one IAM user of the test server.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Creds {
    pub key: String,
    pub secret: String,
}

#[derive(Debug, serde::Deserialize)]
struct Started {
    endpoint: String,
    bucket: String,
    region: String,
    admin: Creds,
    scoped: Creds,
}

/// A running moto server with one bucket.
pub struct S3Server {
    child: Child,
    stdin: Option<ChildStdin>,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    pub bucket: String,
    pub region: String,
    /// Allowed everything.
    pub admin: Creds,
    /// Allowed only object calls under `bucket/{prefix}/` (enforced with `iam`).
    pub scoped: Creds,
    pub prefix: String,
}

impl S3Server {
    /// Starts moto with `bucket`; `prefix` scopes the `scoped` user; `iam` enforces IAM.
    pub fn start(bucket: &str, prefix: &str, iam: bool) -> S3Server {
        // The repository's root, from notebookosd's tests or another package's.
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .find(|d| d.join("Cargo.lock").is_file())
            .expect("the workspace root")
            .to_path_buf();
        let python = root.join(".venv/bin/python");
        let mut cmd = Command::new(&python);
        cmd.arg(root.join("tests/s3/moto_server.py")).arg(bucket).arg(prefix);
        if iam {
            cmd.arg("--iam");
        }
        let mut child =
            cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap_or_else(|e| {
                panic!("starting the moto S3 server with {}: {e} (make deps installs it)", python.display())
            });
        let stdin = child.stdin.take();
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("moto's first line");
        let s: Started = serde_json::from_str(&line).unwrap_or_else(|e| {
            panic!("the moto S3 server did not start ({e}): {line:?}; is moto in .venv (requirements-dev.txt)?")
        });
        S3Server {
            child,
            stdin,
            endpoint: s.endpoint,
            bucket: s.bucket,
            region: s.region,
            admin: s.admin,
            scoped: s.scoped,
            prefix: prefix.to_owned(),
        }
    }

    /// `s3://bucket/{prefix}` (`s3://bucket` when empty).
    pub fn url(&self, prefix: &str) -> String {
        if prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{prefix}", self.bucket)
        }
    }

    /// The daemon's `AWS_*` environment for `creds`, reaching the server at `endpoint`
    /// (the server's own, or a fault proxy's).
    pub fn env(&self, creds: &Creds, endpoint: &str) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT", endpoint),
            ("AWS_ALLOW_HTTP", "true"),
            ("AWS_ACCESS_KEY_ID", &creds.key),
            ("AWS_SECRET_ACCESS_KEY", &creds.secret),
            ("AWS_REGION", &self.region),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    /// The same settings for an in-process store, with `timeout` per request.
    pub fn options(&self, creds: &Creds, endpoint: &str, timeout: Duration) -> S3Options {
        let extra = [
            ("endpoint", endpoint),
            ("allow_http", "true"),
            ("access_key_id", &creds.key),
            ("secret_access_key", &creds.secret),
            ("region", &self.region),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        S3Options { request_timeout: timeout, connect_timeout: timeout, max_retries: 1, extra }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the fault proxy does to client data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Fault {
    /// Forward everything.
    Pass = 0,
    /// After the first 64 KiB of a connection's next request data, forward nothing more
    /// and answer nothing (a server that stalls mid-upload).
    Stall = 1,
    /// After the first 64 KiB, close both sides (a server that fails mid-upload).
    Fail = 2,
}

/// What passes before a fault bites: the headers and the start of a body.
const FAULT_AFTER_BYTES: usize = 64 << 10;

/// A TCP proxy in front of the S3 server; its fault applies to data sent after it is set,
/// also on connections already open (the client pools them).
pub struct FaultProxy {
    pub endpoint: String,
    fault: Arc<AtomicU8>,
}

impl FaultProxy {
    pub fn start(upstream: &str) -> FaultProxy {
        let upstream = upstream.trim_start_matches("http://").to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fault proxy");
        let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
        let fault = Arc::new(AtomicU8::new(Fault::Pass as u8));
        let f = fault.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(&upstream) else { continue };
                let (c2, s2) = (client.try_clone().expect("clone"), server.try_clone().expect("clone"));
                let f = f.clone();
                std::thread::spawn(move || upload(client, server, &f));
                std::thread::spawn(move || pipe(s2, c2));
            }
        });
        FaultProxy { endpoint, fault }
    }

    pub fn set(&self, fault: Fault) {
        self.fault.store(fault as u8, Ordering::SeqCst);
    }
}

/// Client → server, with the fault applied.
fn upload(mut from: TcpStream, mut to: TcpStream, fault: &AtomicU8) {
    let mut buf = vec![0u8; 16 << 10];
    let mut since_fault = 0usize;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let now = fault.load(Ordering::SeqCst);
        if now != Fault::Pass as u8 {
            since_fault += n;
            if since_fault > FAULT_AFTER_BYTES {
                if now == Fault::Fail as u8 {
                    break;
                }
                // Stall: keep the connection open, read and drop what comes, answer nothing.
                continue;
            }
        } else {
            since_fault = 0;
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// Server → client.
fn pipe(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Both);
}
