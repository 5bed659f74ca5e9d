//! What a kernel uid of `kernel.uid_range` leaves behind when its kernel is gone: files
//! in the shared temporary directories and IPC objects, which would pass, with the uid,
//! to the next kernel that gets it. Removed before a uid is handed out again (and when it
//! is given back), as systemd's `RemoveIPC=` does for a dynamic user; a uid that still
//! has a live process is not handed out at all.
//!
//! Only top-level entries owned by the uid are removed (a directory with everything in
//! it); symlinks are never followed (`remove_dir_all` removes a link, not its target).

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Shared directories a kernel can leave files in: the temporary directories (the
/// unit's private ones under systemd) and the POSIX shared memory and message queue
/// file systems.
const SHARED_DIRS: &[&str] = &["/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue"];

/// What was removed for one uid.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Removed {
    /// Top-level entries of [`SHARED_DIRS`].
    pub files: usize,
    /// SysV shared memory segments, semaphore sets and message queues.
    pub ipc_objects: usize,
}

/// The uids that own a live process (from `/proc/<pid>`'s owner: the process's euid).
pub fn uids_with_processes() -> BTreeSet<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return BTreeSet::new() };
    entries
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
        .filter_map(|e| e.metadata().ok().map(|m| m.uid()))
        .collect()
}

/// Removes what `uid` owns in the shared directories and its SysV IPC objects. Failures
/// are logged and skipped: a leftover the daemon cannot remove must not stop a kernel.
pub fn remove(uid: u32) -> Removed {
    let mut removed = Removed::default();
    for dir in SHARED_DIRS {
        removed.files += remove_owned_entries(Path::new(dir), uid);
    }
    for (table, kind) in [("shm", IpcKind::Shm), ("sem", IpcKind::Sem), ("msg", IpcKind::Msg)] {
        let path = format!("/proc/sysvipc/{table}");
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        for id in owned_ipc_ids(&text, uid) {
            if remove_ipc(kind, id) {
                removed.ipc_objects += 1;
            } else {
                tracing::warn!(uid, id, table, error = %std::io::Error::last_os_error(), "could not remove an IPC object");
            }
        }
    }
    if removed != Removed::default() {
        tracing::info!(
            uid,
            files = removed.files,
            ipc_objects = removed.ipc_objects,
            "removed what a kernel uid left behind"
        );
    }
    removed
}

/// Removes the entries of `dir` owned by `uid`; returns how many.
fn remove_owned_entries(dir: &Path, uid: u32) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut n = 0;
    for e in entries.flatten() {
        let path = e.path();
        // DirEntry::metadata is lstat: a symlink is judged (and removed) as itself.
        let Ok(meta) = e.metadata() else { continue };
        if meta.uid() != uid {
            continue;
        }
        let result = if meta.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
        match result {
            Ok(()) => n += 1,
            Err(error) => {
                tracing::warn!(uid, path = %path.display(), %error, "could not remove a kernel uid's leftover")
            }
        }
    }
    n
}

#[derive(Debug, Clone, Copy)]
enum IpcKind {
    Shm,
    Sem,
    Msg,
}

/// Ids of the objects in a `/proc/sysvipc/*` table whose owner or creator is `uid`
/// (columns found by the header's names, which differ between the tables).
fn owned_ipc_ids(table: &str, uid: u32) -> Vec<i32> {
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
            let owner = |c: usize| f.get(c).and_then(|v| v.parse::<u32>().ok()) == Some(uid);
            (owner(uid_col) || owner(cuid_col)).then(|| f.get(id_col).and_then(|v| v.parse().ok())).flatten()
        })
        .collect()
}

fn remove_ipc(kind: IpcKind, id: i32) -> bool {
    // SAFETY: IPC_RMID takes no buffer (a null pointer is allowed) and only names the
    // object by id; a stale id fails with EINVAL/EIDRM and changes nothing.
    let rc = unsafe {
        match kind {
            IpcKind::Shm => libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()),
            IpcKind::Sem => libc::semctl(id, 0, libc::IPC_RMID),
            IpcKind::Msg => libc::msgctl(id, libc::IPC_RMID, std::ptr::null_mut()),
        }
    };
    rc == 0
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
    fn only_entries_of_the_uid_are_removed_and_links_are_not_followed() {
        let me = nix::unistd::getuid().as_raw();
        let dir = tempfile::tempdir().expect("tmp");
        let outside = tempfile::tempdir().expect("tmp");
        std::fs::write(outside.path().join("keep"), "x").expect("write");
        std::fs::write(dir.path().join("file"), "x").expect("write");
        std::fs::create_dir(dir.path().join("tree")).expect("mkdir");
        std::fs::write(dir.path().join("tree/inner"), "x").expect("write");
        std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).expect("symlink");
        assert_eq!(remove_owned_entries(dir.path(), me), 3);
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0);
        assert!(outside.path().join("keep").exists(), "a symlink's target is not touched");
        std::fs::write(dir.path().join("file"), "x").expect("write");
        assert_eq!(remove_owned_entries(dir.path(), me.wrapping_add(12345)), 0, "another uid's: kept");
        assert!(dir.path().join("file").exists());
    }
}
