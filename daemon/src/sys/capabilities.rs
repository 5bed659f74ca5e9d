//! Capabilities of a pre-warmed process under `kernel.run_as = "owner"`: it starts as
//! `kernel.user` holding exactly CAP_SETUID and CAP_SETGID (permitted, effective,
//! inheritable and ambient, so they survive its exec; the bounding set reduced to those
//! two), so that, once taken, it can become its kernel's owner and then drop both
//! (`kernel/prewarm/launcher.py`). Every other process of the daemon's drops every
//! capability with root, as before. Both steps run in the child between fork and exec
//! ([`super::child_setup`]): async-signal-safe calls only, nothing allocated.

/// CAP_SETGID (linux/capability.h).
pub const CAP_SETGID: u32 = 6;
/// CAP_SETUID (linux/capability.h).
pub const CAP_SETUID: u32 = 7;
/// Capability numbers are below this (Linux has 41 today; 64 is the two-word ABI's end).
const CAP_WORDS_END: u32 = 64;
/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// PR_CAP_AMBIENT_RAISE as prctl's variadic argument (libc has it as a c_int).
const AMBIENT_RAISE: libc::c_ulong = 2;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The two kept, as the low word of a set.
const SETID_MASK: u32 = (1 << CAP_SETUID) | (1 << CAP_SETGID);

fn check(rc: libc::c_int) -> std::io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Still root: drops every capability but the two from the bounding set (so nothing the
/// process execs can ever hold another) and keeps the permitted set through the coming
/// setuid (PR_SET_KEEPCAPS; cleared again by the exec).
pub fn before_setuid_keep_setid() -> std::io::Result<()> {
    for cap in 0..CAP_WORDS_END {
        if cap == CAP_SETUID || cap == CAP_SETGID {
            continue;
        }
        // SAFETY: prctl(2) with integer arguments only; async-signal-safe.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) };
        if rc != 0 {
            // EINVAL: past the kernel's last capability; every one below it is dropped.
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
                break;
            }
            return Err(std::io::Error::last_os_error());
        }
    }
    // SAFETY: prctl(2) with integer arguments only; async-signal-safe.
    check(unsafe { libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) })
}

/// After setuid to the pool's account: the permitted, effective and inheritable sets
/// become exactly the two, raised into the ambient set so the exec keeps them.
pub fn after_setuid_keep_setid() -> std::io::Result<()> {
    set_sets(SETID_MASK)?;
    for cap in [CAP_SETUID, CAP_SETGID] {
        // SAFETY: prctl(2) with integer arguments only; async-signal-safe.
        check(unsafe { libc::prctl(libc::PR_CAP_AMBIENT, AMBIENT_RAISE, libc::c_ulong::from(cap), 0, 0) })?;
    }
    Ok(())
}

/// capset(2) of this thread: every set to `low_word` (the high word empty).
fn set_sets(low_word: u32) -> std::io::Result<()> {
    let mut header = CapHeader { version: CAPABILITY_VERSION_3, pid: 0 };
    let data = [
        CapData { effective: low_word, permitted: low_word, inheritable: low_word },
        CapData { effective: 0, permitted: 0, inheritable: 0 },
    ];
    // SAFETY: capset(2) reads one header and two data structs (version 3's layout,
    // repr(C)), both alive for the call; async-signal-safe (a plain system call).
    let rc = unsafe { libc::syscall(libc::SYS_capset, std::ptr::addr_of_mut!(header), data.as_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The capability sets of a `/proc/<pid>/status` text: (CapInh, CapPrm, CapEff, CapBnd,
/// CapAmb), `None` when one is missing or malformed.
pub fn sets_of_status(status: &str) -> Option<[u64; 5]> {
    let mut out = [0u64; 5];
    for (slot, key) in out.iter_mut().zip(["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"]) {
        let value = status.lines().find_map(|l| l.strip_prefix(key))?;
        *slot = u64::from_str_radix(value.trim(), 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_sets_are_parsed_and_a_missing_one_is_none() {
        let status = "Name:\tpython\nCapInh:\t00000000000000c0\nCapPrm:\t00000000000000c0\n\
                      CapEff:\t00000000000000c0\nCapBnd:\t00000000000000c0\nCapAmb:\t00000000000000c0\n";
        assert_eq!(sets_of_status(status), Some([u64::from(SETID_MASK); 5]));
        assert_eq!(sets_of_status("CapInh:\t0\n"), None);
        assert_eq!(sets_of_status(&status.replace("c0\nCapAmb", "zz\nCapAmb")), None);
    }
}
