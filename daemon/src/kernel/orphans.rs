//! Kernel processes a previous daemon of this host left behind. A daemon killed with
//! SIGKILL (or crashing) outside systemd leaves its kernels running: each is its own process
//! group, so a kill of the daemon's group misses them, and nothing adopts them later (a new
//! daemon starts new replicas). Under systemd the unit's cgroup goes with the daemon; without
//! it, the next daemon on the same runtime directory kills them at start (found by the fault
//! campaign: orphans kept their GPU memory and lease socket). Their cgroups (memory, pids,
//! the GPU device guard's) outlive them too: the next daemon removes those named with its
//! host tag (`<kernel id>.<tag>`), after killing whatever is still in them.

use std::path::{Path, PathBuf};

use crate::sys::signals::{HostSignals, ProcessSignals, SIGKILL};

/// Whether a process's command line (`/proc/<pid>/cmdline`, NUL-separated) names a file in
/// `kernels_dir` (a kernel's connection file, the pre-warm launcher): one of this host's.
pub fn is_ours(cmdline: &[u8], kernels_dir: &Path) -> bool {
    let mut prefix = kernels_dir.as_os_str().as_encoded_bytes().to_vec();
    prefix.push(b'/');
    cmdline.split(|b| *b == 0).any(|arg| arg.starts_with(&prefix))
}

/// The process group of `pid` (field 5 of `/proc/<pid>/stat`, after the parenthesised name).
fn process_group(stat: &str) -> Option<i32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(2)?.parse().ok()
}

/// Kills (SIGKILL, with their process groups when they lead one) the processes that name
/// `kernels_dir` in their command line, other than this process. Returns how many.
pub fn kill_left_over(kernels_dir: &Path) -> usize {
    kill_left_over_with(&HostSignals, kernels_dir)
}

/// [`kill_left_over`], its signals sent through `signals`.
fn kill_left_over_with(signals: &dyn ProcessSignals, kernels_dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0 };
    let me = std::process::id();
    let mut killed = 0;
    for pid in entries.flatten().filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok()) {
        if u32::try_from(pid) == Ok(me) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        if !is_ours(&cmdline, kernels_dir) {
            continue;
        }
        let group = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().and_then(|s| process_group(&s));
        // A pid (or its own process group) read from /proc just now; a pid reused meanwhile
        // by a process that does not name our directory is the only risk, and the window is
        // a few microseconds.
        let Ok(target) = u32::try_from(pid) else { continue };
        let sent = if group == Some(pid) { signals.kill_group(target, SIGKILL) } else { signals.kill(target, SIGKILL) };
        if sent.is_ok() {
            killed += 1;
        }
    }
    killed
}

/// The directories this host's kernel cgroups are made in, under the cgroup filesystem
/// `root` (`/sys/fs/cgroup`), `self_cgroup` being the text of `/proc/self/cgroup`: the v2
/// `<own cgroup>/notebookos-kernels` ([`super::cgroup`]), v1's `memory/notebookos` and
/// `pids/notebookos`, and the device guard's `<cgroup2>/notebookos` ([`super::device_cgroup`]).
pub fn kernel_cgroup_parents(root: &Path, self_cgroup: &str) -> Vec<PathBuf> {
    let own = self_cgroup.lines().find_map(|l| l.strip_prefix("0::")).unwrap_or("/").trim();
    let mut parents = vec![
        root.join(own.trim_start_matches('/')).join("notebookos-kernels"),
        root.join("memory/notebookos"),
        root.join("pids/notebookos"),
    ];
    parents.extend(super::device_cgroup::cgroup2_mount(root).map(|m| m.join("notebookos")));
    parents.dedup();
    parents
}

/// The cgroups named `<kernel id>.<tag>` directly under each of `parents`: this host's
/// kernels' (other hosts on the machine have other tags).
pub fn left_over_cgroups(parents: &[PathBuf], tag: &str) -> Vec<PathBuf> {
    let suffix = format!(".{tag}");
    let mut found = Vec::new();
    for parent in parents {
        let Ok(entries) = std::fs::read_dir(parent) else { continue };
        for e in entries.flatten() {
            let named = e.file_name().to_str().is_some_and(|n| n.len() > suffix.len() && n.ends_with(&suffix));
            if named && e.file_type().is_ok_and(|t| t.is_dir()) {
                found.push(e.path());
            }
        }
    }
    found.sort();
    found
}

