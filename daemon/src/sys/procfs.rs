//! A process's parent, innermost pid and resident memory, read from `/proc` (None when
//! it is gone), and its children (to walk a process tree).

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

/// Resident memory of `pid` (`VmRSS` of `/proc/<pid>/status`), bytes; None when the
/// process is gone (or is a kernel thread, which has none).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.split_whitespace().next()?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// The children of `pid`: every thread's `/proc/<pid>/task/<tid>/children` (empty when
/// the process is gone). Reads only this process's entries, not all of `/proc`.
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("children")).ok())
        .flat_map(|text| text.split_whitespace().filter_map(|c| c.parse().ok()).collect::<Vec<u32>>())
        .collect()
}
