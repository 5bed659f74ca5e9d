//! Kernel processes a previous daemon of this host left behind. A daemon killed with
//! SIGKILL (or crashing) outside systemd leaves its kernels running: each is its own process
//! group, so a kill of the daemon's group misses them, and nothing adopts them later (a new
//! daemon starts new replicas). Under systemd the unit's cgroup goes with the daemon; without
//! it, the next daemon on the same runtime directory kills them at start (found by the fault
//! campaign: orphans kept their GPU memory and lease socket).

use std::path::Path;

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
        // SAFETY: kill(2) with a pid (or its own process group) read from /proc just now; a
        // pid reused meanwhile by a process that does not name our directory is the only
        // risk, and the window is a few microseconds.
        let rc = unsafe {
            if group == Some(pid) {
                libc::killpg(pid, libc::SIGKILL)
            } else {
                libc::kill(pid, libc::SIGKILL)
            }
        };
        if rc == 0 {
            killed += 1;
        }
    }
    killed
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
    fn the_process_group_is_read_after_the_name() {
        assert_eq!(process_group("123 (python3) S 1 123 99 0 -1"), Some(123));
        assert_eq!(process_group("7 (a) b) S 1 42 42 0"), Some(42), "a name with ') ' in it");
        assert_eq!(process_group("garbage"), None);
    }
}
