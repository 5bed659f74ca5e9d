//! `[kernel]`: notebook kernel processes (account, limits, sandbox, pre-warm pool), their
//! defaults, and the checks the text alone allows.

use std::path::PathBuf;

use nbos_sched::policy::PolicyConfig;
use serde::{Deserialize, Serialize};

use super::ConfigError;

/// `[kernel]`: notebook kernel processes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KernelConfig {
    /// Python interpreter that runs ipykernel.
    pub python: PathBuf,
    /// Memory limit per kernel process tree in MiB (memory cgroup); 0 means none.
    /// Default [`DEFAULT_KERNEL_MEMORY_LIMIT_MIB`].
    pub memory_limit_mib: u64,
    /// Also set `memory_limit_mib` as RLIMIT_AS of each kernel process (an oversized
    /// allocation becomes a Python MemoryError, not an OOM kill). Off by default: CUDA
    /// and the JITs reserve far more address space than they use, and fail under it.
    pub limit_address_space: bool,
    /// Each kernel process in a PID namespace of its own (root daemons): it can signal and
    /// trace only its own processes, not the pre-warm pool's, other kernels' or the host's,
    /// whatever account they share. Inside, Python is pid 2 under a small init that reaps
    /// orphans. Off: kernels share the daemon's, as any process of their account does.
    pub pid_namespace: bool,
    /// The unprivileged account kernels run as when the daemon is root (never root).
    pub user: String,
    /// Group kernels run as; unset means `user`'s primary group.
    pub group: Option<String>,
    /// `[first, last]`: each running kernel gets its own uid (and gid = that uid) from
    /// this range, so kernels cannot read each other's files; unset: all run as `user`.
    pub uid_range: Option<[u32; 2]>,
    /// Whose account a kernel runs as (root daemons): `kernel_user` (`user` or
    /// `uid_range`) or `owner` (the system account named as the kernel's owner).
    pub run_as: RunAs,
    /// With `run_as = "owner"`: the lowest uid (and primary gid) an owner's account may
    /// have. Below it are the host's system accounts (`daemon`, `www-data`, `syslog`), which
    /// a login name must never reach. Default 1000, the UID_MIN of most distributions.
    pub owner_uid_min: u32,
    /// With `run_as = "owner"`: an owner's account that is a member (primary or
    /// supplementary) of one of these groups is refused: they give root or the host's
    /// disks, logs or container runtime. Default [`DEFAULT_OWNER_DENIED_GROUPS`].
    pub owner_denied_groups: Vec<String>,
    /// The kernel's working directory; unset means its private per-kernel directory.
    pub notebook_dir: Option<PathBuf>,
    /// Most processes (threads included) in one kernel's pids cgroup; 0 means no limit.
    pub pids_max: u64,
    /// Pre-warmed kernel processes kept even when none is taken (`docs/prewarm.md`).
    pub prewarm_min: u32,
    /// Most pre-warmed kernel processes; 0 turns the pool off (whatever `prewarm_min` says).
    pub prewarm_max: u32,
    /// Size of each kernel's home (HOME, TMPDIR, default working directory) in MiB: a
    /// sparse ext4 image in the kernel's directory under `node.state_dir`, loop-mounted
    /// (nosuid, nodev) in the kernel's own mount namespace, so a write past it fails with
    /// ENOSPC. Root daemons only; 0 means no quota (the home is a plain directory).
    pub home_quota_mib: u64,
    /// Size of each kernel's private `/dev/shm` (a tmpfs in its own mount namespace,
    /// nosuid, nodev, noexec) in MiB; root daemons only. 0 means the host's `/dev/shm`.
    pub shm_size_mib: u64,
    /// RLIMIT_NOFILE (soft and hard) of kernel processes; 0 means the daemon's own.
    pub open_files_max: u64,
    /// RLIMIT_NPROC of kernel processes: processes and threads of the kernel's *uid*, all
    /// of its processes together (with one shared `kernel.user`, all kernels' together;
    /// `pids_max` is the per-kernel cap). 0 means the daemon's own.
    pub nproc_max: u64,
    /// The largest Jupyter message (all its frames) the daemon takes from a kernel's ZMQ
    /// sockets; a kernel that sends more is disconnected and killed, never the daemon.
    pub max_message_bytes: u64,
}

/// `kernel.run_as`: whose account kernels run as.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunAs {
    /// `kernel.user` (or a uid of `kernel.uid_range`) for every kernel: today's default.
    #[default]
    KernelUser,
    /// The system account whose name is the kernel's owner (its user): NSS lookup, never
    /// root; a kernel without an owner is refused.
    Owner,
}

/// `kernel.max_message_bytes`'s default: far above real Jupyter traffic (a notebook's
/// largest outputs, plots and widget states, are a few MiB; namespace state goes through
/// files, not messages), far below what hurts a host.
pub const DEFAULT_KERNEL_MAX_MESSAGE_BYTES: u64 = 64 << 20;

