//! The unit's file-system directives as the mount namespace systemd builds
//! (`src/core/namespace.c`), planned here and carried out by the forked child: a private
//! namespace (slave propagation), private /tmp and /var/tmp, everything read-only but the
//! writable paths, a /proc of its own with `hidepid`, kernel tunables read-only, what the
//! `Protect*` settings hide replaced by an inaccessible node.

use std::ffi::CString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use super::unit::Service;

/// One step of the plan; each carries the message the child prints if it fails.
#[derive(Debug)]
pub enum Step {
    /// unshare(2) with these flags.
    Unshare(libc::c_int),
    /// Propagation of every mount to slave (`PrivateMounts=`: nothing leaks back to the host).
    Slave,
    /// A recursive bind mount of `.0` onto `.1`.
    Bind(CString, CString),
    /// `MOUNT_ATTR_RDONLY` set (`true`) or cleared on the mount at `.0` and all below it.
    ReadOnly(CString, bool),
    /// A new procfs on /proc with these options.
    Proc(CString),
}

/// What the child does to the mount table, and the host directories it needs.
#[derive(Debug)]
pub struct MountPlan {
    pub steps: Vec<(Step, CString)>,
}

/// `/proc` entries `ProtectKernelTunables=` makes read-only or inaccessible (namespace.c).
const TUNABLES_READ_ONLY: &[&str] = &[
    "/proc/acpi",
    "/proc/apm",
    "/proc/asound",
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/latency_stats",
    "/proc/mtrr",
    "/proc/scsi",
    "/proc/sys",
    "/proc/sysrq-trigger",
    "/proc/timer_stats",
    "/sys",
];
const TUNABLES_INACCESSIBLE: &[&str] = &["/proc/kallsyms", "/proc/kcore"];
const MODULES_INACCESSIBLE: &[&str] = &["/lib/modules", "/usr/lib/modules"];
const LOGS_INACCESSIBLE: &[&str] = &["/proc/kmsg", "/dev/kmsg"];
const HOME_INACCESSIBLE: &[&str] = &["/home", "/root", "/run/user"];

fn c(path: &Path) -> anyhow::Result<CString> {
    CString::new(path.as_os_str().as_encoded_bytes()).with_context(|| format!("{} has a NUL", path.display()))
}

/// Where the directories `StateDirectory=` and `RuntimeDirectory=` would be: the test's own
/// (systemd's `/var/lib/<name>` and `/run/<name>` belong to an installed daemon).
#[derive(Debug, Clone)]
pub struct Directories {
    pub state: PathBuf,
    pub runtime: PathBuf,
}

