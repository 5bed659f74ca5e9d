//! A shipped systemd unit's sandbox, applied the way systemd applies it, to a process the
//! tests start (no systemd as PID 1 on the test machines): the `[Service]` directives are
//! read from the unit file, each either applied here or named in [`NOT_APPLIED`] or
//! [`SERVICE_MANAGEMENT`] with the reason; a directive in none of them is an error, so a
//! unit that gains one fails the test until the sandbox learns it.
//!
//! Before the fork: the plan (mount steps, the devices cgroup, seccomp programs exported as
//! BPF through libseccomp (loaded at run time), system-call groups expanded by `systemd-analyze syscall-filter`).
//! In the child, before exec ([`child`]): only system calls on that plan.

mod child;
mod devices;
mod libseccomp;
mod mounts;
mod seccomp;
mod unit;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use anyhow::{bail, Context};

pub use mounts::Directories;
pub use seccomp::syscall_filter_set;
pub use unit::Service;

/// Keys that say how systemd runs and supervises the service, not what confines it, and
/// what the tests do about each.
pub const SERVICE_MANAGEMENT: &[(&str, &str)] = &[
    ("Type", "notify: daemon/tests/systemd_notify.rs plays the service manager"),
    ("NotifyAccess", "main: systemd_notify.rs checks every message comes from the main PID"),
    ("WatchdogSec", "systemd_notify.rs sets WATCHDOG_USEC and counts the pings"),
    ("ExecStartPre", "--check-config: daemon/cli/tests"),
    ("ExecStart", "the test starts the daemon with a config of its own"),
    ("Restart", "systemd's restart policy: nothing in the process"),
    ("RestartSec", "systemd's restart policy: nothing in the process"),
    ("RestartPreventExitStatus", "systemd's restart policy: nothing in the process"),
    ("KillMode", "how systemd stops the service: the test sends SIGTERM as systemd does first"),
    ("TimeoutStopSec", "how long systemd waits before SIGKILL"),
];

/// Sandbox keys the unit may set that this host cannot apply, and why.
pub const NOT_APPLIED: &[(&str, &str)] = &[
    (
        "Delegate",
        "hands the service its cgroup subtree in systemd's tree, which this host does not have; the \
         daemon writes the cgroup tree through ReadWritePaths=/sys/fs/cgroup, which is applied",
    ),
    (
        "RemoveIPC",
        "acts when the service stops, on the IPC objects of its User=/DynamicUser= (the daemon runs \
         as root, whose objects systemd never removes): nothing to apply to the running process",
    ),
];

/// Keys applied here (by the plan below); the test holds the unit to these three lists.
pub const APPLIED: &[&str] = &[
    "StateDirectory",
    "StateDirectoryMode",
    "RuntimeDirectory",
    "RuntimeDirectoryMode",
    "LimitMEMLOCK",
    "LimitNOFILE",
    "CapabilityBoundingSet",
    "AmbientCapabilities",
    "NoNewPrivileges",
    "SecureBits",
    "ProtectSystem",
    "ReadWritePaths",
    "ProtectHome",
    "PrivateTmp",
    "ProtectKernelModules",
    "ProtectKernelLogs",
    "ProtectKernelTunables",
    "ProtectClock",
    "ProtectHostname",
    "ProtectProc",
    "DevicePolicy",
    "DeviceAllow",
    "RestrictAddressFamilies",
    "RestrictNamespaces",
    "RestrictSUIDSGID",
    "RestrictRealtime",
    "LockPersonality",
    "SystemCallArchitectures",
    "SystemCallFilter",
    "SystemCallErrorNumber",
    "PrivateMounts",
    "KeyringMode",
    "UMask",
];

/// Capabilities in kernel order (include/uapi/linux/capability.h).
const CAPABILITIES: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

fn capability(name: &str) -> anyhow::Result<libc::c_int> {
    let i = CAPABILITIES.iter().position(|c| *c == name).with_context(|| format!("unknown capability {name}"))?;
    Ok(libc::c_int::try_from(i)?)
}

