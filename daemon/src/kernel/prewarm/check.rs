//! Whether a pool process can still become a kernel: running (not stopped, traced or
//! gone, as `/proc` says) and answering on its control socket. A kernel of the same
//! account can signal a pool process (SIGSTOP) unless the pool guard stops it
//! ([`super::guard`]); a process that fails here is never handed a kernel.

use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;

/// How often `/proc` is looked at while a process is awaited (a stopped one is found out
/// this fast, not at the deadline).
const POLL: Duration = Duration::from_millis(50);
/// Longest line the launcher sends ("ready", "pong", "up"): the process is not trusted to
/// stop.
const MAX_LINE: usize = 16;

/// Why a pool process was not handed a kernel (the `reason` label of
/// `notebookos_prewarm_rejected_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    /// Stopped by a signal (`T` in `/proc/<pid>/stat`).
    #[error("it is stopped (SIGSTOP or a like signal)")]
    Stopped,
    /// Traced by another process (`t`, or a `TracerPid`).
    #[error("it is traced by another process")]
    Traced,
    /// Exited, or its pid is another process's now.
    #[error("it exited")]
    Exited,
    /// No answer in time, or not the answer the launcher gives.
    #[error("it did not answer")]
    Unresponsive,
    /// Handed its kernel, it did not say ipykernel was up in time.
    #[error("it did not come up as the kernel")]
    NotUp,
    /// Under `kernel.run_as = "owner"`: up, but not as exactly its kernel's account with
    /// no capability left.
    #[error("it did not become its kernel's account without capabilities")]
    NotSwitched,
}

impl Rejected {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Stopped => "stopped",
            Self::Traced => "traced",
            Self::Exited => "exited",
            Self::Unresponsive => "unresponsive",
            Self::NotUp => "not_up",
            Self::NotSwitched => "not_switched",
        }
    }
}

/// Field 22 of `/proc/<pid>/stat`: when the process started, in clock ticks after boot.
pub fn start_time(pid: u32) -> Option<u64> {
    stat_fields(pid)?.get(19)?.parse().ok()
}

/// The fields of `/proc/<pid>/stat` after the command name (which may hold spaces and
/// parentheses): field 3 (the state) onwards.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// Whether `pid` is still the process started at `started` and running: not stopped,
/// traced, a zombie or gone.
pub fn alive(pid: u32, started: Option<u64>) -> Result<(), Rejected> {
    let fields = stat_fields(pid).ok_or(Rejected::Exited)?;
    if fields.get(19).and_then(|t| t.parse().ok()) != started || started.is_none() {
        return Err(Rejected::Exited);
    }
    match fields.first().map(String::as_str) {
        Some("T") => return Err(Rejected::Stopped),
        Some("t") => return Err(Rejected::Traced),
        Some("Z" | "X" | "x") | None => return Err(Rejected::Exited),
        Some(_) => {}
    }
    // Attached but running: a tracer can change what it runs, so it is no kernel's.
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|_| Rejected::Exited)?;
    let tracer = status.lines().find_map(|l| l.strip_prefix("TracerPid:")).map(str::trim);
    if tracer.is_some_and(|t| t != "0") {
        return Err(Rejected::Traced);
    }
    Ok(())
}

/// Reads one line (without its `\n`) a byte at a time, so nothing after it is consumed;
/// `None` at end of input, an error, or a line longer than [`MAX_LINE`].
pub async fn read_line<R: AsyncReadExt + Unpin>(from: &mut R) -> Option<Vec<u8>> {
    let mut line = Vec::new();
    loop {
        let mut b = [0u8; 1];
        match from.read(&mut b).await {
            Ok(0) | Err(_) => return None,
            Ok(_) if b[0] == b'\n' => return Some(line),
            Ok(_) if line.len() >= MAX_LINE => return None,
            Ok(_) => line.push(b[0]),
        }
    }
}

