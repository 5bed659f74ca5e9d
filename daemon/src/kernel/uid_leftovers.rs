//! What a kernel uid of `kernel.uid_range` leaves behind when its kernel is gone:
//! processes that outlived it, files in the shared temporary directories and in the
//! daemon's own directories kernels may write (the shim's `counters/`, the fake GPUs'
//! `fake-cuda/`, under `node.runtime_dir`), IPC objects.
//! All of it would pass, with the uid, to the next kernel that gets it. Cleaned before the
//! uid is handed out again, as systemd's `RemoveIPC=` does for a dynamic user.
//!
//! Processes and files are cleaned by a child process that runs *as the uid* (`rm -rf`
//! after `kill(-1, SIGKILL)`): it kills every process of the uid, wherever it hides, and
//! removes only what the uid itself could remove (in a sticky
//! `/tmp`, its own entries; nothing another user keeps in a directory it shared), so a
//! swapped name, a foreign subtree or a deep tree cannot make the root daemon delete
//! another user's files or crash. SysV IPC objects the uid owns or created are removed by
//! id (`IPC_RMID`; an id reused meanwhile fails harmlessly). Before that, the set-user-ID
//! and set-group-ID bits of the uid's files are cleared (by the root daemon, on the open
//! file, never through a link): should a file outlive the cleanup, it does not run as the
//! uid's next kernel.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, PoisonError};

use crate::sys::sysv_ipc::{self, IpcKind};
use crate::sys::{open_flags, signals};

/// Shared directories a kernel can leave files in: the temporary directories (the
/// unit's private ones under systemd) and the POSIX shared memory and message queue
/// file systems.
const SHARED_DIRS: &[&str] = &["/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue"];

/// Directories of `node.runtime_dir` that kernels may create files in (`shim_env.rs`
/// makes them, `node/kernels_dir.rs` opens them to kernels: 1733 and 1777, sticky).
const RUNTIME_DIRS_KERNELS_WRITE: &[&str] = &["counters", "fake-cuda"];

/// The daemon's own directories kernels write in, cleaned like [`SHARED_DIRS`].
static DAEMON_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Cleans a kernel uid's files in the directories of `runtime_dir` that kernels may write,
/// too. Called once at start, before kernel uids are swept or handed out.
pub fn also_clean_runtime_dir(runtime_dir: &Path) {
    let mut dirs = DAEMON_DIRS.lock().unwrap_or_else(PoisonError::into_inner);
    for name in RUNTIME_DIRS_KERNELS_WRITE {
        let dir = std::path::absolute(runtime_dir.join(name)).unwrap_or_else(|_| runtime_dir.join(name));
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
}

/// Every directory cleaned: the shared ones and the daemon's own.
fn cleaned_dirs() -> Vec<PathBuf> {
    let own = DAEMON_DIRS.lock().unwrap_or_else(PoisonError::into_inner).clone();
    SHARED_DIRS.iter().map(PathBuf::from).chain(own).collect()
}

/// What was cleaned for one uid.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Removed {
    /// Top-level entries of [`SHARED_DIRS`] and the daemon's directories handed to the cleanup.
    pub files: usize,
    /// Files whose set-user-ID or set-group-ID bit was cleared first.
    pub setid_cleared: usize,
    /// SysV shared memory segments, semaphore sets and message queues.
    pub ipc_objects: usize,
}

/// The uids (real, effective, saved or file system) of live processes, from the `Uid:`
/// line of `/proc/<pid>/status` (a process whose effective uid is another still counts
/// for its real and saved ones, which it can switch back to).
pub fn uids_with_processes() -> BTreeSet<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return BTreeSet::new() };
    entries
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
        .filter_map(|e| std::fs::read_to_string(e.path().join("status")).ok())
        .flat_map(|status| status_uids(&status))
        .collect()
}

/// The four uids of a `/proc/<pid>/status` text.
fn status_uids(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .map(|ids| ids.split_whitespace().filter_map(|v| v.parse().ok()).collect())
        .unwrap_or_default()
}

/// Top-level entries of the shared directories whose owner `wanted` accepts, by owner.
/// `lstat`: a symlink is judged as itself.
pub fn owned_entries(wanted: impl Fn(u32) -> bool) -> BTreeMap<u32, Vec<PathBuf>> {
    let mut out: BTreeMap<u32, Vec<PathBuf>> = BTreeMap::new();
    for dir in cleaned_dirs() {
        entries_in(&dir, &wanted, &mut out);
    }
    out
}

fn entries_in(dir: &Path, wanted: &impl Fn(u32) -> bool, out: &mut BTreeMap<u32, Vec<PathBuf>>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        // DirEntry::metadata is lstat.
        if let Ok(meta) = e.metadata() {
            if wanted(meta.uid()) {
                out.entry(meta.uid()).or_default().push(e.path());
            }
        }
    }
}

