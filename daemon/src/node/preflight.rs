//! The files a configuration names, checked before anything starts: `notebookosd
//! --check-config` runs this after parsing, and so does every start, so a refused file is
//! exit 2 with its reason (the unit's `RestartPreventExitStatus=2` then stops the restart
//! loop) instead of exit 1 from half-way through the start.
//!
//! What is checked: the token files exist, hold a token, and are not writable by others;
//! TLS certificates and keys parse, each key matches its certificate, and the cluster's
//! node certificate chains to its CA; the GPU driver library (`nvidia` or `fake`, or
//! `auto` when one is found) and the CUDA shim are there and the driver loads; a shared
//! directory object store (`file://`) can be written (the unit's `ProtectSystem=strict`
//! makes one outside the daemon's own directories read-only unless a drop-in opens it).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::Context;

use crate::config::{Config, GpuDriver};
use crate::kernel::shim_env;
use crate::link::{tls, token};
use crate::sys::dynamic_library;

/// Every check above; the error names the config key and the file.
pub fn check(config: &Config) -> anyhow::Result<()> {
    for (key, path) in [
        ("http.token_file", config.http.token_file.as_deref()),
        ("http.operator_token_file", config.http.operator_token_file.as_deref()),
        ("auth.jupyterhub_token_file", config.auth.jupyterhub_token_file.as_deref()),
    ] {
        if let Some(p) = path {
            secret(p).with_context(|| format!("{key} = {}", p.display()))?;
            token::read_token_file(p).with_context(|| format!("{key} = {}", p.display()))?;
        }
    }
    if let Some(t) = &config.http.tls {
        secret(&t.key).with_context(|| format!("http.tls.key = {}", t.key.display()))?;
        tls::server_config(&t.cert, &t.key, t.client_ca.as_deref())
            .context("http.tls: the certificate, its key (they must match) or the client CA")?;
    }
    if let Some(t) = config.cluster.tls.as_ref().filter(|_| config.cluster.enabled) {
        secret(&t.key).with_context(|| format!("cluster.tls.key = {}", t.key.display()))?;
        tls::server_config(&t.cert, &t.key, Some(&t.ca_cert))
            .context("cluster.tls: the node certificate, its key (they must match) or the CA")?;
        let files = tls::TlsFiles { ca_cert: t.ca_cert.clone(), cert: t.cert.clone(), key: t.key.clone() };
        let cert = files.end_entity_cert()?;
        anyhow::ensure!(
            tls::chains_to(&cert, &t.ca_cert)?,
            "cluster.tls.cert = {} is not signed by cluster.tls.ca_cert = {} (or has expired): \
             the other hosts would refuse it",
            t.cert.display(),
            t.ca_cert.display()
        );
    }
    if config.cluster.enabled {
        if let Some(dir) = config.cluster.object_store.strip_prefix("file://") {
            writable_dir(Path::new(dir))
                .with_context(|| format!("cluster.object_store = {}", config.cluster.object_store))?;
        }
    }
    gpu_libraries(config)
}

/// A directory the daemon will write in, or the nearest existing one above it (it creates
/// the rest): writable by this process as it runs now (its uid, its sandbox's read-only mounts).
fn writable_dir(dir: &Path) -> anyhow::Result<()> {
    use nix::unistd::{access, AccessFlags};
    let existing = dir.ancestors().find(|d| d.exists()).unwrap_or(Path::new("/"));
    match access(existing, AccessFlags::W_OK | AccessFlags::X_OK) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EROFS) => anyhow::bail!(
            "{} is on a read-only file system here: under the unit's ProtectSystem=strict a shared store needs a \
             drop-in (`systemctl edit notebookosd`: [Service] ReadWritePaths={})",
            existing.display(),
            dir.display()
        ),
        Err(e) => anyhow::bail!("{} is not writable by the daemon: {e}", existing.display()),
    }
}

/// A secret (token, private key): a regular file nobody else may write or replace: owned by
/// root or the daemon's account, not group- or world-writable, in a directory likewise (or a
/// sticky one, where others cannot rename it away).
fn secret(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).context("no such file, or not readable")?;
    anyhow::ensure!(meta.is_file(), "not a regular file");
    let me = nix::unistd::geteuid().as_raw();
    let trusted = |uid: u32| uid == 0 || uid == me;
    anyhow::ensure!(
        trusted(meta.uid()),
        "owned by uid {}, who can change it (chown root, or the daemon's account)",
        meta.uid()
    );
    let mode = meta.permissions().mode() & 0o7777;
    anyhow::ensure!(
        mode & 0o022 == 0,
        "mode {mode:04o} lets other accounts change it (chmod 600 and chown root, or 640 with the daemon's group)"
    );
    let dir = std::path::absolute(path)?.parent().map(Path::to_path_buf).unwrap_or_else(|| "/".into());
    let dmeta = std::fs::metadata(&dir).with_context(|| format!("reading its directory {}", dir.display()))?;
    let dmode = dmeta.permissions().mode() & 0o7777;
    anyhow::ensure!(
        trusted(dmeta.uid()) && (dmode & 0o022 == 0 || dmode & 0o1000 != 0),
        "its directory {} (uid {}, mode {dmode:04o}) lets other accounts replace it",
        dir.display(),
        dmeta.uid()
    );
    if mode & 0o004 != 0 {
        // Before logging starts (this runs first): stderr, which the journal keeps.
        eprintln!("notebookosd: warning: {} (mode {mode:04o}) is a secret every account can read", path.display());
    }
    Ok(())
}

/// The driver library and the shim kernels need, where GPUs are configured.
fn gpu_libraries(config: &Config) -> anyhow::Result<()> {
    let gpu = &config.gpu;
    let driver = match gpu.driver {
        GpuDriver::Nvidia | GpuDriver::Fake => shim_env::find_driver(gpu)?,
        // Without a driver, `auto` runs with no GPUs: nothing to check.
        GpuDriver::Auto => match shim_env::find_driver(gpu) {
            Ok(p) => p,
            Err(_) => return Ok(()),
        },
        GpuDriver::None => return Ok(()),
    };
    loads(&driver).with_context(|| format!("the CUDA driver {}", driver.display()))?;
    shim_env::find_shim(gpu).map(|_| ())
}

/// `dlopen` of `lib` succeeds (lazily, locally: nothing is called, nothing stays loaded;
/// only the library's own initialisers run, as they do in every kernel).
fn loads(lib: &Path) -> anyhow::Result<()> {
    let handle = dynamic_library::open(lib, libc::RTLD_LAZY | libc::RTLD_LOCAL)
        .map_err(|why| anyhow::anyhow!("does not load: {why}"))?;
    dynamic_library::close(handle);
    Ok(())
}
