//! Who a kernel runs as: never root.
//!
//! A root daemon runs every kernel as `kernel.user` (kernels of that account trust each
//! other), or, with `kernel.uid_range`, each kernel as a uid of its own (gid = that uid:
//! no group is shared either, so files, SysV IPC or `/dev/shm` objects a kernel makes
//! group-accessible stay its own), or, with `kernel.run_as = "owner"`, each kernel as the
//! system account of its owner ([`super::owner_account`]). A daemon that is not root runs
//! kernels as itself.
//! Resolution and allocation are here; the switch itself happens in the child between
//! fork and exec ([`super::process`]).

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::uid_leftovers;
use crate::config::{KernelConfig, RunAs};

/// The account one kernel process runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelIdentity {
    /// User id (never 0).
    pub uid: u32,
    /// Group id (never 0).
    pub gid: u32,
    /// Supplementary groups: an owner's account's (as initgroups(3) gives a login); none
    /// for `kernel.user` and `kernel.uid_range` kernels.
    pub groups: Vec<u32>,
    /// What `USER` and `LOGNAME` say.
    pub user: String,
    /// The account's own home directory, the kernel's HOME (an owner's account); `None`:
    /// the kernel's private home in its directory.
    pub home: Option<PathBuf>,
}

/// Why kernels cannot run as configured.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// `kernel.user` names no account.
    #[error(
        "kernel.user {user:?} does not exist; create it with: \
         useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin {user}"
    )]
    NoSuchUser {
        /// The configured name.
        user: String,
    },
    /// `kernel.group` names no group.
    #[error("kernel.group {group:?} does not exist; create it with: groupadd --system {group}")]
    NoSuchGroup {
        /// The configured name.
        group: String,
    },
    /// The account is root (uid or gid 0): kernels are never root.
    #[error("{what} resolves to {id} 0 (root); kernels never run as root: name an unprivileged account")]
    Root {
        /// `kernel.user` or `kernel.group` and its value.
        what: String,
        /// `uid` or `gid`.
        id: &'static str,
    },
    /// `kernel.run_as = "owner"` and the kernel has no owner.
    #[error(transparent)]
    Owner(#[from] super::owner_account::OwnerError),
    /// `kernel.run_as = "owner"` on a daemon that cannot switch accounts.
    #[error("kernel.run_as = \"owner\" needs a root daemon (only root can run a kernel as its owner's account)")]
    OwnerNeedsRoot,
    /// The account database could not be read.
    #[error("looking up {what}: {source}")]
    Lookup {
        /// What was looked up.
        what: String,
        /// The error of getpwnam_r/getgrnam_r.
        source: nix::Error,
    },
    /// Every uid of `kernel.uid_range` is in use.
    #[error("every uid of kernel.uid_range [{first}, {last}] is taken by a running kernel (or an account)")]
    RangeExhausted {
        /// First uid of the range.
        first: u32,
        /// Last uid of the range.
        last: u32,
    },
    /// A directory above the kernel's files cannot be entered by the kernel's uid.
    #[error(
        "directory {dir} is not traversable by the kernel's uid {uid} (mode {mode:o}, owner {owner}): \
         give others execute permission on it (chmod o+x) or move node.state_dir / kernel.notebook_dir"
    )]
    NotTraversable {
        /// The directory.
        dir: PathBuf,
        /// The kernel's uid.
        uid: u32,
        /// Its permission bits.
        mode: u32,
        /// Its owner's uid.
        owner: u32,
    },
    /// A directory on the path could not be examined.
    #[error("examining {dir}: {source}")]
    Stat {
        /// The directory.
        dir: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

#[derive(Debug)]
enum Mode {
    /// The daemon is not root: kernels run as the daemon's own user, no switch.
    Daemon,
    /// Every kernel runs as this account.
    Shared(KernelIdentity),
    /// A uid per kernel from `[first, last]`.
    Range { first: u32, last: u32 },
    /// Each kernel as its owner's account; `pool` (`kernel.user`) is the account the
    /// pre-warm pool's processes start as, before they switch to their kernel's owner.
    Owner { pool: KernelIdentity, rules: super::owner_account::OwnerRules },
}

/// The kernel accounts of this host and the per-kernel uids handed out.
#[derive(Debug)]
pub struct KernelUsers {
    mode: Mode,
    /// The uids handed out, for [`Mode::Range`] (shared with the cleanup threads).
    allocated: Arc<Mutex<Allocated>>,
}

/// Kernel id -> uid, and where the next search starts: the uid after the last one handed
/// out (next fit), so a uid just given back is the last to be taken again.
#[derive(Debug, Default)]
struct Allocated {
    by_kernel: BTreeMap<String, u32>,
    next: Option<u32>,
    /// Given back, their leftovers being removed (off the async runtime: a kernel may
    /// leave gigabytes); not handed out until that is done.
    cleaning: BTreeSet<u32>,
}

fn lock(m: &Mutex<Allocated>) -> std::sync::MutexGuard<'_, Allocated> {
    // Plain bookkeeping: a panic while it was held leaves it usable.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether this process runs as root (so kernels must switch to another account).
pub fn daemon_is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

impl KernelUsers {
    /// The accounts `cfg` names, for a daemon that is root when `is_root`; a non-root
    /// daemon runs kernels as itself. Logs which, once (the daemon calls it at start).
    pub fn from_config(cfg: &KernelConfig, is_root: bool) -> Result<Self, IdentityError> {
        let users = Self::resolve(cfg, is_root)?;
        match &users.mode {
            Mode::Daemon => tracing::info!(
                uid = nix::unistd::geteuid().as_raw(),
                "the daemon is not root: kernels run as the daemon's own user (kernel.user is not used)"
            ),
            Mode::Shared(id) => {
                tracing::info!(user = %id.user, uid = id.uid, gid = id.gid, "kernels run as kernel.user");
            }
            Mode::Range { first, last } => {
                tracing::info!(first, last, "kernels run as a uid of their own from kernel.uid_range");
            }
            Mode::Owner { pool, .. } => {
                tracing::info!(pool_user = %pool.user, "kernels run as their owner's account (kernel.run_as = \"owner\")");
            }
        }
        Ok(users)
    }

    /// [`Self::from_config`] without the log line.
    pub fn resolve(cfg: &KernelConfig, is_root: bool) -> Result<Self, IdentityError> {
        let mode = match (is_root, cfg.uid_range, cfg.run_as) {
            (false, _, RunAs::Owner) => return Err(IdentityError::OwnerNeedsRoot),
            (false, _, RunAs::KernelUser) => Mode::Daemon,
            (true, _, RunAs::Owner) => {
                let pool = shared_identity(&cfg.user, cfg.group.as_deref())?;
                let rules = super::owner_account::OwnerRules {
                    pool_uid: pool.uid,
                    uid_min: cfg.owner_uid_min,
                    denied_groups: cfg.owner_denied_groups.clone(),
                };
                Mode::Owner { pool, rules }
            }
            (true, Some([first, last]), RunAs::KernelUser) => Mode::Range { first, last },
            (true, None, RunAs::KernelUser) => Mode::Shared(shared_identity(&cfg.user, cfg.group.as_deref())?),
        };
        let users = Self { mode, allocated: Arc::default() };
        if let Mode::Range { first, last } = users.mode {
            users.sweep(first, last);
        }
        Ok(users)
    }

    /// At start (after a restart or a crash of the daemon): the range's uids that still
    /// have processes, files or IPC objects are cleaned before any of them is handed out,
    /// on a thread of their own.
    fn sweep(&self, first: u32, last: u32) {
        let in_range = |u: u32| (first..=last).contains(&u);
        let mut dirty: BTreeSet<u32> =
            uid_leftovers::uids_with_processes().into_iter().filter(|u| in_range(*u)).collect();
        dirty.extend(uid_leftovers::owned_entries(in_range).into_keys());
        dirty.extend(uid_leftovers::ipc_owners().into_iter().filter(|u| in_range(*u)));
        // An account's uid is never a kernel's, and never cleaned.
        dirty.retain(|u| !names_an_account(*u));
        if dirty.is_empty() {
            return;
        }
        tracing::info!(uids = dirty.len(), "cleaning kernel uids an earlier run left processes or files under");
        lock(&self.allocated).cleaning.extend(dirty.iter().copied());
        self.clean_in_background(dirty.into_iter().collect());
    }

    /// Kernels run as the daemon's own user, with no switch (a daemon that is not root;
    /// tests and benchmarks that start kernels themselves).
    pub fn daemon_user() -> Self {
        Self { mode: Mode::Daemon, allocated: Arc::default() }
    }

    /// Every kernel as `id` (tests).
    pub fn shared(id: KernelIdentity) -> Self {
        Self { mode: Mode::Shared(id), allocated: Arc::default() }
    }

    /// The identity kernel `kernel_id`, owned by `owner` (the user who created it), runs
    /// as (`None`: the daemon's own, no switch). With a uid range the same kernel id keeps
    /// its uid until [`Self::release`]; with `run_as = "owner"` the owner's account is
    /// looked up afresh (every start: a restart or a re-placed replica follows the account
    /// database), and `owner` decides alone: nothing the client sends does.
    pub fn acquire(&self, kernel_id: &str, owner: Option<&str>) -> Result<Option<KernelIdentity>, IdentityError> {
        match &self.mode {
            Mode::Daemon => Ok(None),
            Mode::Shared(id) => Ok(Some(id.clone())),
            Mode::Owner { rules, .. } => {
                let a = super::owner_account::lookup(owner, rules)?;
                Ok(Some(KernelIdentity { uid: a.uid, gid: a.gid, groups: a.groups, user: a.name, home: a.home }))
            }
            Mode::Range { first, last } => {
                let mut allocated = lock(&self.allocated);
                if let Some(&uid) = allocated.by_kernel.get(kernel_id) {
                    return Ok(Some(range_identity(uid)));
                }
                let mut taken: BTreeSet<u32> = allocated.by_kernel.values().copied().collect();
                taken.extend(allocated.cleaning.iter().copied());
                // A uid with a live process (a kernel of an earlier daemon run, something it
                // started) is still someone's.
                taken.extend(uid_leftovers::uids_with_processes());
                let start = allocated.next.filter(|u| (*first..=*last).contains(u)).unwrap_or(*first);
                let uid = (start..=*last)
                    .chain(*first..start)
                    .filter(|u| !taken.contains(u))
                    .find(|&u| !names_an_account(u))
                    .ok_or(IdentityError::RangeExhausted { first: *first, last: *last })?;
                // Clean: given back uids leave `cleaning` only once cleaned, and what an
                // earlier run left is swept at start.
                allocated.by_kernel.insert(kernel_id.to_owned(), uid);
                allocated.next = uid.checked_add(1);
                Ok(Some(range_identity(uid)))
            }
        }
    }

    /// Whether a kernel of `owner` would get an account (`run_as = "owner"`; always
    /// with the other modes): [`Self::acquire`] without handing anything out.
    pub fn acquire_for_check(&self, owner: Option<&str>) -> Result<(), super::owner_account::OwnerError> {
        match &self.mode {
            Mode::Owner { rules, .. } => super::owner_account::lookup(owner, rules).map(drop),
            _ => Ok(()),
        }
    }

    /// Gives kernel `kernel_id`'s uid back to the range once what it left in the shared
    /// temporary directories and IPC objects is removed (its processes are gone), which a
    /// thread of its own does.
    pub fn release(&self, kernel_id: &str) {
        let uid = {
            let mut allocated = lock(&self.allocated);
            let Some(uid) = allocated.by_kernel.remove(kernel_id) else { return };
            allocated.cleaning.insert(uid);
            uid
        };
        self.clean_in_background(vec![uid]);
    }

    /// Cleans `uids` (in `cleaning`) one after another on a thread of its own, letting
    /// each be handed out once it is clean.
    fn clean_in_background(&self, uids: Vec<u32>) {
        let shared = self.allocated.clone();
        let cleanup = move || {
            for &uid in &uids {
                uid_leftovers::remove(uid);
                lock(&shared).cleaning.remove(&uid);
            }
        };
        // Without a thread (none can be made), inline: slower, never skipped.
        let inline = cleanup.clone();
        if let Err(e) = std::thread::Builder::new().name("uid-cleanup".into()).spawn(cleanup) {
            tracing::warn!(error = %e, "no thread for the cleanup of kernel uids; cleaning up inline");
            inline();
        }
    }

    /// Waits until every given-back uid is clean (tests; a daemon never needs to).
    pub fn settle(&self) {
        while !lock(&self.allocated).cleaning.is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// The one account every kernel runs as (`Some(None)`: the daemon's own), or `None`
    /// with an account per kernel (`kernel.uid_range`), known only once the kernel is.
    pub fn common_identity(&self) -> Option<Option<KernelIdentity>> {
        match &self.mode {
            Mode::Daemon => Some(None),
            Mode::Shared(id) => Some(Some(id.clone())),
            Mode::Range { .. } | Mode::Owner { .. } => None,
        }
    }

    /// With `run_as = "owner"`: the account pre-warmed processes start as (`kernel.user`),
    /// which switch to their kernel's owner when taken (`docs/prewarm.md`).
    pub fn switching_pool_identity(&self) -> Option<KernelIdentity> {
        match &self.mode {
            Mode::Owner { pool, .. } => Some(pool.clone()),
            _ => None,
        }
    }

    /// Whether kernels run as another account than the daemon's.
    pub fn switches_user(&self) -> bool {
        !matches!(self.mode, Mode::Daemon)
    }

    /// Uids currently handed out (kernel id -> uid), for a range.
    pub fn allocated(&self) -> BTreeMap<String, u32> {
        lock(&self.allocated).by_kernel.clone()
    }
}

/// `kernel.user` (and `kernel.group`, else the user's primary group), never root.
fn shared_identity(user: &str, group: Option<&str>) -> Result<KernelIdentity, IdentityError> {
    let lookup = |what: String| move |source| IdentityError::Lookup { what, source };
    let account = nix::unistd::User::from_name(user)
        .map_err(lookup(format!("kernel.user {user:?}")))?
        .ok_or_else(|| IdentityError::NoSuchUser { user: user.to_owned() })?;
    if account.uid.is_root() {
        return Err(IdentityError::Root { what: format!("kernel.user {user:?}"), id: "uid" });
    }
    let gid = match group {
        Some(g) => {
            nix::unistd::Group::from_name(g)
                .map_err(lookup(format!("kernel.group {g:?}")))?
                .ok_or_else(|| IdentityError::NoSuchGroup { group: g.to_owned() })?
                .gid
        }
        None => account.gid,
    };
    if gid.as_raw() == 0 {
        let what = match group {
            Some(g) => format!("kernel.group {g:?}"),
            None => format!("kernel.user {user:?}'s primary group"),
        };
        return Err(IdentityError::Root { what, id: "gid" });
    }
    Ok(KernelIdentity {
        uid: account.uid.as_raw(),
        gid: gid.as_raw(),
        groups: Vec::new(),
        user: user.to_owned(),
        home: None,
    })
}

fn range_identity(uid: u32) -> KernelIdentity {
    KernelIdentity { uid, gid: uid, groups: Vec::new(), user: format!("nbos-kernel-{uid}"), home: None }
}

/// A uid some account already has is never handed to a kernel (it would own that
/// account's files); a failed lookup counts as taken.
fn names_an_account(uid: u32) -> bool {
    !matches!(nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)), Ok(None))
}