/// Cleans everything of `uid`: its processes, its entries in the shared directories, its
/// SysV IPC objects. Failures are logged: a leftover the uid cannot remove itself stays
/// (it is in someone else's directory, or is not the uid's to remove).
pub fn remove(uid: u32) -> Removed {
    let paths = owned_entries(|owner| owner == uid).remove(&uid).unwrap_or_default();
    let setid_cleared = paths.iter().filter(|p| clear_setid(p, uid)).count();
    if let Err(e) = kill_and_remove_as(uid, &paths) {
        tracing::warn!(uid, error = %e, "the cleanup of a kernel uid did not remove everything");
    }
    let ipc_objects = remove_ipc_of(uid);
    let removed = Removed { files: paths.len(), setid_cleared, ipc_objects };
    if removed != Removed::default() {
        tracing::info!(uid, files = removed.files, setid_cleared, ipc_objects, "cleaned what a kernel uid left behind");
    }
    removed
}

/// Clears the set-user-ID and set-group-ID bits of `path` when it is a regular file owned by
/// `uid` (checked on the open file: a name swapped for a link or another file meanwhile is
/// left alone). Returns whether bits were cleared.
fn clear_setid(path: &Path, uid: u32) -> bool {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    const SETID: u32 = open_flags::S_ISUID | open_flags::S_ISGID;
    let Ok(meta) = std::fs::symlink_metadata(path) else { return false };
    if !meta.is_file() || meta.mode() & SETID == 0 {
        return false;
    }
    // O_NOFOLLOW: never a link's target; O_NONBLOCK: never wait on a FIFO swapped in.
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(open_flags::O_NOFOLLOW | open_flags::O_NONBLOCK | open_flags::O_NOCTTY)
        .open(path)
    else {
        return false;
    };
    let Ok(meta) = file.metadata() else { return false };
    if !meta.is_file() || meta.uid() != uid || meta.mode() & SETID == 0 {
        return false;
    }
    let mode = meta.mode() & 0o7777 & !SETID;
    match file.set_permissions(std::fs::Permissions::from_mode(mode)) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(uid, path = %path.display(), error = %e, "could not clear a set-id bit of a kernel uid's file");
            false
        }
    }
}

/// Runs `rm -rf --one-file-system -- PATHS` as `uid` (gid the same, no groups), after
/// killing every process of the uid from inside that child.
fn kill_and_remove_as(uid: u32, paths: &[PathBuf]) -> Result<(), String> {
    let rm = ["/usr/bin/rm", "/bin/rm"].into_iter().find(|p| Path::new(p).exists()).unwrap_or("rm");
    let mut cmd = Command::new(rm);
    cmd.args(["-rf", "--one-file-system", "--"])
        .args(paths)
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .uid(uid)
        .gid(uid);
    // kill(-1) signals every process the caller may signal, except itself: as `uid`,
    // exactly that uid's processes.
    signals::kill_all_of_own_uid_before_exec(&mut cmd);
    let out = cmd.output().map_err(|e| format!("running {rm} as uid {uid}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        Err(format!("{rm} as uid {uid} ({}): {}", out.status, stderr.lines().take(3).collect::<Vec<_>>().join("; ")))
    }
}

fn remove_ipc_of(uid: u32) -> usize {
    let mut n = 0;
    for (table, kind) in IPC_TABLES {
        let Ok(text) = std::fs::read_to_string(format!("/proc/sysvipc/{table}")) else { continue };
        for id in owned_ipc_ids(&text, uid) {
            if remove_ipc(kind, id) {
                n += 1;
            } else {
                tracing::warn!(uid, id, table, error = %std::io::Error::last_os_error(), "could not remove an IPC object");
            }
        }
    }
    n
}

/// The owners and creators of every SysV IPC object.
pub fn ipc_owners() -> BTreeSet<u32> {
    IPC_TABLES
        .iter()
        .filter_map(|(table, _)| std::fs::read_to_string(format!("/proc/sysvipc/{table}")).ok())
        .flat_map(|text| ipc_objects(&text).into_iter().flat_map(|o| [o.uid, o.cuid]))
        .collect()
}

const IPC_TABLES: [(&str, IpcKind); 3] = [("shm", IpcKind::Shm), ("sem", IpcKind::Sem), ("msg", IpcKind::Msg)];

/// One row of a `/proc/sysvipc/*` table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct IpcObject {
    id: i32,
    uid: u32,
    cuid: u32,
}

/// The rows of a `/proc/sysvipc/*` table (columns found by the header's names, which
/// differ between the tables; a row that does not parse is skipped).
fn ipc_objects(table: &str) -> Vec<IpcObject> {
    let mut lines = table.lines();
    let Some(header) = lines.next() else { return Vec::new() };
    let names: Vec<&str> = header.split_whitespace().collect();
    let column = |name: &str| names.iter().position(|n| *n == name);
    let id_col = column("shmid").or_else(|| column("semid")).or_else(|| column("msqid"));
    let (Some(id_col), Some(uid_col), Some(cuid_col)) = (id_col, column("uid"), column("cuid")) else {
        return Vec::new();
    };
    lines
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            Some(IpcObject {
                id: f.get(id_col)?.parse().ok()?,
                uid: f.get(uid_col)?.parse().ok()?,
                cuid: f.get(cuid_col)?.parse().ok()?,
            })
        })
        .collect()
}