/// `kernel.memory_limit_mib`'s default, 16 GiB: room for an ordinary notebook (a
/// DataFrame of a few GiB, a model's host-side copy, DataLoader workers), while one
/// runaway cell cannot take a whole host's memory from its neighbours and the daemon
/// (`gpu.subscription_ratio` puts several kernels on a host). Raise it for big-data work.
pub const DEFAULT_KERNEL_MEMORY_LIMIT_MIB: u64 = 16 << 10;
/// `kernel.home_quota_mib`'s default, 10 GiB: datasets, checkpoints and pip installs of
/// one notebook; the image is sparse, so only what is written takes disk space.
pub const DEFAULT_KERNEL_HOME_QUOTA_MIB: u64 = 10 << 10;
/// `kernel.shm_size_mib`'s default, 2 GiB: PyTorch DataLoader workers pass batches
/// through `/dev/shm` (Docker's 64 MiB breaks them); its pages also count against the
/// kernel's memory cgroup.
pub const DEFAULT_KERNEL_SHM_SIZE_MIB: u64 = 2 << 10;
/// `kernel.open_files_max`'s default: far above what a notebook opens (PyTorch's
/// file-descriptor sharing included), far below the daemon's 1048576 (systemd unit).
pub const DEFAULT_KERNEL_OPEN_FILES_MAX: u64 = 65_536;
/// `kernel.nproc_max`'s default: with one shared `kernel.user` it caps all kernels of
/// the host together (a fork bomb in one kernel is stopped by `pids_max` first).
pub const DEFAULT_KERNEL_NPROC_MAX: u64 = 32_768;

/// `kernel.owner_uid_min`'s default: the UID_MIN of most distributions (login.defs).
pub const DEFAULT_OWNER_UID_MIN: u32 = 1000;
/// `kernel.owner_denied_groups`'s default: groups that give root (`root`, `sudo`, `wheel`),
/// the host's logs (`adm`), disks (`disk`), password hashes (`shadow`), or a container or
/// VM runtime, which is root by another name (`docker`, `lxd`, `libvirt`, `kvm`).
pub const DEFAULT_OWNER_DENIED_GROUPS: [&str; 10] =
    ["root", "sudo", "wheel", "adm", "disk", "shadow", "docker", "lxd", "libvirt", "kvm"];

/// `kernel.user`'s default: a system account made by `scripts/install-deps.sh` and
/// `packaging/notebookos.sysusers`.
pub const DEFAULT_KERNEL_USER: &str = "notebookos-kernel";

impl Default for KernelConfig {
    fn default() -> Self {
        Self {
            python: PathBuf::from("python3"),
            memory_limit_mib: DEFAULT_KERNEL_MEMORY_LIMIT_MIB,
            limit_address_space: false,
            pid_namespace: true,
            user: DEFAULT_KERNEL_USER.to_owned(),
            group: None,
            uid_range: None,
            run_as: RunAs::KernelUser,
            owner_uid_min: DEFAULT_OWNER_UID_MIN,
            owner_denied_groups: DEFAULT_OWNER_DENIED_GROUPS.iter().map(|g| (*g).to_owned()).collect(),
            notebook_dir: None,
            pids_max: 4096,
            prewarm_min: PolicyConfig::default().prewarm_min,
            prewarm_max: PolicyConfig::default().prewarm_max,
            home_quota_mib: DEFAULT_KERNEL_HOME_QUOTA_MIB,
            shm_size_mib: DEFAULT_KERNEL_SHM_SIZE_MIB,
            open_files_max: DEFAULT_KERNEL_OPEN_FILES_MAX,
            nproc_max: DEFAULT_KERNEL_NPROC_MAX,
            max_message_bytes: DEFAULT_KERNEL_MAX_MESSAGE_BYTES,
        }
    }
}