/// The unit's sandbox, planned; [`UnitSandbox::wrap`] applies it to a command's child.
#[derive(Debug)]
pub struct UnitSandbox {
    mounts: mounts::MountPlan,
    devices: Option<devices::DeviceCgroup>,
    rlimits: Vec<(libc::__rlimit_resource_t, libc::rlim_t)>,
    keyring_private: bool,
    umask: Option<libc::mode_t>,
    bounding_drop: Vec<libc::c_int>,
    ambient: Vec<libc::c_int>,
    securebits: Option<libc::c_int>,
    no_new_privs: bool,
    filters: Vec<seccomp::Program>,
    /// The capability mask the process keeps (the unit's bounding set).
    pub bounding_set: u64,
    /// What the plan found absent on this host (a `DeviceAllow=` with no such driver).
    pub absent: Vec<String>,
    /// Where this host made the plan differ from systemd's, and why.
    pub notes: Vec<String>,
    /// `LimitNOFILE=` as applied (see `notes`), if the unit sets it.
    pub nofile: Option<libc::rlim_t>,
}

/// `[Service]` keys in none of [`APPLIED`], [`NOT_APPLIED`] and [`SERVICE_MANAGEMENT`].
pub fn unknown_keys(service: &Service) -> Vec<String> {
    let known = |k: &str| {
        APPLIED.contains(&k)
            || NOT_APPLIED.iter().any(|(n, _)| *n == k)
            || SERVICE_MANAGEMENT.iter().any(|(n, _)| *n == k)
    };
    service.keys().filter(|k| !known(k)).map(str::to_owned).collect()
}

/// Whether this process has capability `cap` in its effective set.
fn has_capability(cap: &str) -> anyhow::Result<bool> {
    let status = std::fs::read_to_string("/proc/self/status").context("/proc/self/status")?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:")).context("CapEff")?.trim();
    Ok(u64::from_str_radix(hex, 16)? & (1 << capability(cap)?) != 0)
}

/// `value`, or the hard limit this process has where it may not raise it (systemd, as
/// PID 1, always may; a container may withhold CAP_SYS_RESOURCE).
fn host_limit(
    key: &str,
    resource: libc::__rlimit_resource_t,
    value: libc::rlim_t,
    notes: &mut Vec<String>,
) -> anyhow::Result<libc::rlim_t> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit(2) into a live rlimit.
    if unsafe { libc::getrlimit(resource, &raw mut lim) } != 0 {
        return Err(std::io::Error::last_os_error()).context("getrlimit");
    }
    if value > lim.rlim_max && !has_capability("CAP_SYS_RESOURCE")? {
        notes.push(format!("{key}: {} instead of {value}: this host withholds CAP_SYS_RESOURCE", lim.rlim_max));
        return Ok(lim.rlim_max);
    }
    Ok(value)
}

fn limit(value: &str) -> anyhow::Result<libc::rlim_t> {
    if value == "infinity" {
        return Ok(libc::RLIM_INFINITY);
    }
    value.parse().with_context(|| format!("limit {value}: a number or infinity"))
}

