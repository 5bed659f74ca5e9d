//! Finding the CUDA driver libraries to probe and the file offsets of their entry points.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use object::{Object, ObjectSection, ObjectSymbol};

use crate::entry_points::EntryPoint;
use crate::error::ObserverError;

/// Largest driver library we read into memory (the real libcuda.so is ~30-100 MiB). A named,
/// commented cap because the path comes from config.
const MAX_LIBRARY_BYTES: u64 = 1 << 30;

/// Where NVIDIA's installer and distribution packages put the driver, after `ldconfig -p`.
const WELL_KNOWN_PATHS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/usr/lib64/libcuda.so.1",
    "/usr/lib/aarch64-linux-gnu/libcuda.so.1",
    "/usr/local/nvidia/lib64/libcuda.so.1",
    "/usr/lib/wsl/lib/libcuda.so.1",
];

/// One probe site: an entry point at a file offset.
#[derive(Clone, Debug)]
pub(crate) struct ProbeSite {
    pub entry: EntryPoint,
    pub file_offset: u64,
}

/// A driver library and the entry points found in it.
#[derive(Clone, Debug)]
pub(crate) struct DriverLibrary {
    pub path: PathBuf,
    pub sites: Vec<ProbeSite>,
}

/// Checks each configured path, or discovers the driver when none is configured.
pub(crate) fn resolve(configured: &[PathBuf], wanted: &[EntryPoint]) -> Result<Vec<DriverLibrary>, ObserverError> {
    if !configured.is_empty() {
        return configured.iter().map(|p| inspect(p, wanted)).collect();
    }
    let mut found = Vec::new();
    for path in discover() {
        match inspect(&path, wanted) {
            Ok(lib) => found.push(lib),
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "skipping discovered CUDA driver library"),
        }
    }
    Ok(found)
}

/// Driver libraries on this host: `ldconfig -p` entries for `libcuda.so.1`, then well-known
/// paths; symlinks resolved and duplicates dropped (a uprobe belongs to an inode).
pub(crate) fn discover() -> Vec<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    match Command::new("ldconfig").arg("-p").output() {
        Ok(out) if out.status.success() => {
            candidates.extend(parse_ldconfig(&String::from_utf8_lossy(&out.stdout)));
        }
        Ok(out) => tracing::debug!(status = %out.status, "ldconfig -p failed"),
        Err(e) => tracing::debug!(error = %e, "ldconfig not runnable"),
    }
    candidates.extend(WELL_KNOWN_PATHS.iter().map(PathBuf::from));
    let mut seen = Vec::new();
    for c in candidates {
        if let Ok(real) = std::fs::canonicalize(&c) {
            if !seen.contains(&real) {
                seen.push(real);
            }
        }
    }
    seen
}

/// Paths of `libcuda.so.1` in `ldconfig -p` output (`\tlibcuda.so.1 (libc6,x86-64) => /path`).
pub(crate) fn parse_ldconfig(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| {
            let (name, rest) = line.trim().split_once(' ')?;
            if name != "libcuda.so.1" {
                return None;
            }
            let (_, path) = rest.split_once("=> ")?;
            Some(PathBuf::from(path.trim()))
        })
        .collect()
}

/// Reads the library's dynamic symbols and maps the wanted entry points to file offsets.
/// Aliases (two names at one address) are probed once, under the first name in `wanted`.
pub(crate) fn inspect(path: &Path, wanted: &[EntryPoint]) -> Result<DriverLibrary, ObserverError> {
    let lib_err = |reason: String| ObserverError::Library { path: path.to_owned(), reason };
    let meta = std::fs::metadata(path).map_err(|e| lib_err(e.to_string()))?;
    if !meta.is_file() {
        return Err(lib_err("not a regular file".into()));
    }
    if meta.len() > MAX_LIBRARY_BYTES {
        return Err(lib_err(format!("larger than {MAX_LIBRARY_BYTES} bytes")));
    }
    let data = std::fs::read(path).map_err(|e| lib_err(e.to_string()))?;
    let file = object::File::parse(&*data).map_err(|e| lib_err(format!("not an ELF shared library: {e}")))?;

    let mut by_name: BTreeMap<&str, u64> = BTreeMap::new();
    for sym in file.dynamic_symbols() {
        if !sym.is_definition() {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        let Some(section) = sym.section_index().and_then(|i| file.section_by_index(i).ok()) else {
            continue;
        };
        let Some((section_offset, _)) = section.file_range() else { continue };
        let Ok(aya::programs::uprobe::UProbeAttachLocation::AbsoluteOffset(offset)) =
            aya::programs::uprobe::UProbeAttachLocation::from_virtual_address(
                sym.address(),
                section.address(),
                section_offset,
            )
        else {
            continue;
        };
        by_name.insert(name, offset);
    }

    let mut sites: Vec<ProbeSite> = Vec::new();
    for entry in wanted {
        let Some(&file_offset) = by_name.get(entry.symbol) else { continue };
        if let Some(first) = sites.iter().find(|s| s.file_offset == file_offset) {
            tracing::debug!(symbol = entry.symbol, alias_of = first.entry.symbol, "alias probed once");
            continue;
        }
        sites.push(ProbeSite { entry: *entry, file_offset });
    }
    if sites.is_empty() {
        return Err(lib_err("exports none of the CUDA driver entry points the observer probes".into()));
    }
    Ok(DriverLibrary { path: path.to_owned(), sites })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldconfig_lines_give_libcuda_paths_only() {
        let text = "1234 libs found in cache `/etc/ld.so.cache'\n\
            \tlibcudart.so.12 (libc6,x86-64) => /usr/lib/libcudart.so.12\n\
            \tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1\n\
            \tlibcuda.so (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so\n";
        assert_eq!(parse_ldconfig(text), vec![PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so.1")]);
    }

    #[test]
    fn missing_library_error_names_the_path() {
        let err = inspect(Path::new("/nonexistent/libcuda.so.1"), crate::entry_points::ENTRY_POINTS).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/libcuda.so.1"), "{err}");
    }

    #[test]
    fn non_elf_and_directory_are_refused_with_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("libcuda.so.1");
        std::fs::write(&text, b"not a library").unwrap();
        let err = inspect(&text, crate::entry_points::ENTRY_POINTS).unwrap_err().to_string();
        assert!(err.contains(&text.display().to_string()) && err.contains("not an ELF"), "{err}");
        let err = inspect(dir.path(), crate::entry_points::ENTRY_POINTS).unwrap_err().to_string();
        assert!(err.contains(&dir.path().display().to_string()) && err.contains("not a regular file"), "{err}");
    }

    #[test]
    fn elf_without_cuda_symbols_is_refused() {
        // The test binary itself is an ELF file without CUDA entry points.
        let me = std::env::current_exe().unwrap();
        let err = inspect(&me, crate::entry_points::ENTRY_POINTS).unwrap_err().to_string();
        assert!(err.contains("exports none"), "{err}");
    }
}
