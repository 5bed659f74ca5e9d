//! The pre-warm pool guard (`bpf/pool_guard.bpf.c`, BPF LSM) as a kernel of the pool's
//! account meets it: a process of the same uid, which the kernel's own checks let it stop
//! or inspect, is out of reach while it is protected, and in reach again once released;
//! root still reaches it. Run as root on a kernel that loads BPF LSM programs. It fails
//! instead of skipping when NBOS_REQUIRE_PRIVILEGED=1 and not root, and whenever the kernel
//! loads LSM programs (`bpftool feature probe`) but not this one; a kernel that loads none
//! (no trampolines, e.g. some VMs: `program_type lsm is NOT available`) skips it with the
//! reason printed, unless NBOS_REQUIRE_BPF_LSM=1.

mod common;

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nbos_ebpf::PoolGuard;

/// The unprivileged account both the target and the sender run as (a shared `kernel.user`).
const UID: u32 = 65534;

fn cannot_run(test: &str, why: &str) {
    assert!(!common::privileged_required(), "{test}: NBOS_REQUIRE_PRIVILEGED=1 but it cannot run: {why}");
    eprintln!("skipped {test}: {why}");
}

/// `kill -<sig> <pid>` run as [`UID`].
fn kill_as_kernel(sig: &str, pid: u32) -> Output {
    Command::new("kill").args([format!("-{sig}"), pid.to_string()]).uid(UID).gid(UID).output().expect("kill")
}

/// Reads `/proc/<pid>/environ` as [`UID`] (ptrace-checked access).
fn read_environ_as_kernel(pid: u32) -> Output {
    Command::new("cat").arg(format!("/proc/{pid}/environ")).uid(UID).gid(UID).output().expect("cat")
}

/// Whether this kernel loads BPF LSM programs at all, as `bpftool feature probe` finds
/// (independent of the program under test).
fn kernel_loads_lsm_programs() -> bool {
    let out = Command::new("bpftool")
        .args(["feature", "probe", "kernel"])
        .output()
        .expect("bpftool (apt-get install bpftool)");
    String::from_utf8_lossy(&out.stdout).lines().any(|l| l.trim() == "eBPF program_type lsm is available")
}

fn state(pid: u32) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    stat[stat.rfind(')').expect(")") + 2..].chars().take(1).collect()
}

fn wait_state(pid: u32, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while state(pid) != want {
        assert!(Instant::now() < deadline, "pid {pid} is in state {}, not {want}", state(pid));
        std::thread::sleep(Duration::from_millis(10));
    }
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_protected_process_cannot_be_signalled_or_inspected_by_its_own_uid() {
    const TEST: &str = "a_protected_process_cannot_be_signalled_or_inspected_by_its_own_uid";
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return cannot_run(TEST, "needs root (BPF LSM)");
    }
    let mut guard = match PoolGuard::load(16) {
        Ok(g) => g,
        Err(e) => {
            assert!(
                !kernel_loads_lsm_programs() && std::env::var("NBOS_REQUIRE_BPF_LSM").as_deref() != Ok("1"),
                "{TEST}: this kernel loads BPF LSM programs but not the pool guard: {e}"
            );
            eprintln!("skipped {TEST}: this kernel loads no BPF LSM program (bpftool feature probe): {e}");
            return;
        }
    };
    let target = Killed(
        Command::new("sleep").arg("60").uid(UID).gid(UID).stdin(Stdio::null()).spawn().expect("sleep as nobody"),
    );
    let pid = target.0.id();
    guard.protect(pid).expect("protect");
    assert!(guard.protects(pid).expect("map"));

    // The attack of issue 29: a SIGSTOP (and a SIGKILL) from the same account is refused.
    for sig in ["STOP", "KILL", "TSTP"] {
        let out = kill_as_kernel(sig, pid);
        assert!(!out.status.success(), "SIGSTOP from uid {UID} reached a protected process");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("not permitted"),
            "SIG{sig}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(state(pid), "S", "the protected process was stopped");
    // An existence probe (signal 0) is no attack.
    assert!(kill_as_kernel("0", pid).status.success(), "kill -0 refused");
    // Nor can it be inspected as ptrace would (its environment).
    let out = read_environ_as_kernel(pid);
    assert!(!out.status.success(), "a protected process's environ was read by uid {UID}");
    assert!(guard.denials().expect("denials") >= 4);

    // Root (the daemon) still reaches it.
    // SAFETY: kill(2) on this test's child.
    assert_eq!(unsafe { libc::kill(i32::try_from(pid).expect("pid"), libc::SIGSTOP) }, 0);
    wait_state(pid, "T");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(i32::try_from(pid).expect("pid"), libc::SIGCONT) }, 0);
    wait_state(pid, "S");

    // Released (it became a kernel): an ordinary process of its account again.
    guard.release(pid).expect("release");
    guard.release(pid).expect("releasing twice is fine");
    assert!(!guard.protects(pid).expect("map"));
    assert!(read_environ_as_kernel(pid).status.success(), "released, its environ is still refused");
    assert!(kill_as_kernel("STOP", pid).status.success(), "released, SIGSTOP is still refused");
    wait_state(pid, "T");
    drop(target);
}
