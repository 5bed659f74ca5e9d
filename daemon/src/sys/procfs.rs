//! A process's parent and innermost pid, read from `/proc` (None when it is gone).

/// Parent of `pid` from `/proc/<pid>/stat` (None when the process is gone).
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: parse after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The pid `pid` has in its own (innermost) PID namespace: the last of `NSpid` in
/// `/proc/<pid>/status` (None when the process is gone).
pub fn innermost_pid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("NSpid:"))?.split_whitespace().last()?.parse().ok()
}