impl MountPlan {
    /// Plans the namespace; makes under `scratch` the host-side directories systemd would
    /// (private /tmp and /var/tmp, an inaccessible directory and file), and creates the
    /// state and runtime directories with the unit's modes.
    pub fn new(service: &Service, dirs: &Directories, scratch: &Path) -> anyhow::Result<Self> {
        let mut plan = Self { steps: Vec::new() };
        let mut unshare = libc::CLONE_NEWNS;
        if service.yes("ProtectHostname")? {
            unshare |= libc::CLONE_NEWUTS;
        }
        plan.push(Step::Unshare(unshare), "unshare (mount and UTS namespaces)")?;
        plan.push(Step::Slave, "mount --make-rslave /")?;

        for (key, mode_key, dir) in [
            ("StateDirectory", "StateDirectoryMode", &dirs.state),
            ("RuntimeDirectory", "RuntimeDirectoryMode", &dirs.runtime),
        ] {
            if service.one(key).is_none() {
                bail!("the unit has no {key}= (the test puts the daemon's directory there)");
            }
            let mode = u32::from_str_radix(service.one(mode_key).unwrap_or("0755"), 8).context(mode_key)?;
            std::fs::create_dir_all(dir).with_context(|| format!("mkdir {}", dir.display()))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))?;
        }

        if service.yes("PrivateTmp")? {
            for (name, target) in [("tmp", "/tmp"), ("var-tmp", "/var/tmp")] {
                let outer = scratch.join(name);
                let inner = outer.join("tmp");
                std::fs::create_dir_all(&inner)?;
                std::fs::set_permissions(&outer, std::fs::Permissions::from_mode(0o700))?;
                std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o1777))?;
                plan.bind(&inner, Path::new(target))?;
            }
        }

        // Writable under a read-only system: bound onto themselves, so they are mounts of
        // their own that the read-only pass below can leave out.
        let mut writable: Vec<PathBuf> = vec![dirs.state.clone(), dirs.runtime.clone()];
        writable.extend(service.words("ReadWritePaths").iter().map(PathBuf::from));
        for p in &writable {
            plan.bind(p, p)?;
        }

        match service.one("ProtectSystem") {
            Some("strict") => {
                plan.read_only(Path::new("/"), true)?;
                // /dev, /proc and /sys are other settings' business (PrivateDevices=,
                // ProtectKernelTunables=, ProtectProc=).
                for other in ["/dev", "/proc", "/sys"] {
                    plan.read_only(Path::new(other), false)?;
                }
                if service.yes("PrivateTmp")? {
                    plan.read_only(Path::new("/tmp"), false)?;
                    plan.read_only(Path::new("/var/tmp"), false)?;
                }
                for p in &writable {
                    plan.read_only(p, false)?;
                }
            }
            None => {}
            Some(other) => bail!("ProtectSystem={other}: only strict is known here"),
        }

        match service.one("ProtectProc") {
            Some(v @ ("invisible" | "noaccess" | "ptraceable")) => {
                plan.push(Step::Proc(CString::new(format!("hidepid={v}"))?), "mount -t proc -o hidepid= /proc")?;
            }
            None | Some("default") => {}
            Some(other) => bail!("ProtectProc={other}: not known here"),
        }

        let (dir, file) = inaccessible_nodes(scratch)?;
        let mut hidden = Vec::new();
        if service.yes("ProtectKernelTunables")? {
            for p in TUNABLES_READ_ONLY {
                if Path::new(p).exists() {
                    plan.bind(Path::new(p), Path::new(p))?;
                    plan.read_only(Path::new(p), true)?;
                }
            }
            hidden.extend_from_slice(TUNABLES_INACCESSIBLE);
            // The writable paths under /sys (the cgroup tree) stay writable.
            for p in writable.iter().filter(|p| p.starts_with("/sys")) {
                plan.read_only(p, false)?;
            }
        }
        if service.yes("ProtectKernelModules")? {
            hidden.extend_from_slice(MODULES_INACCESSIBLE);
        }
        if service.yes("ProtectKernelLogs")? {
            hidden.extend_from_slice(LOGS_INACCESSIBLE);
        }
        match service.one("ProtectHome") {
            Some("yes" | "true") => hidden.extend_from_slice(HOME_INACCESSIBLE),
            None | Some("no") => {}
            Some(other) => bail!("ProtectHome={other}: only yes is known here"),
        }
        for p in hidden {
            let path = Path::new(p);
            // symlink_metadata: a link is replaced where it is, not followed.
            let Ok(meta) = path.symlink_metadata() else { continue };
            let node = if meta.is_dir() { &dir } else { &file };
            plan.bind(node, path)?;
            plan.read_only(path, true)?;
        }
        Ok(plan)
    }

    fn push(&mut self, step: Step, what: &str) -> anyhow::Result<()> {
        self.steps.push((step, CString::new(format!("unit sandbox: {what} failed\n"))?));
        Ok(())
    }

    fn bind(&mut self, from: &Path, to: &Path) -> anyhow::Result<()> {
        let what = format!("bind {} onto {}", from.display(), to.display());
        self.push(Step::Bind(c(from)?, c(to)?), &what)
    }

    fn read_only(&mut self, path: &Path, on: bool) -> anyhow::Result<()> {
        let what = format!("{} {}", if on { "read-only" } else { "writable" }, path.display());
        self.push(Step::ReadOnly(c(path)?, on), &what)
    }
}

/// systemd's `/run/systemd/inaccessible/{dir,reg}`: a directory and a file, mode 0000.
fn inaccessible_nodes(scratch: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
    let base = scratch.join("inaccessible");
    let (dir, file) = (base.join("dir"), base.join("reg"));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(&file, b"")?;
    for p in [&dir, &file] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o000))?;
    }
    Ok((dir, file))
}
