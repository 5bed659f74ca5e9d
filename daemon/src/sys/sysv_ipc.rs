//! Removal of System V IPC objects (shmctl, semctl, msgctl with IPC_RMID).

/// A System V IPC table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpcKind {
    /// Shared memory segments.
    Shm,
    /// Semaphore sets.
    Sem,
    /// Message queues.
    Msg,
}

/// Removes object `id` of table `kind`; a stale id fails (EINVAL, EIDRM) and changes nothing.
pub fn remove(kind: IpcKind, id: i32) -> std::io::Result<()> {
    // SAFETY: IPC_RMID takes no buffer (a null pointer is allowed) and only names the
    // object by id; a stale id fails with EINVAL/EIDRM and changes nothing.
    let rc = unsafe {
        match kind {
            IpcKind::Shm => libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()),
            IpcKind::Sem => libc::semctl(id, 0, libc::IPC_RMID),
            IpcKind::Msg => libc::msgctl(id, libc::IPC_RMID, std::ptr::null_mut()),
        }
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
