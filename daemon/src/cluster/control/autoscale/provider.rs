//! Where hosts come from: a [`Provider`] adds hosts to the cluster and takes released ones
//! away. The one built in is [`ExecProvider`]: an operator's command that gets one JSON
//! request on stdin and answers one JSON object on stdout (`docs/autoscaling.md`):
//!
//! - `{"action": "scale_out", "count": N, "cluster": {"hosts": [...], "meta_leader": id}}`:
//!   start N hosts that join the cluster (`nbos cluster join`); they count as booting
//!   until they register.
//! - `{"action": "release", "host": {"node_id", "name", "gateway_url"}}`: the host has
//!   left the cluster (drained, removed from the meta group): stop or terminate it.
//!
//! The answer: `{"ok": true, "message": "…"}` or `{"ok": false, "message": "…"}`; a command
//! that exits non-zero, runs past its timeout (it is killed) or prints something else fails.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// At most this much of a provider's stdout is read (its answer is one small object).
const MAX_ANSWER_BYTES: u64 = 1 << 20;
/// Bytes of its stderr kept for the error message.
const STDERR_TAIL: usize = 2048;

/// A host as the provider sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderHost {
    /// Raft node id.
    pub node_id: u64,
    /// Host name.
    pub name: String,
    /// Base URL of its API.
    pub gateway_url: String,
}

/// What the autoscaler asks of a provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum ProviderRequest {
    /// Start `count` more hosts that join the cluster.
    ScaleOut {
        /// How many.
        count: u32,
        /// The cluster now, so that new hosts know whom to join.
        cluster: ClusterView,
    },
    /// Stop a host that has left the cluster.
    Release {
        /// The host.
        host: ProviderHost,
    },
}

/// The cluster as a scale-out request shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterView {
    /// Live hosts.
    pub hosts: Vec<ProviderHost>,
    /// The meta leader (the host asking).
    pub meta_leader: u64,
}

/// A provider's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderAnswer {
    /// Whether it did what it was asked.
    pub ok: bool,
    /// What it says (logged).
    #[serde(default)]
    pub message: String,
}

/// Why a provider call failed.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The command could not be started or talked to.
    #[error("provider command {program}: {source}")]
    Io {
        /// The program.
        program: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// It ran past its timeout and was killed.
    #[error("provider command {program} ran past {timeout:?} and was killed")]
    TimedOut {
        /// The program.
        program: String,
        /// The limit.
        timeout: Duration,
    },
    /// It exited non-zero, answered something that is not an answer, or said it failed.
    #[error("provider command {program} failed: {message}")]
    Failed {
        /// The program.
        program: String,
        /// What went wrong (its own message, its exit status, the end of its stderr).
        message: String,
    },
}

/// Adds and removes hosts.
pub trait Provider: Send + Sync {
    /// Carries out `request` (blocking: called on a blocking thread).
    fn call(&self, request: &ProviderRequest) -> Result<ProviderAnswer, ProviderError>;
}

/// The `exec` provider: `argv[0]` with `argv[1..]`, request on stdin, answer on stdout.
#[derive(Debug, Clone)]
pub struct ExecProvider {
    argv: Vec<String>,
    timeout: Duration,
}

impl ExecProvider {
    /// A provider running `argv` (non-empty, checked by the config) with `timeout` per call.
    pub fn new(argv: Vec<String>, timeout: Duration) -> Self {
        Self { argv, timeout }
    }

    fn program(&self) -> String {
        self.argv.first().cloned().unwrap_or_default()
    }
}

impl Provider for ExecProvider {
    fn call(&self, request: &ProviderRequest) -> Result<ProviderAnswer, ProviderError> {
        let program = self.program();
        let io = |source| ProviderError::Io { program: program.clone(), source };
        let input = serde_json::to_vec(request).map_err(|e| io(std::io::Error::other(e)))?;
        let mut child = Command::new(&program)
            .args(self.argv.iter().skip(1))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io)?;
        // The request is small (well under a pipe's buffer): written before reading. A
        // command that exits without reading it is judged by its exit status and answer.
        if let Some(mut stdin) = child.stdin.take() {
            match stdin.write_all(&input) {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => return Err(io(e)),
                _ => {}
            }
        }
        // Read stdout and stderr on threads so a chatty command never blocks on a full pipe.
        let out = child.stdout.take().map(|o| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let _ = o.take(MAX_ANSWER_BYTES).read_to_end(&mut buf);
                buf
            })
        });
        let err = child.stderr.take().map(|e| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let _ = e.take(MAX_ANSWER_BYTES).read_to_end(&mut buf);
                buf
            })
        });
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            if let Some(status) = child.try_wait().map_err(io)? {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ProviderError::TimedOut { program, timeout: self.timeout });
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let stdout = out.and_then(|t| t.join().ok()).unwrap_or_default();
        let stderr = err.and_then(|t| t.join().ok()).unwrap_or_default();
        let stderr = String::from_utf8_lossy(&stderr);
        let tail = stderr.get(stderr.len().saturating_sub(STDERR_TAIL)..).unwrap_or_default().trim().to_owned();
        let failed = |message: String| ProviderError::Failed {
            program: program.clone(),
            message: if tail.is_empty() { message } else { format!("{message}; stderr: {tail}") },
        };
        if !status.success() {
            return Err(failed(format!("exited with {status}")));
        }
        let answer: ProviderAnswer = serde_json::from_slice(&stdout)
            .map_err(|e| failed(format!("its answer is not {{\"ok\": …, \"message\": …}}: {e}")))?;
        if !answer.ok {
            return Err(failed(answer.message));
        }
        Ok(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str, timeout: Duration) -> ExecProvider {
        ExecProvider::new(vec!["/bin/sh".into(), "-c".into(), script.into()], timeout)
    }

    fn release() -> ProviderRequest {
        ProviderRequest::Release {
            host: ProviderHost { node_id: 4, name: "h4".into(), gateway_url: "https://h4:8888".into() },
        }
    }

    #[test]
    fn the_request_goes_to_stdin_and_the_answer_comes_from_stdout() {
        // The command echoes the action it read back in its message.
        let p = sh(
            r#"read req; case "$req" in *'"action":"release"'*'"node_id":4'*) echo '{"ok": true, "message": "released 4"}';; *) echo '{"ok": false, "message": "bad request"}';; esac"#,
            Duration::from_secs(10),
        );
        let answer = p.call(&release()).expect("answer");
        assert_eq!(answer, ProviderAnswer { ok: true, message: "released 4".into() });
    }

    #[test]
    fn failures_say_why() {
        let t = Duration::from_secs(10);
        let e = sh("echo oops >&2; exit 3", t).call(&release()).unwrap_err().to_string();
        assert!(e.contains("exit status: 3") && e.contains("oops"), "{e}");
        let e = sh("echo not json", t).call(&release()).unwrap_err().to_string();
        assert!(e.contains("not {\"ok\""), "{e}");
        let e = sh(r#"echo '{"ok": false, "message": "quota exceeded"}'"#, t).call(&release()).unwrap_err().to_string();
        assert!(e.contains("quota exceeded"), "{e}");
        let e = sh("sleep 30", Duration::from_millis(200)).call(&release()).unwrap_err();
        assert!(matches!(e, ProviderError::TimedOut { .. }), "{e}");
        let e = ExecProvider::new(vec!["/nonexistent/provider".into()], t).call(&release()).unwrap_err();
        assert!(matches!(e, ProviderError::Io { .. }), "{e}");
    }
}