impl KernelConfig {
    /// `[kernel]`: what the text alone shows (the accounts are looked up at start,
    /// `kernel::identity`).
    pub(super) fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        let invalid =
            |field: &'static str, reason: String| ConfigError::Invalid { origin: origin.to_owned(), field, reason };
        let k = self;
        if k.user.is_empty() || k.user == "root" {
            return Err(invalid("kernel.user", format!("must name an unprivileged account, got {:?}", k.user)));
        }
        if k.group.as_deref().is_some_and(|g| g.is_empty() || g == "root") {
            return Err(invalid("kernel.group", "must name an unprivileged group (or be unset)".into()));
        }
        if let Some([first, last]) = k.uid_range {
            if first == 0 {
                return Err(invalid("kernel.uid_range", "must not include uid 0 (root)".into()));
            }
            if first > last {
                return Err(invalid("kernel.uid_range", format!("[{first}, {last}] is empty (first > last)")));
            }
            if last >= u32::MAX - 1 {
                return Err(invalid("kernel.uid_range", format!("{last} is not a usable uid")));
            }
        }
        if k.run_as == RunAs::Owner && k.uid_range.is_some() {
            return Err(invalid(
                "kernel.run_as",
                "\"owner\" runs each kernel as its owner's account, kernel.uid_range as a uid of its own: \
                 set one of them (unset kernel.uid_range for run_as = \"owner\")"
                    .into(),
            ));
        }
        // 0 would let uid 0 through this rule (root is refused anyway, but the key says what it allows).
        if k.owner_uid_min == 0 {
            return Err(invalid("kernel.owner_uid_min", "must be at least 1 (uid 0 is root)".into()));
        }
        if k.owner_denied_groups.iter().any(|g| g.is_empty()) {
            return Err(invalid("kernel.owner_denied_groups", "an empty name is no group".into()));
        }
        if k.prewarm_max > 0 && k.prewarm_min > k.prewarm_max {
            return Err(invalid(
                "kernel.prewarm_min",
                format!("{} exceeds kernel.prewarm_max = {}", k.prewarm_min, k.prewarm_max),
            ));
        }
        if k.prewarm_max > 64 {
            return Err(invalid("kernel.prewarm_max", format!("{} is more than 64 idle Pythons", k.prewarm_max)));
        }
        // Below 1 MiB an ordinary plot would kill its kernel; above 1 GiB one message of
        // each of a host's kernels could exhaust it.
        const MIB: u64 = 1 << 20;
        if !(MIB..=1024 * MIB).contains(&k.max_message_bytes) {
            return Err(invalid(
                "kernel.max_message_bytes",
                format!("{} is outside 1 MiB ..= 1 GiB (1048576 ..= 1073741824)", k.max_message_bytes),
            ));
        }
        // ext4 needs a few MiB of its own; below 64 MiB a home holds nothing useful.
        if k.home_quota_mib != 0 && !(64..=1 << 30).contains(&k.home_quota_mib) {
            return Err(invalid(
                "kernel.home_quota_mib",
                format!("{} is outside 64 ..= 1073741824 MiB (0: no quota)", k.home_quota_mib),
            ));
        }
        if k.shm_size_mib > 1 << 30 {
            return Err(invalid("kernel.shm_size_mib", format!("{} MiB is more than any host has", k.shm_size_mib)));
        }
        // ipykernel alone holds ~30 descriptors (ZMQ sockets, logs); above the kernel's
        // fs.nr_open default (1048576) setrlimit fails and no kernel would start.
        if k.open_files_max != 0 && !(256..=1 << 20).contains(&k.open_files_max) {
            return Err(invalid(
                "kernel.open_files_max",
                format!("{} is outside 256 ..= 1048576 (0: the daemon's own)", k.open_files_max),
            ));
        }
        // Python and ipykernel start a dozen threads; below 64 no kernel would start.
        if k.nproc_max != 0 && k.nproc_max < 64 {
            return Err(invalid("kernel.nproc_max", format!("{} is below 64 (0: the daemon's own)", k.nproc_max)));
        }
        if let Some(d) = &k.notebook_dir {
            if !d.is_absolute() {
                return Err(invalid("kernel.notebook_dir", format!("must be an absolute path, got {}", d.display())));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;

    #[test]
    fn kernel_ranges_are_checked() {
        for (text, field) in [
            ("[kernel]\nhome_quota_mib = 8\n", "kernel.home_quota_mib"),
            ("[kernel]\nshm_size_mib = 2000000000\n", "kernel.shm_size_mib"),
            ("[kernel]\nopen_files_max = 16\n", "kernel.open_files_max"),
            ("[kernel]\nopen_files_max = 2000000\n", "kernel.open_files_max"),
            ("[kernel]\nnproc_max = 10\n", "kernel.nproc_max"),
            ("[kernel]\nrun_as = \"owner\"\nuid_range = [200000, 200999]\n", "kernel.run_as"),
            ("[kernel]\nowner_uid_min = 0\n", "kernel.owner_uid_min"),
            ("[kernel]\nowner_denied_groups = [\"\"]\n", "kernel.owner_denied_groups"),
        ] {
            let err = Config::parse(text, "t.toml").expect_err(text);
            assert!(err.to_string().contains(field), "{text}: {err}");
        }
    }

    #[test]
    fn run_as_names_the_kernel_user_or_the_owner() {
        use super::RunAs;
        let c = Config::parse("[kernel]\nrun_as = \"owner\"\n", "t.toml").expect("owner");
        assert_eq!(c.kernel.run_as, RunAs::Owner);
        let c = Config::parse("", "t.toml").expect("default");
        assert_eq!(c.kernel.run_as, RunAs::KernelUser, "today's behaviour by default");
        assert_eq!(c.kernel.owner_uid_min, 1000);
        assert!(["sudo", "adm", "disk", "docker"].iter().all(|g| c.kernel.owner_denied_groups.iter().any(|d| d == g)));
        let c = Config::parse("[kernel]\nowner_uid_min = 500\nowner_denied_groups = []\n", "t.toml").expect("set");
        assert_eq!((c.kernel.owner_uid_min, c.kernel.owner_denied_groups.len()), (500, 0));
        let err = Config::parse("[kernel]\nrun_as = \"root\"\n", "t.toml").expect_err("unknown");
        assert!(err.to_string().contains("run_as"), "{err}");
    }
}
