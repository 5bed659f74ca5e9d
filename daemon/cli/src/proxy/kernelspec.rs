//! `nbos install-kernelspec`: writes a Jupyter kernelspec whose kernel is
//! `nbos kernel-proxy` (with the gateway, credentials files and GPUs to use).

use std::path::PathBuf;

use anyhow::Context;

/// Options of `nbos install-kernelspec`.
#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    /// Name of the installed kernelspec (the directory under `kernels/`).
    #[arg(long, default_value = "notebookos")]
    pub name: String,
    /// Gateway kernelspec the proxy starts.
    #[arg(long, default_value = notebookosd::kernel::spec::DEFAULT_SPEC)]
    pub kernel_name: String,
    /// GPUs per cell (overrides the gateway kernelspec's request).
    #[arg(long)]
    pub gpus: Option<u32>,
    /// Install under PREFIX/share/jupyter/kernels (e.g. a virtualenv) instead of the user's data dir.
    #[arg(long, value_name = "PREFIX", conflicts_with = "kernels_dir")]
    pub prefix: Option<PathBuf>,
    /// Install into exactly this `kernels` directory.
    #[arg(long, value_name = "DIR")]
    pub kernels_dir: Option<PathBuf>,
    /// Gateways of a cluster the proxy fails over between (repeat, or a comma list).
    #[arg(long = "gateway", value_name = "URL", value_delimiter = ',')]
    pub gateways: Vec<String>,
}

/// Writes `kernels/<name>/kernel.json` that runs `nbos kernel-proxy`.
pub fn install_kernelspec(target: &crate::client::ConnectArgs, args: InstallArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.name.is_empty() && args.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)),
        "kernelspec name {:?} must be letters, digits, '-', '_' or '.'",
        args.name
    );
    anyhow::ensure!(
        notebookosd::kernel::spec::gpus_of(&args.kernel_name).is_some(),
        "unknown gateway kernelspec {:?} (see GET /api/kernelspecs)",
        args.kernel_name
    );
    let kernels_dir = match (&args.kernels_dir, &args.prefix) {
        (Some(d), _) => d.clone(),
        (None, Some(p)) => p.join("share/jupyter/kernels"),
        (None, None) => match std::env::var_os("JUPYTER_DATA_DIR") {
            Some(d) => PathBuf::from(d).join("kernels"),
            None => {
                let home = std::env::var_os("HOME").context("HOME is not set; pass --prefix or --kernels-dir")?;
                PathBuf::from(home).join(".local/share/jupyter/kernels")
            }
        },
    };
    let nbos = std::env::current_exe().context("finding the nbos executable")?;
    let mut argv: Vec<String> = vec![
        nbos.display().to_string(),
        "kernel-proxy".into(),
        "-f".into(),
        "{connection_file}".into(),
        "--kernel-name".into(),
        args.kernel_name.clone(),
    ];
    if let Some(g) = args.gpus {
        argv.extend(["--gpus".into(), g.to_string()]);
    }
    if let Some(u) = &target.url {
        argv.extend(["--url".into(), u.clone()]);
    }
    if !args.gateways.is_empty() {
        argv.extend(["--gateway".into(), args.gateways.join(",")]);
    }
    // The global --token-file: the proxy reads it (the token itself never goes into kernel.json).
    if let Some(f) = &target.token_file {
        let abs = std::path::absolute(f).with_context(|| format!("resolving {}", f.display()))?;
        argv.extend(["--token-file".into(), abs.display().to_string()]);
    }
    // An https:// gateway: the kernel's proxy needs the same CA (and client certificate).
    for (flag, file) in
        [("--ca-cert", &target.ca_cert), ("--client-cert", &target.client_cert), ("--client-key", &target.client_key)]
    {
        if let Some(f) = file {
            let abs = std::path::absolute(f).with_context(|| format!("resolving {}", f.display()))?;
            argv.extend([flag.into(), abs.display().to_string()]);
        }
    }
    let gpus = args.gpus.or_else(|| notebookosd::kernel::spec::gpus_of(&args.kernel_name)).unwrap_or(0);
    let spec = serde_json::json!({
        "argv": argv,
        "display_name": format!("NotebookOS ({}, {gpus} GPU per cell)", args.kernel_name),
        "language": "python",
        "interrupt_mode": "signal",
        "metadata": { "notebookos": { "gpus": gpus, "gateway_kernelspec": args.kernel_name } },
    });
    let dir = kernels_dir.join(&args.name);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let file = dir.join("kernel.json");
    std::fs::write(&file, serde_json::to_string_pretty(&spec)?)
        .with_context(|| format!("writing {}", file.display()))?;
    println!("installed kernelspec {} in {}", args.name, dir.display());
    Ok(())
}