/// Whether a directory with `meta` lets `uid`/`gid` (no supplementary groups) enter it.
pub fn can_traverse(meta: &std::fs::Metadata, uid: u32, gid: u32) -> bool {
    let mode = meta.mode();
    if meta.uid() == uid {
        mode & 0o100 != 0
    } else if meta.gid() == gid {
        mode & 0o010 != 0
    } else {
        mode & 0o001 != 0
    }
}

/// Checks that `uid`/`gid` can enter every directory from `/` down to and including
/// `dir`'s parent (the kernel's own directory is made its own afterwards); the error
/// names the first that it cannot.
pub fn check_traversable(dir: &Path, id: &KernelIdentity) -> Result<(), IdentityError> {
    let mut chain: Vec<&Path> = dir.ancestors().skip(1).collect();
    chain.reverse();
    for d in chain {
        let meta = std::fs::metadata(d).map_err(|source| IdentityError::Stat { dir: d.to_owned(), source })?;
        // An owner's supplementary groups count as its primary group does.
        let group = if id.groups.contains(&meta.gid()) { meta.gid() } else { id.gid };
        if !can_traverse(&meta, id.uid, group) {
            return Err(IdentityError::NotTraversable {
                dir: d.to_owned(),
                uid: id.uid,
                mode: meta.mode() & 0o7777,
                owner: meta.uid(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(first: u32, last: u32) -> KernelUsers {
        KernelUsers { mode: Mode::Range { first, last }, allocated: Arc::default() }
    }

    #[test]
    fn a_range_hands_out_uids_in_turn_and_a_given_back_one_last() {
        // High uids no account (and no process) has on a test host.
        let users = range(3_900_000_000, 3_900_000_003);
        let uid = |k: &str| users.acquire(k, None).expect("acquire").expect("identity").uid;
        assert_eq!(uid("a"), 3_900_000_000);
        assert_eq!(uid("b"), 3_900_000_001);
        assert_eq!(uid("a"), 3_900_000_000, "the same kernel keeps its uid");
        users.release("b");
        users.settle();
        let id = users.acquire("c", None).expect("c").expect("identity");
        assert_eq!((id.uid, id.gid), (3_900_000_002, 3_900_000_002), "next fit, not b's uid; gid = uid");
        assert_eq!(uid("d"), 3_900_000_003);
        assert_eq!(uid("e"), 3_900_000_001, "b's uid again, once the range wrapped");
        assert!(matches!(users.acquire("f", None), Err(IdentityError::RangeExhausted { .. })));
    }

    #[test]
    fn a_uid_whose_leftovers_are_being_removed_is_not_handed_out() {
        let users = range(3_900_000_010, 3_900_000_011);
        let uid = |k: &str| users.acquire(k, None).expect("acquire").expect("identity").uid;
        assert_eq!(uid("a"), 3_900_000_010);
        lock(&users.allocated).cleaning.insert(3_900_000_011);
        assert!(matches!(users.acquire("b", None), Err(IdentityError::RangeExhausted { .. })));
        lock(&users.allocated).cleaning.clear();
        assert_eq!(uid("b"), 3_900_000_011);
    }

    #[test]
    fn a_range_skips_uids_that_accounts_have() {
        // uid 0 (root) always names an account.
        let users = range(0, 0);
        assert!(matches!(users.acquire("a", None), Err(IdentityError::RangeExhausted { .. })));
    }

    #[test]
    fn a_missing_user_says_how_to_create_it_and_root_is_refused() {
        let e = shared_identity("nbos-no-such-user-xyz", None).expect_err("missing").to_string();
        assert!(
            e.contains("useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin nbos-no-such-user-xyz"),
            "{e}"
        );
        let e = shared_identity("root", None).expect_err("root").to_string();
        assert!(e.contains("uid 0 (root)"), "{e}");
        // An account whose primary group is root's, or an explicit root group.
        let e = shared_identity("nobody", Some("root")).expect_err("gid 0").to_string();
        assert!(e.contains("gid 0 (root)"), "{e}");
    }

    #[test]
    fn the_daemon_user_mode_switches_nothing() {
        let users = KernelUsers::daemon_user();
        assert!(!users.switches_user());
        assert_eq!(users.acquire("k", None).expect("acquire"), None);
    }

    #[test]
    fn traversal_names_the_first_closed_directory() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().expect("tmp");
        let closed = t.path().join("closed");
        std::fs::create_dir_all(closed.join("inner")).expect("dirs");
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o711)).expect("chmod");
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let nobody =
            KernelIdentity { uid: 3_900_000_000, gid: 3_900_000_000, groups: Vec::new(), user: "x".into(), home: None };
        let e = check_traversable(&closed.join("inner/kernel"), &nobody).expect_err("closed");
        assert!(matches!(&e, IdentityError::NotTraversable { dir, .. } if dir == &closed), "{e}");
        assert!(e.to_string().contains(&closed.display().to_string()), "{e}");
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o711)).expect("chmod");
        check_traversable(&closed.join("inner/kernel"), &nobody).expect("open");
        // The owner needs its own x bit, not others'.
        let meta = std::fs::metadata(&closed).expect("meta");
        assert!(can_traverse(&meta, meta.uid(), 3_900_000_000));
    }
}
