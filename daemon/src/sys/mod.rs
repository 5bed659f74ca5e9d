//! The daemon's one seam to the operating system: every `libc` call and every `unsafe`
//! block of this crate lives here, in files named by what they wrap; callers get safe
//! functions returning `std::io::Result` or typed errors.
//!
//! - [`signals`]: kill(2), killpg(2) (also behind [`signals::ProcessSignals`], which tests
//!   replace with a recording double) and the signals the daemon sends.
//! - [`pidfd`]: process descriptors (pidfd_open, `SO_PEERPIDFD`, pidfd_send_signal).
//! - [`peer_credentials`]: `SO_PEERCRED` of a unix socket's peer.
//! - [`procfs`]: a process's parent, innermost pid and resident memory from `/proc`.
//! - [`credentials`]: the daemon's own user ids.
//! - [`fs_stats`]: free space of a filesystem (statvfs).
//! - [`open_flags`]: `O_NOFOLLOW` and friends, the set-id mode bits.
//! - [`socket`]: shutdown(2) of a listening socket.
//! - [`sysv_ipc`]: removal of System V IPC objects.
//! - [`loop_device`]: loop devices for kernels' home images.
//! - [`mount`]: mounting a home image, here or in another process's mount namespace.
//! - [`confinement`]: rlimits, a private mount namespace and `/dev/shm` for a kernel's child.
//! - [`pid_namespace`]: a PID namespace per kernel process, and its init.
//! - [`capabilities`]: CAP_SETUID/CAP_SETGID kept across exec for a pre-warmed process
//!   that switches to its kernel's owner; capability sets of `/proc/<pid>/status`.
//! - [`child_setup`]: all a kernel's child does between fork and exec.
//! - [`cuda_checkpoint`]: the CUDA driver's checkpoint entry points (dlopen).
//!
//! Code that runs between fork and exec (`child_setup`, `confinement::apply`,
//! `mount::Ext4Mount::mount_here`, `pid_namespace::enter`) stays raw on purpose: only
//! async-signal-safe calls, no allocation.

pub mod capabilities;
pub mod child_setup;
pub mod confinement;
pub mod credentials;
pub mod cuda_checkpoint;
pub mod dynamic_library;
pub mod fs_stats;
pub mod loop_device;
pub mod mount;
pub mod open_flags;
pub mod peer_credentials;
pub mod pid_namespace;
pub mod pidfd;
pub mod procfs;
pub mod signals;
pub mod socket;
pub mod sysv_ipc;
