//! The kernels hosted here, by id.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::RwLock;

use super::binding::Binder;
use super::cgroup::{self, KernelCgroup, Limits};
use super::device_cgroup::SharedDeviceCgroups;
use super::identity::{self, KernelUsers};
use super::local_kernel::{KernelModel, LocalKernel};
use super::prewarm::{PoolSettings, PrewarmPool};
use super::process::{LaunchSpec, PrepareHook, ProcessSource};
use super::sockets::MessageCap;
use super::spec;
use crate::config::KernelConfig;
use crate::jupyter::Channel;
use crate::metrics::{Metrics, OutcomeLabels};

/// The GPU memory limit a kernel's request environment names, MiB (`None`: none, or
/// not a valid one, which creation refuses).
pub fn gpu_memory_mib_of(env: &std::collections::BTreeMap<String, String>) -> Option<u64> {
    env.get(GPU_MEMORY_ENV).and_then(|v| parse_gpu_memory_mib(v).ok())
}

/// Why a kernel could not be created.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// No such kernelspec.
    #[error("no such kernelspec: {0}")]
    UnknownSpec(String),
    /// A GPU request that is not a small non-negative integer.
    #[error("invalid GPU request: {0}")]
    BadGpuRequest(String),
    /// The host cannot take another kernel asking for GPUs.
    #[error("{0}")]
    Refused(nbos_sched::Refusal),
    /// The id is not a kernel id (a canonical UUID, see [`super::id`]).
    #[error("not a kernel id: {0:?}")]
    BadKernelId(String),
    /// `kernel.run_as = "owner"` and the kernel cannot run as its owner: none, no such
    /// account, root's, the pool's (the message names the account and `kernel.run_as`).
    #[error("{0}")]
    Owner(super::owner_account::OwnerError),
    /// The process did not start.
    #[error("the kernel failed to start: {0:#}")]
    Start(anyhow::Error),
}

/// Upper bound on GPUs one kernel may ask for per cell (more than any host has).
pub const MAX_GPUS_PER_KERNEL: u32 = 64;

/// The kernel-request variable naming the device memory each of the kernel's processes
/// may allocate, MiB (a `KERNEL_*` variable, as Enterprise Gateway clients pass
/// `KERNEL_GPUS`; `POST /api/kernels` also takes it as `gpu_memory_mib`).
pub const GPU_MEMORY_ENV: &str = "KERNEL_GPU_MEMORY_MIB";
/// What the daemon sets for the CUDA shim from [`GPU_MEMORY_ENV`], bytes.
pub const SHIM_MEMORY_LIMIT_ENV: &str = "NBOS_GPU_MEMORY_LIMIT_BYTES";
/// Largest GPU memory limit accepted, MiB: 32 TiB, more than 64 GPUs of 512 GiB
/// ([`MAX_GPUS_PER_KERNEL`] of anything built), so a larger number is a mistake.
pub const MAX_GPU_MEMORY_MIB: u64 = 32 << 20;

/// A GPU memory limit from a kernel request, MiB: a whole number in
/// `1..=`[`MAX_GPU_MEMORY_MIB`]; the error says what was wrong, for a 400.
pub fn parse_gpu_memory_mib(value: &str) -> Result<u64, String> {
    let v = value.trim();
    let mib: i128 = v.parse().map_err(|_| format!("{GPU_MEMORY_ENV} must be a whole number of MiB, got {value:?}"))?;
    if mib < 1 {
        return Err(format!("{GPU_MEMORY_ENV} must be at least 1 MiB, got {v}"));
    }
    u64::try_from(mib).ok().filter(|m| *m <= MAX_GPU_MEMORY_MIB).ok_or_else(|| {
        format!("{GPU_MEMORY_ENV} = {v} MiB is more than any GPU set has (at most {MAX_GPU_MEMORY_MIB} MiB)")
    })
}

