//! Kernel hosting on this host: ipykernel processes, their connection files and sockets,
//! confinement, and the [`LocalKernel`] each kernel (or each replica of a cluster kernel)
//! runs as here.
//!
//! - [`connection`]: ports and the random HMAC key of one process.
//! - [`process`]: spawn, signal, wait.
//! - [`prewarm`]: the pool of pre-warmed kernel processes new replicas take over.
//! - [`ipykernel`]: one ipykernel process plus the daemon's ZMQ sockets to it.
//! - [`sockets`]: the options (a message size cap) of every ZMQ socket.
//! - [`port_owner`]: whether the listener on a kernel's port is the kernel's own.
//! - [`hub`]: routing to clients, replay buffer for disconnected clients.
//! - [`local_kernel`]: a kernel's process on this host (ipykernel, hub, heartbeat, restarts).
//! - [`binding`]: per-cell GPU binding (scheduler core + lease control).
//! - [`fair_share`]: the order contended GPUs go in: kernels' owners and their recent GPU time.
//! - [`daily_usage`]: each user's and group's GPU time today (UTC).
//! - [`gpu_hours`]: `gpu_hours_per_day`: whether a cell may have GPUs today.
//! - [`cgroup`]: per-kernel memory cgroups (v2, v1 or none).
//! - [`device_cgroup`]: per-kernel cgroup with the GPU device guard (eBPF) attached.
//! - [`id`]: what a kernel id may be (a canonical UUID).
//! - [`identity`]: the unprivileged account (uid, gid) a kernel runs as.
//! - [`owner_account`]: the owner's account, with `kernel.run_as = "owner"`.
//! - [`sandbox`]: rlimits and the private mount namespace (bounded `/dev/shm`) of kernels.
//! - [`home`]: a kernel's home with a byte quota (a loop-mounted ext4 image).
//! - [`registry`]: all kernels of this host.
//! - [`spec`]: kernelspecs and their GPU requests.
//! - [`shim_env`]: the CUDA shim environment of kernel processes.
//! - [`server_leases`]: lease control over the host's lease server.

pub mod binding;
pub mod cgroup;
pub mod client_env;
pub mod connection;
pub mod daily_usage;
pub mod device_cgroup;
pub mod fair_share;
pub mod gpu_hours;
pub mod home;
pub mod hub;
pub mod id;
pub mod identity;
pub mod ipykernel;
pub mod local_kernel;
pub mod memory_usage;
pub mod orphans;
pub mod owner_account;
pub mod port_owner;
pub mod prewarm;
pub mod process;
pub mod registry;
pub mod sandbox;
pub mod server_leases;
pub mod shim_env;
pub mod sockets;
pub mod spec;
pub mod uid_leftovers;

pub use id::is_kernel_id;
pub use local_kernel::{KernelModel, LocalKernel};
pub use registry::Kernels;