impl UnitSandbox {
    /// Plans the sandbox of `unit` (a unit file's text). `dirs`: where its state and runtime
    /// directories are; `scratch`: a directory for what systemd keeps on the host (private
    /// /tmp, inaccessible nodes), not under /tmp; `name`: the devices cgroup's name.
    pub fn plan(unit: &str, dirs: &Directories, scratch: &Path, name: &str) -> anyhow::Result<Self> {
        let service = Service::parse(unit);
        let unknown = unknown_keys(&service);
        if !unknown.is_empty() {
            bail!("the unit sets {unknown:?}, which the sandbox neither applies nor lists as not applicable");
        }
        if service.one("PrivateMounts").is_some() && !service.yes("PrivateMounts")? {
            bail!("PrivateMounts=no with mount settings: not known here (systemd makes a namespace anyway)");
        }
        let mut notes = Vec::new();
        let mut rlimits = Vec::new();
        for (key, resource) in [("LimitMEMLOCK", libc::RLIMIT_MEMLOCK), ("LimitNOFILE", libc::RLIMIT_NOFILE)] {
            if let Some(v) = service.one(key) {
                rlimits.push((resource, host_limit(key, resource, limit(v)?, &mut notes)?));
            }
        }
        let keyring_private = match service.one("KeyringMode") {
            Some("private") => true,
            None | Some("inherit") => false,
            Some(other) => bail!("KeyringMode={other}: not known here"),
        };
        let umask = service.one("UMask").map(|m| libc::mode_t::from_str_radix(m, 8)).transpose().context("UMask")?;

        let last_cap: libc::c_int = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .context("/proc/sys/kernel/cap_last_cap")?
            .trim()
            .parse()
            .context("cap_last_cap")?;
        let mut bounding_set = u64::MAX;
        if !service.all("CapabilityBoundingSet").is_empty() {
            bounding_set = 0;
            for name in service.words("CapabilityBoundingSet") {
                bounding_set |= 1 << capability(name)?;
            }
        }
        let bounding_drop = (0..=last_cap).filter(|c| bounding_set & (1 << c) == 0).collect();
        let ambient =
            service.words("AmbientCapabilities").into_iter().map(capability).collect::<anyhow::Result<_>>()?;
        let mut securebits = None;
        for bit in service.words("SecureBits") {
            let mask = match bit {
                "keep-caps" => libc::SECBIT_KEEP_CAPS,
                "keep-caps-locked" => libc::SECBIT_KEEP_CAPS_LOCKED,
                "no-setuid-fixup" => libc::SECBIT_NO_SETUID_FIXUP,
                "no-setuid-fixup-locked" => libc::SECBIT_NO_SETUID_FIXUP_LOCKED,
                "noroot" => libc::SECBIT_NOROOT,
                "noroot-locked" => libc::SECBIT_NOROOT_LOCKED,
                other => bail!("SecureBits {other}: not known here"),
            };
            securebits = Some(securebits.unwrap_or(0) | mask);
        }

        let mut filters = Vec::new();
        for program in [
            seccomp::architectures(&service)?,
            seccomp::syscall_filter(&service)?,
            seccomp::protections(&service)?,
            seccomp::address_families(&service)?,
            seccomp::namespaces(&service)?,
            seccomp::realtime(&service)?,
            seccomp::suid_sgid(&service)?,
            seccomp::personality(&service)?,
        ]
        .into_iter()
        .flatten()
        {
            filters.push(program);
        }

        let mounts = mounts::MountPlan::new(&service, dirs, scratch)?;
        let devices = devices::DeviceCgroup::new(&service, name)?;
        let absent = devices.as_ref().map(|d| d.absent.clone()).unwrap_or_default();
        let nofile = rlimits.iter().find(|(r, _)| *r == libc::RLIMIT_NOFILE).map(|(_, v)| *v);
        Ok(Self {
            nofile,
            mounts,
            devices,
            rlimits,
            keyring_private,
            umask,
            bounding_drop,
            ambient,
            securebits,
            no_new_privs: service.yes("NoNewPrivileges")?,
            filters,
            bounding_set,
            absent,
            notes,
        })
    }

    /// The rules the devices cgroup allows (`c 1:3 rwm`), if the unit has a device policy.
    pub fn device_rules(&self) -> &[String] {
        self.devices.as_ref().map_or(&[], |d| d.allowed.as_slice())
    }

    /// Makes `command`'s child enter the sandbox before it execs.
    pub fn wrap(self: &Arc<Self>, command: &mut Command) {
        let this = Arc::clone(self);
        // SAFETY: `enter` makes only system calls on data planned before the fork (no
        // allocation, no lock), which is what a pre_exec closure may do.
        unsafe { command.pre_exec(move || this.enter()) };
    }
}