/// A short name for this host among others on the same machine: from its kernels
/// directory and machine id, so it is the same after a restart (which then finds its old cgroups).
pub(crate) fn host_tag(kernels_dir: &std::path::Path) -> String {
    use sha2::Digest;
    // The machine's id too: machines (containers, chroots) that share one cgroup tree and
    // the packaged paths must not take each other's kernels' cgroups for their own.
    let machine = std::fs::read("/etc/machine-id").unwrap_or_default();
    let mut h = sha2::Sha256::new();
    h.update(kernels_dir.as_os_str().as_encoded_bytes());
    h.update(machine.trim_ascii());
    hex::encode(&h.finalize()[..4])
}

/// How a started kernel is kept, and whose it is.
struct StartOptions<'a> {
    /// A death starts a new process (single-host kernels; a cluster's supervisor replaces
    /// its replicas itself).
    auto_restart: bool,
    /// The user who owns the kernel (the single-host API's caller, a replica's kernel
    /// record's owner; `None` without users).
    owner: Option<&'a crate::users::User>,
}

/// The kernels of this host.
pub struct Kernels {
    map: RwLock<HashMap<String, Arc<LocalKernel>>>,
    python: PathBuf,
    dir: PathBuf,
    extra_env: Vec<(String, String)>,
    metrics: Arc<Metrics>,
    binder: Arc<Binder>,
    memory_limit_bytes: Option<u64>,
    /// What each kernel's cgroups bound (memory, processes).
    limits: Limits,
    /// Cgroups per kernel: bound the kernel's process tree by `limits`.
    cgroup: Arc<dyn KernelCgroup>,
    /// The accounts kernels run as (never root).
    users: Arc<KernelUsers>,
    /// Who owns each kernel, for the binder's fair share (`None`: every kernel anonymous).
    owners: Option<Arc<super::fair_share::KernelOwners>>,
    /// Working directory of every kernel (`kernel.notebook_dir`); `None`: its own directory.
    notebook_dir: Option<PathBuf>,
    /// Told every kernel process pid (the observer watches them for exits).
    process_watch: Option<ProcessWatch>,
    /// The GPU device guard's cgroup per kernel (`gpu.device_guard = "ebpf"`).
    device_cgroups: Option<SharedDeviceCgroups>,
    prewarm: Option<Arc<PrewarmPool>>,
    max_message: MessageCap,
}

/// Called with every kernel process started (kernel id, pid).
pub type ProcessWatch = Arc<dyn Fn(&str, u32) + Send + Sync>;