/// Waits for `answer` (a line read by `read`) from process `pid` for at most `limit`,
/// failing early when `/proc` shows the process stopped, traced or gone. `late` is what
/// an answer that did not come in time means.
pub async fn awaited<F>(
    read: F,
    expected: &[u8],
    pid: u32,
    started: Option<u64>,
    limit: Duration,
    late: Rejected,
) -> Result<(), Rejected>
where
    F: std::future::Future<Output = Option<Vec<u8>>>,
{
    let deadline = Instant::now() + limit;
    tokio::pin!(read);
    loop {
        alive(pid, started)?;
        tokio::select! {
            line = &mut read => {
                return match line {
                    Some(l) if l == expected => Ok(()),
                    // End of input: the process is gone (or going).
                    None => Err(alive(pid, started).err().unwrap_or(Rejected::Exited)),
                    Some(_) => Err(Rejected::Unresponsive),
                };
            }
            () = tokio::time::sleep(POLL) => {
                if Instant::now() >= deadline {
                    return Err(alive(pid, started).err().unwrap_or(late));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::signals;

    fn child() -> std::process::Child {
        std::process::Command::new("sleep").arg("30").spawn().expect("sleep")
    }

    fn signal(c: &std::process::Child, sig: signals::Signal) {
        signals::kill(c.id(), sig).expect("kill");
    }

    /// Waits until `/proc` shows what `f` expects (a signal is delivered asynchronously).
    fn eventually(pid: u32, started: Option<u64>, want: Result<(), Rejected>) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(pid, started) != want {
            assert!(Instant::now() < deadline, "pid {pid}: {:?}, not {want:?}", alive(pid, started));
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_stopped_process_fails_the_check_and_a_continued_one_passes() {
        let mut c = child();
        let started = start_time(c.id());
        assert_eq!(alive(c.id(), started), Ok(()));
        signal(&c, signals::SIGSTOP);
        eventually(c.id(), started, Err(Rejected::Stopped));
        signal(&c, signals::SIGCONT);
        eventually(c.id(), started, Ok(()));
        // Another start time: not the process that was checked before.
        assert_eq!(alive(c.id(), started.map(|t| t + 1)), Err(Rejected::Exited));
        c.kill().expect("kill");
        c.wait().expect("wait");
        assert_eq!(alive(c.id(), started), Err(Rejected::Exited));
    }

    #[tokio::test]
    async fn a_stopped_process_is_found_out_before_the_deadline() {
        let mut c = child();
        let started = start_time(c.id());
        signal(&c, signals::SIGSTOP);
        eventually(c.id(), started, Err(Rejected::Stopped));
        // Never answers: the check fails on the state, long before the hour.
        let never = std::future::pending::<Option<Vec<u8>>>();
        let got = awaited(never, b"pong", c.id(), started, Duration::from_secs(3600), Rejected::Unresponsive).await;
        assert_eq!(got, Err(Rejected::Stopped));
        c.kill().expect("kill");
        c.wait().expect("wait");
    }

    #[tokio::test]
    async fn a_running_process_that_never_answers_fails_at_the_deadline() {
        let mut c = child();
        let started = start_time(c.id());
        let never = std::future::pending::<Option<Vec<u8>>>();
        let got = awaited(never, b"up", c.id(), started, Duration::from_millis(200), Rejected::NotUp).await;
        assert_eq!(got, Err(Rejected::NotUp));
        // End of input from a process that is gone: it exited.
        c.kill().expect("kill");
        c.wait().expect("wait");
        let eof = async { None };
        let got = awaited(eof, b"up", c.id(), started, Duration::from_secs(5), Rejected::NotUp).await;
        assert_eq!(got, Err(Rejected::Exited));
    }

    #[tokio::test]
    async fn answers_are_read_a_line_at_a_time() {
        let (mut a, b) = tokio::net::UnixStream::pair().expect("pair");
        tokio::io::AsyncWriteExt::write_all(&mut a, b"ready\npong\n").await.expect("write");
        let mut b = b;
        assert_eq!(read_line(&mut b).await.as_deref(), Some(&b"ready"[..]));
        assert_eq!(read_line(&mut b).await.as_deref(), Some(&b"pong"[..]));
        tokio::io::AsyncWriteExt::write_all(&mut a, &[b'x'; 64]).await.expect("write");
        assert_eq!(read_line(&mut b).await, None, "an endless line is not read to its end");
        let me = std::process::id();
        let wrong = async { Some(b"pang".to_vec()) };
        let got = awaited(wrong, b"pong", me, start_time(me), Duration::from_secs(5), Rejected::Unresponsive).await;
        assert_eq!(got, Err(Rejected::Unresponsive));
    }
}

/// Whether `pid` (still the process started at `started`) runs as exactly `id`: real,
/// effective, saved and filesystem uids and gids, the account's groups, and no
/// capability in any set but the bounding one (`kernel.run_as = "owner"`).
pub fn switched(pid: u32, started: Option<u64>, id: &crate::kernel::identity::KernelIdentity) -> Result<(), Rejected> {
    // Every thread: credentials and capabilities are per thread.
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|_| Rejected::Exited)?;
    let mut seen = 0;
    for task in tasks {
        let task = task.map_err(|_| Rejected::Exited)?;
        // A thread that ended meanwhile holds nothing any more; one started since is a
        // copy of a thread seen here.
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else { continue };
        if !status_runs_as(&status, id) {
            return Err(Rejected::NotSwitched);
        }
        seen += 1;
    }
    alive(pid, started)?;
    if seen == 0 {
        return Err(Rejected::Exited);
    }
    Ok(())
}

/// [`switched`] on a `/proc/<pid>/status` text.
fn status_runs_as(status: &str, id: &crate::kernel::identity::KernelIdentity) -> bool {
    let ids = |key: &str| -> Option<Vec<u32>> {
        let line = status.lines().find_map(|l| l.strip_prefix(key))?;
        line.split_whitespace().map(|v| v.parse().ok()).collect()
    };
    let all_are = |key: &str, want: u32| ids(key).is_some_and(|v| v.len() == 4 && v.iter().all(|x| *x == want));
    let mut groups = ids("Groups:").unwrap_or_else(|| vec![u32::MAX]);
    groups.sort_unstable();
    groups.dedup();
    let mut want_groups = id.groups.clone();
    want_groups.sort_unstable();
    want_groups.dedup();
    let no_caps = crate::sys::capabilities::sets_of_status(status)
        .is_some_and(|[inh, prm, eff, _bnd, amb]| inh == 0 && prm == 0 && eff == 0 && amb == 0);
    all_are("Uid:", id.uid) && all_are("Gid:", id.gid) && groups == want_groups && no_caps
}

#[cfg(test)]
mod switched_tests {
    use super::status_runs_as;
    use crate::kernel::identity::KernelIdentity;

    fn status(uid: &str, groups: &str, caps: &str) -> String {
        format!(
            "Name:\tpython\nUid:\t{uid}\nGid:\t1001\t1001\t1001\t1001\nGroups:\t{groups}\n\
             CapInh:\t{caps}\nCapPrm:\t{caps}\nCapEff:\t{caps}\nCapBnd:\t00000000000000c0\nCapAmb:\t{caps}\n"
        )
    }

    #[test]
    fn only_the_exact_account_without_capabilities_counts_as_switched() {
        let id = KernelIdentity { uid: 1001, gid: 1001, groups: vec![1001, 27], user: "a".into(), home: None };
        let zero = "0000000000000000";
        assert!(status_runs_as(&status("1001\t1001\t1001\t1001", "27 1001 ", zero), &id));
        // Still the pool's account in the saved uid: it could switch back.
        assert!(!status_runs_as(&status("1001\t1001\t990\t1001", "27 1001", zero), &id));
        // Still holding CAP_SETUID/CAP_SETGID.
        assert!(!status_runs_as(&status("1001\t1001\t1001\t1001", "27 1001", "00000000000000c0"), &id));
        // A group the account does not have.
        assert!(!status_runs_as(&status("1001\t1001\t1001\t1001", "0 27 1001", zero), &id));
        assert!(!status_runs_as("Name:\tpython\n", &id));
    }
}
