//! `auth.audit_log`: one JSON line per kernel action and per refusal, appended to a file
//! the daemon creates 0600. A line that cannot be written (a full disk) is logged and
//! counted (`notebookos_audit_write_errors_total`); the request it records goes on.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use anyhow::Context;
use serde::Serialize;

use super::metrics::user_metrics;

/// One line of the audit log.
#[derive(Debug, Clone, Serialize)]
pub struct AuditEvent<'a> {
    /// RFC 3339, UTC.
    pub time: String,
    /// The user, `operator`, `anonymous`, `node-<id>`, or `unknown` (a credential refused).
    pub user: &'a str,
    /// `create`, `delete`, `interrupt`, `restart`, `channels`, `get`, `list`, `authenticate`, …
    pub action: &'a str,
    /// The kernel acted on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<&'a str>,
    /// The client's address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// `ok`, `error`, `not_found` (another user's kernel), `quota`, `refused`, `unauthenticated`.
    pub outcome: &'a str,
    /// A few words more (the quota's message, the refusal's reason).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<&'a str>,
}

/// The audit log file.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    file: Mutex<File>,
}

impl AuditLog {
    /// Opens `path` for appending: created 0600 when absent, never through a symlink.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(crate::sys::open_flags::O_NOFOLLOW)
            .open(path)
            .with_context(|| format!("opening auth.audit_log {}", path.display()))?;
        Ok(Self { path: path.to_owned(), file: Mutex::new(file) })
    }

    /// Appends one line: `event` at the current time.
    pub fn record(&self, mut event: AuditEvent<'_>) {
        event.time = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
        let mut line = match serde_json::to_vec(&event) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "audit line not encoded");
                user_metrics().count_audit_write_error();
                return;
            }
        };
        line.push(b'\n');
        let mut file = self.file.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // One write of the whole line: O_APPEND keeps lines of concurrent writers whole.
        if let Err(e) = file.write_all(&line) {
            user_metrics().count_audit_write_error();
            tracing::error!(path = %self.path.display(), error = %e, "audit log line not written");
        }
    }
}

/// An event with the time filled in at [`AuditLog::record`].
pub fn event<'a>(user: &'a str, action: &'a str, kernel: Option<&'a str>, outcome: &'a str) -> AuditEvent<'a> {
    AuditEvent { time: String::new(), user, action, kernel, source: None, outcome, detail: None }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn lines_are_appended_to_a_private_file_that_symlinks_cannot_redirect() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.log");
        let log = AuditLog::open(&path).expect("open");
        log.record(AuditEvent { source: Some("10.0.0.1:5000".into()), ..event("alice", "create", Some("k1"), "ok") });
        log.record(event("bob", "delete", Some("k1"), "not_found"));
        drop(log);
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // A reopen appends.
        AuditLog::open(&path).expect("reopen").record(event("operator", "list", None, "ok"));
        let text = std::fs::read_to_string(&path).expect("read");
        let lines: Vec<serde_json::Value> =
            text.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0]["user"], "alice");
        assert_eq!(lines[0]["source"], "10.0.0.1:5000");
        assert_eq!(lines[1]["outcome"], "not_found");
        assert_eq!(lines[2]["user"], "operator");
        let time = lines[0]["time"].as_str().expect("time");
        humantime::parse_rfc3339(time).expect("RFC 3339");
        assert!(time.ends_with('Z'), "UTC: {time}");

        let link = dir.path().join("link.log");
        std::os::unix::fs::symlink(&path, &link).expect("symlink");
        assert!(AuditLog::open(&link).is_err(), "a symlink is refused");
    }

    #[test]
    fn a_full_disk_is_counted_and_the_caller_goes_on() {
        // Every Linux host has /dev/full: a test that found none would check nothing.
        let full = Path::new("/dev/full");
        assert!(full.exists(), "no /dev/full on this host");
        let log = AuditLog::open(full).expect("open /dev/full");
        let before = user_metrics().audit_write_errors();
        log.record(event("alice", "create", Some("k1"), "ok"));
        assert!(user_metrics().audit_write_errors() > before, "the write error was counted");
    }
}