impl Kernels {
    /// Kernels run with `python` and keep their files under `dir`.
    pub fn new(
        python: PathBuf,
        dir: PathBuf,
        extra_env: Vec<(String, String)>,
        metrics: Arc<Metrics>,
        binder: Arc<Binder>,
        memory_limit_mib: u64,
    ) -> Self {
        // Kernels run in their own directory, where a relative interpreter path
        // (`.venv/bin/python`) would not resolve; a bare name is looked up in PATH.
        let python =
            if python.components().count() > 1 { std::path::absolute(&python).unwrap_or(python) } else { python };
        let memory_limit_bytes = (memory_limit_mib > 0).then(|| memory_limit_mib.saturating_mul(1024 * 1024));
        // The shipped defaults (kernel.user, kernel.pids_max) until `with_accounts` says otherwise.
        let defaults = KernelConfig::default();
        let users = KernelUsers::resolve(&defaults, identity::daemon_is_root()).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "no kernel account: kernels will not start while the daemon is root");
            KernelUsers::daemon_user()
        });
        let mut kernels = Self {
            cgroup: Arc::new(cgroup::NoCgroup),
            limits: Limits::default(),
            users: Arc::new(users),
            owners: None,
            notebook_dir: None,
            map: RwLock::new(HashMap::new()),
            python,
            dir,
            extra_env,
            metrics,
            binder,
            memory_limit_bytes,
            process_watch: None,
            device_cgroups: None,
            prewarm: None,
            max_message: MessageCap::default(),
        };
        kernels.set_limits(defaults.pids_max);
        kernels
    }

    /// Tells `owners` each kernel's owner as it starts, and forgets it with the kernel (the
    /// binder's fair share reads it).
    #[must_use]
    pub fn with_owners(mut self, owners: Arc<super::fair_share::KernelOwners>) -> Self {
        self.owners = Some(owners);
        self
    }

    /// Kernels run as `users` (never root), in `notebook_dir` (`None`: each in its own
    /// directory), with at most `pids_max` processes each (0: no limit; root only).
    #[must_use]
    pub fn with_accounts(mut self, users: KernelUsers, notebook_dir: Option<PathBuf>, pids_max: u64) -> Self {
        self.users = Arc::new(users);
        self.notebook_dir = notebook_dir;
        self.set_limits(pids_max);
        self
    }

    /// The cgroup limits and the backend that enforces them (none without a limit).
    fn set_limits(&mut self, pids_max: u64) {
        // A pids cgroup needs root; a daemon that is not root runs kernels as before.
        let pids_max = (pids_max > 0 && self.users.switches_user()).then_some(pids_max);
        let limits = Limits { memory_bytes: self.memory_limit_bytes, pids_max };
        let had_any = self.limits != Limits::default();
        let has_any = limits != Limits::default();
        if has_any && (!had_any || self.cgroup.backend() == "none") {
            self.cgroup = Arc::new(cgroup::Scoped::new(cgroup::detect_host(), host_tag(&self.dir)));
        } else if !has_any {
            self.cgroup = Arc::new(cgroup::NoCgroup);
        }
        self.limits = limits;
    }

    /// The largest message the daemon takes from a kernel's sockets (`kernel.max_message_bytes`).
    #[must_use]
    pub fn with_max_message_bytes(mut self, bytes: usize) -> Self {
        self.max_message = MessageCap(bytes);
        self
    }

    /// The accounts kernels run as.
    pub fn users(&self) -> &Arc<KernelUsers> {
        &self.users
    }

    /// Puts every kernel started from now on in a device cgroup with the GPU device guard.
    #[must_use]
    pub fn with_device_cgroups(mut self, device_cgroups: SharedDeviceCgroups) -> Self {
        self.device_cgroups = Some(device_cgroups);
        self
    }

    /// Keeps a pool of `min`..=`max` pre-warmed kernel processes that new kernels take
    /// over (`max == 0`: none). Not with an account per kernel (`kernel.uid_range`): a
    /// pre-warmed process must be started as its kernel's account before the kernel is
    /// known. Call after [`Self::with_accounts`]; needs a tokio runtime.
    pub fn with_prewarm(mut self, min: u32, max: u32) -> anyhow::Result<Self> {
        // With run_as = "owner" the pool's processes start as kernel.user and switch to
        // their kernel's owner when taken.
        let switching = self.users.switching_pool_identity();
        let identity = match (self.users.common_identity(), &switching) {
            (Some(identity), _) => identity,
            (None, Some(pool)) => Some(pool.clone()),
            (None, None) => {
                if max > 0 {
                    tracing::info!("kernel.uid_range gives every kernel its own account: no pre-warm pool");
                }
                return Ok(self);
            }
        };
        let settings = PoolSettings {
            python: self.python.clone(),
            kernels_dir: self.dir.clone(),
            env: self.extra_env.clone(),
            identity,
            switch_to_owner: switching.is_some(),
            memory_limit_bytes: self.memory_limit_bytes,
            min,
            max,
        };
        self.prewarm = PrewarmPool::start(settings, self.metrics.clone())?;
        Ok(self)
    }

    /// The pre-warm pool, if there is one.
    pub fn prewarm(&self) -> Option<&Arc<PrewarmPool>> {
        self.prewarm.as_ref()
    }

    /// Calls `watch` with every kernel process started from now on.
    #[must_use]
    pub fn with_process_watch(mut self, watch: ProcessWatch) -> Self {
        self.process_watch = Some(watch);
        self
    }

    /// Per-cell GPU binding of this host.
    pub fn binder(&self) -> &Arc<Binder> {
        &self.binder
    }

    /// Starts a kernel of spec `name` (default when `None`) for `owner` (the user who
    /// creates it; `None` without users); `gpus` overrides the spec's request. Its process
    /// is restarted when it dies (see [`Kernel::set_auto_restart`]).
    pub async fn create(
        &self,
        name: Option<&str>,
        gpus: Option<u32>,
        env: &[(String, String)],
        owner: Option<&crate::users::User>,
    ) -> Result<Arc<LocalKernel>, CreateError> {
        self.start_kernel(
            &uuid::Uuid::new_v4().to_string(),
            0,
            name,
            gpus,
            env,
            StartOptions { auto_restart: true, owner },
        )
        .await
    }

    /// Starts replica `replica` of kernel `id` here: the cluster's supervisor uses the
    /// kernel's cluster-wide id, so every host serves it under the same id. Refused
    /// when a kernel with that id is already hosted. A replica whose process dies is
    /// shown `dead`, not restarted: the supervisor replaces it and it catches up.
    /// `owner` is the kernel record's (`KernelRecord::owner`).
    pub async fn create_replica(
        &self,
        id: &str,
        replica: u32,
        name: Option<&str>,
        gpus: Option<u32>,
        env: &[(String, String)],
        owner: Option<&crate::users::User>,
    ) -> Result<Arc<LocalKernel>, CreateError> {
        self.start_kernel(id, replica, name, gpus, env, StartOptions { auto_restart: false, owner }).await
    }

    /// Whether a kernel of `owner` could run here as configured (`kernel.run_as`): a
    /// creation checks it before recording a cluster kernel, so the client is told at
    /// once rather than by replicas that never start.
    pub fn check_owner(&self, owner: Option<&str>) -> Result<(), CreateError> {
        self.users.acquire_for_check(owner).map_err(CreateError::Owner)
    }

    async fn start_kernel(
        &self,
        id: &str,
        replica: u32,
        name: Option<&str>,
        gpus: Option<u32>,
        env: &[(String, String)],
        options: StartOptions<'_>,
    ) -> Result<Arc<LocalKernel>, CreateError> {
        let StartOptions { auto_restart, owner } = options;
        // Before anything else: the id becomes the kernel's directory and cgroup name.
        if !super::id::is_kernel_id(id) {
            return Err(CreateError::BadKernelId(id.chars().take(64).collect()));
        }
        if self.map.read().await.contains_key(id) {
            return Err(CreateError::Start(anyhow::anyhow!("kernel {id} is already hosted here")));
        }
        let id = id.to_owned();
        let name = name.unwrap_or(spec::DEFAULT_SPEC);
        let spec_gpus = spec::gpus_of(name).ok_or_else(|| CreateError::UnknownSpec(name.to_owned()))?;
        let gpus = gpus.unwrap_or(spec_gpus);
        if gpus > MAX_GPUS_PER_KERNEL {
            return Err(CreateError::BadGpuRequest(format!("{gpus} > {MAX_GPUS_PER_KERNEL}")));
        }
        let gpu_memory_mib = match env.iter().rev().find(|(k, _)| k == GPU_MEMORY_ENV) {
            Some((_, v)) => Some(parse_gpu_memory_mib(v).map_err(CreateError::BadGpuRequest)?),
            None => None,
        };
        self.binder.would_admit(gpus).map_err(CreateError::Refused)?;
        let mut all_env = self.extra_env.clone();
        all_env.extend(env.iter().cloned());
        if let Some(mib) = gpu_memory_mib {
            // The shim's clamp: every device allocation of every process of the kernel
            // (forked workers, subprocesses) is held to it (cuda-shim/README.md).
            all_env.push((SHIM_MEMORY_LIMIT_ENV.to_owned(), (mib << 20).to_string()));
        }
        all_env.push(("NOTEBOOKOS_KERNEL_ID".to_owned(), id.clone()));
        // Who the CUDA shim tells the lease server it is (checked against SO_PEERCRED).
        all_env.push(("NBOS_KERNEL_ID".to_owned(), id.clone()));
        all_env.push(("NBOS_REPLICA".to_owned(), replica.to_string()));
        all_env.push(("NOTEBOOKOS_GPUS".to_owned(), gpus.to_string()));
        // The account from the owner alone: a client's KERNEL_USERNAME is only a variable.
        let identity = self.users.acquire(&id, owner.map(|u| u.name.as_str())).map_err(|e| match e {
            identity::IdentityError::Owner(e) => CreateError::Owner(e),
            e => CreateError::Start(anyhow::Error::new(e).context("choosing the kernel's account")),
        })?;
        let cgroup_procs = match self.cgroup.create(&id, &self.limits) {
            Ok(p) => p,
            Err(e) => {
                self.remove_cgroup(&id);
                self.users.release(&id);
                return Err(CreateError::Start(anyhow::Error::new(e).context("creating the kernel's cgroups")));
            }
        };
        // Every spawn (restarts too) re-creates the cgroups, which a death removes.
        let prepare = {
            let (cg, limits, id) = (self.cgroup.clone(), self.limits, id.clone());
            PrepareHook(Arc::new(move || {
                cg.create(&id, &limits)
                    .map(drop)
                    .map_err(|e| anyhow::Error::new(e).context("re-creating the kernel's cgroups"))
            }))
        };
        let mut launch = LaunchSpec {
            python: self.python.clone(),
            env: all_env,
            dir: self.dir.join(&id),
            memory_limit_bytes: self.memory_limit_bytes,
            cgroup_procs,
            identity,
            cwd: self.notebook_dir.clone(),
            prepare: Some(prepare),
            prewarm: self.prewarm.clone().map(|p| p as Arc<dyn ProcessSource>),
            max_message: self.max_message,
        };
        if let Some(dc) = &self.device_cgroups {
            // A process is in one v2 cgroup only: share the kernel's v2 cgroup (memory, pids) if it has one.
            let shared = if !launch.cgroup_procs.is_empty() && self.cgroup.backend() == "v2" {
                self.cgroup.dir(&id)
            } else {
                None
            };
            match dc.prepare(&id, shared.as_deref()) {
                // Joined before exec: no code of the kernel runs outside the guard.
                Ok(procs) => launch.cgroup_procs.push(procs),
                Err(e) => {
                    self.remove_cgroup(&id);
                    self.users.release(&id);
                    return Err(CreateError::Start(
                        anyhow::Error::new(e).context("creating the kernel's GPU device cgroup (gpu.device_guard)"),
                    ));
                }
            }
        }
        self.metrics.kernels_started_total.inc();
        let dir = launch.dir.clone();
        let started =
            LocalKernel::start(id.clone(), name.to_owned(), gpus, gpu_memory_mib, launch, self.metrics.clone());
        let kernel = match started.await {
            Ok(k) => k,
            Err(e) => {
                self.remove_cgroup(&id);
                self.users.release(&id);
                // Keep kernel.log for diagnosis; the connection file holds a key, remove it.
                tracing::warn!(kernel = %id, dir = %dir.display(), error = format!("{e:#}"), "kernel failed to start");
                let _ = std::fs::remove_file(dir.join("connection-0.json"));
                return Err(CreateError::Start(e));
            }
        };
        kernel.set_auto_restart(auto_restart);
        if let Some(owner) = owner {
            kernel.set_owner(owner.clone());
            if let Some(book) = &self.owners {
                book.set(&id, owner);
            }
        }
        if let Err(e) = self.binder.add_kernel(&kernel) {
            self.forget_owner(&id);
            kernel.shutdown().await;
            self.remove_cgroup(&id);
            self.users.release(&id);
            return Err(CreateError::Refused(e));
        }
        self.observe(&kernel);
        for pid in kernel.pids() {
            self.binder.process_started(&kernel.id, pid);
            if let Some(w) = &self.process_watch {
                w(&kernel.id, pid);
            }
        }
        self.map.write().await.insert(id.clone(), kernel.clone());
        tracing::info!(kernel = %id, spec = name, gpus, gpu_memory_mib, "kernel started");
        Ok(kernel)
    }

    /// Wires a kernel's messages and death to binding and metrics.
    fn observe(&self, kernel: &Arc<LocalKernel>) {
        let binder = Arc::downgrade(&self.binder);
        let metrics = self.metrics.clone();
        let id = kernel.id.clone();
        let hub = Arc::downgrade(&kernel.hub);
        kernel.hub.set_observer(Box::new(move |channel, msg_type, parent, msg| match (channel, msg_type, parent) {
            (Channel::Shell, "execute_reply", Some(parent)) => {
                let outcome = msg
                    .content_json()
                    .ok()
                    .and_then(|c| c.get("status").and_then(|s| s.as_str()).map(str::to_owned))
                    .unwrap_or_else(|| "unknown".to_owned());
                metrics.cells_total.get_or_create(&OutcomeLabels { outcome }).inc();
                if let Some(b) = binder.upgrade() {
                    b.on_kernel_reply(&id, parent);
                }
            }
            (Channel::Iopub, "execute_input", Some(parent)) => {
                if let Some(waited) = hub.upgrade().and_then(|h| h.take_submitted(parent)) {
                    metrics.interactivity_delay_seconds.observe(waited.as_secs_f64());
                }
            }
            _ => {}
        }));
        let weak = Arc::downgrade(&self.binder);
        kernel.set_restart_hook(Box::new(move |id| {
            if let Some(b) = weak.upgrade() {
                b.reset_kernel(id);
            }
        }));
        let (weak, watch) = (Arc::downgrade(&self.binder), self.process_watch.clone());
        // A restart's new process joined its cgroups before exec (`LaunchSpec::prepare`).
        kernel.set_spawn_hook(Box::new(move |id, pid| {
            if let Some(b) = weak.upgrade() {
                b.process_started(id, pid);
            }
            if let Some(w) = &watch {
                w(id, pid);
            }
        }));
        let binder = Arc::downgrade(&self.binder);
        let cg = self.cgroup.clone();
        let dc = self.device_cgroups.clone();
        kernel.set_exit_hook(Box::new(move |id, pids| {
            // Death or shutdown: the kernel's processes are gone (leftover children are killed).
            if let Err(e) = cg.remove(id) {
                tracing::warn!(kernel = %id, error = %e, "could not remove the kernel's cgroups");
            }
            if let Some(dc) = &dc {
                dc.remove(id);
            }
            if let Some(b) = binder.upgrade() {
                b.remove_kernel(id, pids);
            }
        }));
    }

    /// Removes a kernel's memory cgroup and device cgroup, logging a failure.
    fn forget_owner(&self, id: &str) {
        if let Some(book) = &self.owners {
            book.forget(id);
        }
    }

    fn remove_cgroup(&self, id: &str) {
        if let Err(e) = self.cgroup.remove(id) {
            tracing::warn!(kernel = %id, error = %e, "could not remove the kernel's cgroups");
        }
        if let Some(dc) = &self.device_cgroups {
            dc.remove(id);
        }
    }

    /// The GPU device guard's cgroups, when `gpu.device_guard = "ebpf"`.
    pub fn device_cgroups(&self) -> Option<&SharedDeviceCgroups> {
        self.device_cgroups.as_ref()
    }

    /// The kernel's memory cgroup directory, when a cgroup backend is active.
    pub fn cgroup_dir(&self, id: &str) -> Option<PathBuf> {
        self.memory_limit_bytes.and_then(|_| self.cgroup.dir(id))
    }

    /// The daemon's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Every kernel.
    pub async fn all(&self) -> Vec<Arc<LocalKernel>> {
        self.map.read().await.values().cloned().collect()
    }

    /// A kernel by id.
    pub async fn get(&self, id: &str) -> Option<Arc<LocalKernel>> {
        self.map.read().await.get(id).cloned()
    }

    /// Models of all kernels, oldest id order is not promised.
    pub async fn list(&self) -> Vec<KernelModel> {
        let kernels: Vec<_> = self.map.read().await.values().cloned().collect();
        let mut out = Vec::with_capacity(kernels.len());
        for k in kernels {
            out.push(k.model().await);
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// Number of kernels.
    pub async fn len(&self) -> usize {
        self.map.read().await.len()
    }

    /// True when no kernel is hosted.
    pub async fn is_empty(&self) -> bool {
        self.len().await == 0
    }

    /// Shuts a kernel down and forgets it; false if there was none.
    pub async fn remove(&self, id: &str) -> bool {
        let Some(k) = self.map.write().await.remove(id) else { return false };
        k.shutdown().await;
        // The exit hook already removed it unless a death took the hook first; idempotent.
        self.remove_cgroup(id);
        // Its files are gone: the uid may go to another kernel.
        self.users.release(id);
        self.forget_owner(id);
        tracing::info!(kernel = %id, "kernel shut down");
        true
    }

    /// Shuts every kernel down (daemon exit).
    pub async fn shutdown_all(&self) {
        if let Some(pool) = &self.prewarm {
            pool.shutdown().await;
        }
        let all: Vec<_> = self.map.write().await.drain().map(|(_, k)| k).collect();
        let stops = all.iter().map(|k| k.shutdown());
        futures_util::future::join_all(stops).await;
        for k in &all {
            self.remove_cgroup(&k.id);
            self.users.release(&k.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_replica_id_that_is_not_a_uuid_is_refused_before_any_file_is_made() {
        let tmp = tempfile::tempdir().expect("tmp");
        let metrics = Arc::new(Metrics::new());
        let leases = Arc::new(super::super::binding::LogOnlyLeases);
        let binder = Binder::new(0, std::time::Duration::from_secs(60), 2.0, leases, metrics.clone());
        // A python that does not exist: nothing may get as far as starting one.
        let kernels =
            Kernels::new("/nonexistent/python".into(), tmp.path().join("kernels"), Vec::new(), metrics, binder, 0);
        for id in ["..", "../x", "", "a/b", "NOT-A-UUID"] {
            let e = kernels.create_replica(id, 1, None, None, &[], None).await.err();
            assert!(matches!(e, Some(CreateError::BadKernelId(_))), "{id:?}: {e:?}");
        }
        assert_eq!(std::fs::read_dir(tmp.path()).expect("tmp").count(), 0, "files were made");
        assert!(kernels.list().await.is_empty());
    }

    #[test]
    fn gpu_memory_requests_are_whole_positive_sane_mib() {
        assert_eq!(parse_gpu_memory_mib("2048"), Ok(2048));
        assert_eq!(parse_gpu_memory_mib(" 1 "), Ok(1));
        for (bad, says) in [
            ("0", "at least 1 MiB"),
            ("-5", "at least 1 MiB"),
            ("1.5", "whole number"),
            ("lots", "whole number"),
            ("", "whole number"),
            ("99999999999999999999999", "more than any GPU set has"),
        ] {
            let e = parse_gpu_memory_mib(bad).expect_err(bad);
            assert!(e.contains(says) && e.contains(GPU_MEMORY_ENV), "{bad}: {e}");
        }
        assert!(parse_gpu_memory_mib(&(MAX_GPU_MEMORY_MIB + 1).to_string()).is_err());
    }
}
