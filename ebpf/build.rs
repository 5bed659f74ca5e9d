//! Compiles the C BPF programs in `bpf/` with clang (`-O2 -g -target bpf`, CO-RE) into
//! `$OUT_DIR/observer.bpf.o`, `$OUT_DIR/device_guard.bpf.o` and `$OUT_DIR/pool_guard.bpf.o`,
//! which `src/ebpf_backend.rs`, `src/device_guard.rs` and `src/pool_guard.rs` embed.
//! `vmlinux.h` is generated from the build machine's kernel BTF with bpftool; relocations are
//! resolved against the running kernel's BTF at load time, so the object runs on other kernels too.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const INSTALL_HINT: &str = "apt-get install clang libbpf-dev bpftool (the Makefile's `deps` target does this)";

fn main() {
    if let Err(e) = build() {
        // A build script reports failure by exiting non-zero; the message is what the user sees.
        eprintln!("error: building the eBPF programs failed: {e}");
        std::process::exit(1);
    }
}

fn build() -> Result<(), String> {
    let out = PathBuf::from(env::var("OUT_DIR").map_err(|e| format!("OUT_DIR: {e}"))?);
    let bpf_dir =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|e| format!("CARGO_MANIFEST_DIR: {e}"))?).join("bpf");
    for f in ["observer.bpf.c", "observer.h", "device_guard.bpf.c", "device_guard.h", "pool_guard.bpf.c"] {
        println!("cargo:rerun-if-changed={}", bpf_dir.join(f).display());
    }
    println!("cargo:rerun-if-env-changed=NBOS_VMLINUX_H");
    println!("cargo:rerun-if-env-changed=CLANG");

    let vmlinux = vmlinux_header(&out)?;
    let arch = match env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("x86_64") => "x86",
        Ok("aarch64") => "arm64",
        Ok(other) => return Err(format!("no BPF register mapping for target arch {other}")),
        Err(e) => return Err(format!("CARGO_CFG_TARGET_ARCH: {e}")),
    };
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_owned());
    for program in ["observer", "device_guard", "pool_guard"] {
        let source = bpf_dir.join(format!("{program}.bpf.c"));
        let object = out.join(format!("{program}.bpf.o"));
        let status = Command::new(&clang)
            .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
            .arg(format!("-D__TARGET_ARCH_{arch}"))
            .arg("-I")
            .arg(vmlinux.parent().unwrap_or(&out))
            .arg("-I")
            .arg(&bpf_dir)
            .arg("-c")
            .arg(&source)
            .arg("-o")
            .arg(&object)
            .status()
            .map_err(|e| format!("running {clang}: {e}; install it: {INSTALL_HINT}"))?;
        if !status.success() {
            return Err(format!(
                "{clang} failed on bpf/{program}.bpf.c ({status}); if <bpf/bpf_helpers.h> is missing: {INSTALL_HINT}"
            ));
        }
    }
    Ok(())
}

/// `vmlinux.h` from `$NBOS_VMLINUX_H`, else dumped from `/sys/kernel/btf/vmlinux` by bpftool.
fn vmlinux_header(out: &Path) -> Result<PathBuf, String> {
    if let Ok(given) = env::var("NBOS_VMLINUX_H") {
        let given = PathBuf::from(given);
        let dir = out.join("vmlinux-given");
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let dst = dir.join("vmlinux.h");
        std::fs::copy(&given, &dst).map_err(|e| format!("copying NBOS_VMLINUX_H={}: {e}", given.display()))?;
        return Ok(dst);
    }
    let btf = Path::new("/sys/kernel/btf/vmlinux");
    if !btf.exists() {
        return Err(format!(
            "{} is missing (kernel without CONFIG_DEBUG_INFO_BTF); set NBOS_VMLINUX_H to a vmlinux.h \
             generated on a machine with BTF",
            btf.display()
        ));
    }
    let dst = out.join("vmlinux.h");
    let output = Command::new("bpftool")
        .args(["btf", "dump", "file"])
        .arg(btf)
        .args(["format", "c"])
        .output()
        .map_err(|e| format!("running bpftool: {e}; install it: {INSTALL_HINT}"))?;
    if !output.status.success() {
        return Err(format!(
            "bpftool btf dump failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    std::fs::write(&dst, &output.stdout).map_err(|e| format!("writing {}: {e}", dst.display()))?;
    Ok(dst)
}
