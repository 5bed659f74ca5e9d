//! The unit's system-call directives as the seccomp filters systemd installs
//! (`src/shared/seccomp-util.c`), built with libseccomp as systemd builds them and exported
//! as BPF, so the forked child only hands each program to the kernel. Native architecture
//! only: `SystemCallArchitectures=native` kills every other one.

use std::collections::BTreeSet;
use std::process::Command;

use anyhow::{bail, Context};

use super::libseccomp::{errno, Arg, Filter, Op, ALLOW, KILL_PROCESS};
use super::unit::Service;

/// One filter program, ready for `seccomp(SECCOMP_SET_MODE_FILTER)`.
pub type Program = Vec<libc::sock_filter>;

/// The `systemd-analyze syscall-filter` expansion of `@group` (nested groups expanded).
fn expand_group(group: &str, out: &mut BTreeSet<String>) -> anyhow::Result<()> {
    let o = Command::new("systemd-analyze")
        .args(["syscall-filter", group])
        .output()
        .context("running systemd-analyze syscall-filter (Debian package systemd)")?;
    anyhow::ensure!(
        o.status.success(),
        "systemd-analyze syscall-filter {group}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let text = String::from_utf8_lossy(&o.stdout);
    let mut any = false;
    for name in text.lines().skip(1).map(str::trim) {
        if name.is_empty() || name.starts_with('#') {
            continue;
        }
        any = true;
        if name.starts_with('@') {
            expand_group(name, out)?;
        } else {
            out.insert(name.to_owned());
        }
    }
    anyhow::ensure!(any, "systemd-analyze knows no system call group {group}");
    Ok(())
}

fn names(item: &str, out: &mut BTreeSet<String>) -> anyhow::Result<()> {
    if item.starts_with('@') {
        expand_group(item, out)
    } else {
        out.insert(item.to_owned());
        Ok(())
    }
}

/// `SystemCallFilter=` lines as systemd reads them: the first decides deny list (`~`) or
/// allow list; a later line of the other kind takes its names out again.
pub fn syscall_filter_set(lines: &[String]) -> anyhow::Result<(bool, BTreeSet<String>)> {
    let mut deny = None;
    let mut set = BTreeSet::new();
    for line in lines {
        let (invert, list) = match line.strip_prefix('~') {
            Some(rest) => (true, rest),
            None => (false, line.as_str()),
        };
        let is_deny = *deny.get_or_insert(invert);
        let mut these = BTreeSet::new();
        for item in list.split_whitespace() {
            names(item, &mut these)?;
        }
        if invert == is_deny {
            set.extend(these);
        } else {
            set.retain(|n| !these.contains(n));
        }
    }
    Ok((deny.unwrap_or(false), set))
}

/// A filter that allows everything but what `rules` add.
fn filter(rules: impl FnOnce(&mut Filter) -> anyhow::Result<()>) -> anyhow::Result<Program> {
    let mut ctx = Filter::new(ALLOW)?;
    rules(&mut ctx)?;
    ctx.export()
}

/// Adds `action` for `name` (with `args`), skipping a call this architecture lacks.
fn rule(ctx: &mut Filter, action: u32, name: &str, args: &[Arg]) -> anyhow::Result<()> {
    ctx.rule(action, name, args)?;
    Ok(())
}

/// The errno of `SystemCallErrorNumber=` (unset: systemd kills the process instead).
fn error_action(service: &Service) -> anyhow::Result<u32> {
    Ok(match service.one("SystemCallErrorNumber") {
        None | Some("kill") => KILL_PROCESS,
        Some("EPERM") => errno(libc::EPERM),
        Some("EACCES") => errno(libc::EACCES),
        Some("ENOSYS") => errno(libc::ENOSYS),
        Some(other) => bail!("SystemCallErrorNumber={other}: not an errno the sandbox knows"),
    })
}

/// `SystemCallArchitectures=native`: a filter with no rules, whose bad-architecture action
/// (libseccomp's default: kill) is all it does.
pub fn architectures(service: &Service) -> anyhow::Result<Option<Program>> {
    match service.one("SystemCallArchitectures") {
        None => Ok(None),
        Some("native") => filter(|_| Ok(())).map(Some),
        Some(other) => bail!("SystemCallArchitectures={other}: only native is known here"),
    }
}

/// `SystemCallFilter=` (with `SystemCallErrorNumber=`).
pub fn syscall_filter(service: &Service) -> anyhow::Result<Option<Program>> {
    if service.all("SystemCallFilter").is_empty() {
        return Ok(None);
    }
    let (deny, set) = syscall_filter_set(service.all("SystemCallFilter"))?;
    let action = error_action(service)?;
    if !deny {
        bail!("an allow-list SystemCallFilter= (systemd adds @default and more to it): not known here");
    }
    filter(|ctx| {
        for name in &set {
            rule(ctx, action, name, &[])?;
        }
        Ok(())
    })
    .map(Some)
}

/// Names in `~@group` of the `Protect*=` settings systemd turns into system-call denials.
fn deny_groups(ctx: &mut Filter, groups: &[&str]) -> anyhow::Result<()> {
    let mut set = BTreeSet::new();
    for g in groups {
        names(g, &mut set)?;
    }
    for name in &set {
        rule(ctx, errno(libc::EPERM), name, &[])?;
    }
    Ok(())
}

/// ProtectClock= (@clock), ProtectKernelModules= (@module), ProtectKernelLogs= (syslog),
/// ProtectKernelTunables= (_sysctl), ProtectHostname= (sethostname, setdomainname).
pub fn protections(service: &Service) -> anyhow::Result<Option<Program>> {
    let mut groups = Vec::new();
    for (key, group) in [
        ("ProtectClock", &["@clock"][..]),
        ("ProtectKernelModules", &["@module"]),
        ("ProtectKernelLogs", &["syslog"]),
        ("ProtectKernelTunables", &["_sysctl"]),
        ("ProtectHostname", &["sethostname", "setdomainname"]),
    ] {
        if service.yes(key)? {
            groups.extend_from_slice(group);
        }
    }
    if groups.is_empty() {
        return Ok(None);
    }
    filter(|ctx| deny_groups(ctx, &groups)).map(Some)
}

/// The address families of `RestrictAddressFamilies=` (an allow list).
fn family(name: &str) -> anyhow::Result<i32> {
    Ok(match name {
        "AF_UNIX" => libc::AF_UNIX,
        "AF_INET" => libc::AF_INET,
        "AF_INET6" => libc::AF_INET6,
        "AF_NETLINK" => libc::AF_NETLINK,
        "AF_PACKET" => libc::AF_PACKET,
        other => bail!("address family {other}: not one the sandbox knows"),
    })
}

/// Linux's AF_MAX (include/linux/socket.h, 6.x).
const AF_MAX: i32 = 46;

/// `RestrictAddressFamilies=`: socket(2) of any other family fails with EAFNOSUPPORT.
pub fn address_families(service: &Service) -> anyhow::Result<Option<Program>> {
    let words = service.words("RestrictAddressFamilies");
    if words.is_empty() {
        return Ok(None);
    }
    if words.iter().any(|w| w.starts_with('~')) {
        bail!("a deny-list RestrictAddressFamilies=: not known here");
    }
    let allowed = words.iter().map(|w| family(w)).collect::<anyhow::Result<BTreeSet<i32>>>()?;
    let deny = errno(libc::EAFNOSUPPORT);
    filter(|ctx| {
        let (first, last) = (*allowed.first().expect("non-empty"), *allowed.last().expect("non-empty"));
        let below = u64::try_from(first)?;
        let above = u64::try_from(last)?;
        rule(ctx, deny, "socket", &[Arg::new(0, Op::Less, below)])?;
        rule(ctx, deny, "socket", &[Arg::new(0, Op::Greater, above)])?;
        for af in 1..AF_MAX {
            if !allowed.contains(&af) {
                rule(ctx, deny, "socket", &[Arg::new(0, Op::Equal, u64::try_from(af)?)])?;
            }
        }
        Ok(())
    })
    .map(Some)
}

const NAMESPACES: [(&str, i32); 7] = [
    ("cgroup", libc::CLONE_NEWCGROUP),
    ("ipc", libc::CLONE_NEWIPC),
    ("net", libc::CLONE_NEWNET),
    ("mnt", libc::CLONE_NEWNS),
    ("pid", libc::CLONE_NEWPID),
    ("user", libc::CLONE_NEWUSER),
    ("uts", libc::CLONE_NEWUTS),
];

/// `RestrictNamespaces=~kinds`: unshare, clone and setns of those kinds fail with EPERM,
/// setns with no kind too; clone3 (its flags out of a filter's reach) fails with ENOSYS so
/// the C library falls back to clone.
pub fn namespaces(service: &Service) -> anyhow::Result<Option<Program>> {
    let Some(value) = service.one("RestrictNamespaces") else { return Ok(None) };
    let Some(denied) = value.strip_prefix('~') else {
        bail!("RestrictNamespaces={value}: only a ~deny list is known here");
    };
    let mut blocked = Vec::new();
    for kind in denied.split_whitespace() {
        let (_, flag) = NAMESPACES
            .iter()
            .find(|(n, _)| *n == kind)
            .with_context(|| format!("RestrictNamespaces: unknown kind {kind}"))?;
        blocked.push(u64::try_from(*flag)?);
    }
    let eperm = errno(libc::EPERM);
    filter(|ctx| {
        rule(ctx, eperm, "setns", &[Arg::new(1, Op::Equal, 0)])?;
        for f in &blocked {
            rule(ctx, eperm, "unshare", &[Arg::masked(0, *f, *f)])?;
            rule(ctx, eperm, "clone", &[Arg::masked(0, *f, *f)])?;
            rule(ctx, eperm, "setns", &[Arg::masked(1, *f, *f)])?;
        }
        rule(ctx, errno(libc::ENOSYS), "clone3", &[])?;
        Ok(())
    })
    .map(Some)
}

/// `RestrictRealtime=yes`: sched_setscheduler to anything but OTHER, BATCH and IDLE fails.
pub fn realtime(service: &Service) -> anyhow::Result<Option<Program>> {
    if !service.yes("RestrictRealtime")? {
        return Ok(None);
    }
    let permitted = [libc::SCHED_OTHER, libc::SCHED_BATCH, libc::SCHED_IDLE];
    let max = u64::try_from(libc::SCHED_IDLE)?;
    filter(|ctx| {
        let eperm = errno(libc::EPERM);
        for p in 0..libc::SCHED_IDLE {
            if !permitted.contains(&p) {
                rule(ctx, eperm, "sched_setscheduler", &[Arg::new(1, Op::Equal, u64::try_from(p)?)])?;
            }
        }
        rule(ctx, eperm, "sched_setscheduler", &[Arg::new(1, Op::Greater, max)])?;
        Ok(())
    })
    .map(Some)
}

/// `RestrictSUIDSGID=yes`: no set-user-ID or set-group-ID file is made (chmod, mkdir, mknod,
/// open and creat with those mode bits), openat2 (its flags out of reach) not at all.
pub fn suid_sgid(service: &Service) -> anyhow::Result<Option<Program>> {
    if !service.yes("RestrictSUIDSGID")? {
        return Ok(None);
    }
    let eperm = errno(libc::EPERM);
    let creat = u64::try_from(libc::O_CREAT)?;
    filter(|ctx| {
        for m in [u64::from(libc::S_ISUID), u64::from(libc::S_ISGID)] {
            let mode = |i| Arg::masked(i, m, m);
            for (name, i) in [("chmod", 1), ("fchmod", 1), ("fchmodat", 2), ("mkdir", 1), ("mkdirat", 2)] {
                rule(ctx, eperm, name, &[mode(i)])?;
            }
            for (name, i) in [("mknod", 1), ("mknodat", 2), ("creat", 1)] {
                rule(ctx, eperm, name, &[mode(i)])?;
            }
            rule(ctx, eperm, "open", &[Arg::masked(1, creat, creat), mode(2)])?;
            rule(ctx, eperm, "openat", &[Arg::masked(2, creat, creat), mode(3)])?;
        }
        rule(ctx, eperm, "openat2", &[])?;
        Ok(())
    })
    .map(Some)
}

/// `LockPersonality=yes`: personality(2) may only set the personality it has.
pub fn personality(service: &Service) -> anyhow::Result<Option<Program>> {
    if !service.yes("LockPersonality")? {
        return Ok(None);
    }
    // SAFETY: personality(0xffffffff) only reads the calling process's personality.
    let current = unsafe { libc::personality(0xffff_ffff) };
    let current = u64::try_from(current).context("personality(2)")?;
    filter(|ctx| {
        rule(ctx, errno(libc::EPERM), "personality", &[Arg::new(0, Op::NotEqual, current)])?;
        Ok(())
    })
    .map(Some)
}
