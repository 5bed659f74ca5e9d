//! Whether the process on the other end of the lease socket is a kernel process the
//! daemon started, or a descendant of one (forked workers and subprocesses of a cell),
//! found through the parent chain in `/proc`.
//!
//! Pids are reused, so a pid alone proves nothing: the peer is pinned by a pidfd
//! (`SO_PEERPIDFD`, else `pidfd_open`, in [`crate::sys::pidfd`]) while its `/proc` entries
//! are read, and a registered kernel process is held by a pidfd taken at registration,
//! which tells when that very process has exited whatever its pid names now.

use crate::sys::procfs::parent_of;

/// Longest parent chain followed (deeper trees are refused, not walked forever).
pub const MAX_ANCESTRY: usize = 64;

/// `pid` itself and its ancestors, nearest first (up to [`MAX_ANCESTRY`]).
pub fn lineage(pid: u32) -> Vec<u32> {
    let mut out = vec![pid];
    let mut cur = pid;
    while out.len() < MAX_ANCESTRY {
        match parent_of(cur) {
            Some(p) if p > 1 && !out.contains(&p) => {
                out.push(p);
                cur = p;
            }
            _ => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lineage_of_a_child_includes_this_process() {
        let mut child = std::process::Command::new("sleep").arg("5").spawn().expect("spawn sleep");
        let l = lineage(child.id());
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(l[0], child.id());
        assert_eq!(l.get(1), Some(&std::process::id()));
    }
}