/// Removes this host's kernel cgroups under `parents` ([`left_over_cgroups`]), killing what
/// is in them first: a daemon killed with SIGKILL could not. Returns how many were removed;
/// failures are logged.
pub fn remove_left_over_cgroups(parents: &[PathBuf], tag: &str) -> usize {
    let mut removed = 0;
    for dir in left_over_cgroups(parents, tag) {
        match super::device_cgroup::remove_cgroup_dir(&dir) {
            Ok(()) => removed += 1,
            Err(e) => {
                tracing::warn!(cgroup = %dir.display(), error = %e, "could not remove a kernel cgroup a previous daemon left");
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_command_lines_naming_a_file_in_the_kernels_dir_are_ours() {
        let dir = Path::new("/run/notebookos/kernels");
        assert!(is_ours(b"python\0-m\0ipykernel_launcher\0-f\0/run/notebookos/kernels/k1/connection-0.json\0", dir));
        assert!(is_ours(b"python3\0-s\0/run/notebookos/kernels/.prewarm.py\0", dir));
        assert!(!is_ours(b"python\0-f\0/run/notebookos/kernels-other/k1/c.json\0", dir), "another directory");
        assert!(!is_ours(b"python\0-f\0/srv/run/notebookos/kernels/k1/c.json\0", dir), "a path that only contains it");
        assert!(!is_ours(b"vim\0notes\0", dir));
    }

    #[test]
    fn the_kernel_cgroup_parents_follow_the_daemons_own_cgroup() {
        let t = tempfile::tempdir().expect("tmp");
        let parents = kernel_cgroup_parents(t.path(), "0::/system.slice/notebookosd.service\n");
        assert_eq!(parents[0], t.path().join("system.slice/notebookosd.service/notebookos-kernels"));
        assert!(parents.contains(&t.path().join("pids/notebookos")));
        assert!(parents.contains(&t.path().join("memory/notebookos")));
    }

    #[test]
    fn only_directories_with_this_hosts_tag_are_left_over_cgroups() {
        let t = tempfile::tempdir().expect("tmp");
        let parent = t.path().join("notebookos");
        for d in ["k1.aaaa", "k2.aaaa", "k1.bbbb", "aaaa", ".aaaa", "k1.aaaa.x"] {
            std::fs::create_dir_all(parent.join(d)).expect("mkdir");
        }
        std::fs::write(parent.join("k3.aaaa"), "").expect("a file");
        let found = left_over_cgroups(&[parent.clone(), t.path().join("absent")], "aaaa");
        assert_eq!(found, vec![parent.join("k1.aaaa"), parent.join("k2.aaaa")]);
    }

    /// Records what would be killed, and kills nothing.
    #[derive(Default)]
    struct Recorder(std::sync::Mutex<Vec<(&'static str, u32)>>);

    impl ProcessSignals for Recorder {
        fn kill(&self, pid: u32, _sig: crate::sys::signals::Signal) -> std::io::Result<()> {
            self.0.lock().expect("lock").push(("pid", pid));
            Ok(())
        }

        fn kill_group(&self, pgid: u32, _sig: crate::sys::signals::Signal) -> std::io::Result<()> {
            self.0.lock().expect("lock").push(("group", pgid));
            Ok(())
        }
    }

    #[test]
    fn a_process_naming_the_kernels_dir_is_killed_with_the_group_it_leads() {
        use std::os::unix::process::CommandExt;
        let t = tempfile::tempdir().expect("tmp");
        let spawn = |leader: bool| {
            let mut cmd = std::process::Command::new("sleep");
            cmd.arg0(t.path().join("k1/connection-0.json")).arg("30");
            if leader {
                cmd.process_group(0);
            }
            cmd.spawn().expect("spawn sleep")
        };
        let (mut leader, mut member) = (spawn(true), spawn(false));
        // Its /proc/<pid>/cmdline shows the new argv once the exec is done.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while [&leader, &member]
            .iter()
            .any(|c| !std::fs::read(format!("/proc/{}/cmdline", c.id())).is_ok_and(|l| is_ours(&l, t.path())))
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let recorder = Recorder::default();
        let n = kill_left_over_with(&recorder, t.path());
        let mut seen = recorder.0.lock().expect("lock").clone();
        seen.sort();
        let _ = (leader.kill(), member.kill(), leader.wait(), member.wait());
        assert_eq!(n, 2);
        assert_eq!(seen, {
            let mut want = vec![("group", leader.id()), ("pid", member.id())];
            want.sort();
            want
        });
    }

    #[test]
    fn the_process_group_is_read_after_the_name() {
        assert_eq!(process_group("123 (python3) S 1 123 99 0 -1"), Some(123));
        assert_eq!(process_group("7 (a) b) S 1 42 42 0"), Some(42), "a name with ') ' in it");
        assert_eq!(process_group("garbage"), None);
    }
}
