//! The kernelspecs the daemon offers, and the GPU request each carries.

use serde::Serialize;

/// The kernelspec clients get when they ask for none.
pub const DEFAULT_SPEC: &str = "python3";

/// GPU counts offered as `notebookos-python-{n}gpu` kernelspecs.
const GPU_VARIANTS: [u32; 4] = [1, 2, 4, 8];

/// One kernelspec as the Kernel Gateway API returns it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelSpecModel {
    /// Spec name.
    pub name: String,
    /// The spec itself (`kernel.json`).
    pub spec: serde_json::Value,
    /// Resource files (logos); none are shipped.
    pub resources: serde_json::Map<String, serde_json::Value>,
}

/// GPUs a spec asks for per cell, or `None` for an unknown spec.
pub fn gpus_of(name: &str) -> Option<u32> {
    match name {
        "python3" | "notebookos-python" => Some(0),
        _ => {
            let n: u32 = name.strip_prefix("notebookos-python-")?.strip_suffix("gpu")?.parse().ok()?;
            GPU_VARIANTS.contains(&n).then_some(n)
        }
    }
}

/// All specs.
pub fn all() -> Vec<KernelSpecModel> {
    let mut names = vec![DEFAULT_SPEC.to_owned(), "notebookos-python".to_owned()];
    names.extend(GPU_VARIANTS.iter().map(|n| format!("notebookos-python-{n}gpu")));
    names.into_iter().filter_map(|n| get(&n)).collect()
}

/// One spec by name.
pub fn get(name: &str) -> Option<KernelSpecModel> {
    let gpus = gpus_of(name)?;
    let display_name = match (name, gpus) {
        ("python3", _) => "Python 3 (NotebookOS)".to_owned(),
        (_, 0) => "Python 3 (NotebookOS, no GPU)".to_owned(),
        (_, 1) => "Python 3 (NotebookOS, 1 GPU per cell)".to_owned(),
        (_, n) => format!("Python 3 (NotebookOS, {n} GPUs per cell)"),
    };
    Some(KernelSpecModel {
        name: name.to_owned(),
        spec: serde_json::json!({
            "argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": display_name,
            "language": "python",
            "interrupt_mode": "signal",
            "env": {},
            "metadata": { "notebookos": { "gpus": gpus }, "debugger": false },
        }),
        resources: serde_json::Map::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_counts_come_from_the_name() {
        assert_eq!(gpus_of("python3"), Some(0));
        assert_eq!(gpus_of("notebookos-python-4gpu"), Some(4));
        assert_eq!(gpus_of("notebookos-python-3gpu"), None);
        assert_eq!(gpus_of("r"), None);
        let specs = all();
        assert!(specs.iter().any(|s| s.name == DEFAULT_SPEC));
        let one = specs.iter().find(|s| s.name == "notebookos-python-1gpu").expect("1gpu");
        assert_eq!(one.spec["metadata"]["notebookos"]["gpus"], 1);
    }
}