/// Ids of the objects of a table whose owner or creator is `uid`.
fn owned_ipc_ids(table: &str, uid: u32) -> Vec<i32> {
    ipc_objects(table).into_iter().filter(|o| o.uid == uid || o.cuid == uid).map(|o| o.id).collect()
}

fn remove_ipc(kind: IpcKind, id: i32) -> bool {
    sysv_ipc::remove(kind, id).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipc_tables_are_read_by_their_header() {
        let shm = "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime      dtime      ctime                   rss                  swap\n\
                   0 32768 600 4096 10 0 0 60001 60001 60001 60001 0 0 1 0 0\n\
                   0 32769 600 4096 10 0 0 1000 1000 60001 60001 0 0 1 0 0\n\
                   0 32770 600 4096 10 0 0 1000 1000 1000 1000 0 0 1 0 0\n";
        assert_eq!(owned_ipc_ids(shm, 60001), vec![32768, 32769], "owner or creator");
        let sem = "       key      semid perms      nsems   uid   gid  cuid  cgid      otime      ctime\n\
                   1 5 600 1 60002 60002 60002 60002 0 1\n";
        assert_eq!(owned_ipc_ids(sem, 60002), vec![5]);
        let msg = "       key      msqid perms      cbytes       qnum lspid lrpid   uid   gid  cuid  cgid      stime      rtime      ctime\n\
                   1 7 600 0 0 0 0 60003 60003 60003 60003 0 0 1\n";
        assert_eq!(owned_ipc_ids(msg, 60003), vec![7]);
        assert!(owned_ipc_ids("", 1).is_empty());
        assert!(owned_ipc_ids("garbage\n1 2 3\n", 1).is_empty(), "no uid column: nothing");
    }

    #[test]
    fn a_process_counts_for_each_of_its_uids_whatever_owns_its_proc_entry() {
        let status = "Name:\tsleep\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t2000001\t2000002\t2000003\t2000004\nGid:\t0\t0\t0\t0\n";
        assert_eq!(status_uids(status), vec![2_000_001, 2_000_002, 2_000_003, 2_000_004]);
        assert!(status_uids("Name:\tx\n").is_empty());
        let me = nix::unistd::getuid().as_raw();
        assert!(uids_with_processes().contains(&me), "this test's own process");
    }

    #[test]
    fn setid_bits_are_cleared_on_the_uids_own_regular_files_only() {
        use std::os::unix::fs::PermissionsExt;
        let me = nix::unistd::getuid().as_raw();
        let dir = tempfile::tempdir().expect("tmp");
        let file = dir.path().join("suid");
        std::fs::write(&file, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o6755)).expect("chmod");
        assert!(!clear_setid(&file, me.wrapping_add(1)), "another uid's file");
        assert_eq!(std::fs::metadata(&file).expect("meta").mode() & 0o7777, 0o6755);
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).expect("symlink");
        assert!(!clear_setid(&link, me), "a link is not followed");
        assert!(clear_setid(&file, me));
        assert_eq!(std::fs::metadata(&file).expect("meta").mode() & 0o7777, 0o755);
        assert!(!clear_setid(&file, me), "nothing left to clear");
    }

    #[test]
    fn the_runtime_dirs_kernels_write_are_cleaned_too() {
        let run = tempfile::tempdir().expect("tmp");
        also_clean_runtime_dir(run.path());
        let dirs = cleaned_dirs();
        assert!(
            dirs.contains(&run.path().join("counters")) && dirs.contains(&run.path().join("fake-cuda")),
            "{dirs:?}"
        );
        assert!(dirs.contains(&PathBuf::from("/tmp")));
    }

    #[test]
    fn entries_are_listed_by_owner_and_symlinks_as_themselves() {
        let me = nix::unistd::getuid().as_raw();
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(dir.path().join("file"), "x").expect("write");
        std::fs::create_dir(dir.path().join("tree")).expect("mkdir");
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("link")).expect("symlink");
        let mut out = BTreeMap::new();
        entries_in(dir.path(), &|owner| owner == me, &mut out);
        let mut names: Vec<String> =
            out[&me].iter().map(|p| p.file_name().expect("name").to_string_lossy().into()).collect();
        names.sort();
        assert_eq!(names, ["file", "link", "tree"]);
        let mut none = BTreeMap::new();
        entries_in(dir.path(), &|owner| owner != me, &mut none);
        assert!(none.is_empty(), "another uid's: nothing");
    }
}
