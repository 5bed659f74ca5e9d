//! Which GPUs this host has.

use serde::{Deserialize, Serialize};

use crate::config::{GpuConfig, GpuDriver};

/// One GPU of this host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// Index on this host (the driver's ordinal).
    pub index: u32,
    /// The driver's UUID (`GPU-…`); stable across reboots, used in leases.
    pub uuid: String,
    /// Model name.
    pub name: String,
    /// Total memory, MiB.
    pub memory_mib: u64,
    /// True for a GPU simulated by the fake-cuda TEST DOUBLE.
    pub simulated: bool,
}

/// The GPUs of this host and where that knowledge came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inventory {
    /// `"nvidia"`, `"fake"` or `"none"`.
    pub source: String,
    /// The GPUs.
    pub gpus: Vec<GpuInfo>,
}

/// Why the inventory could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    /// `gpu.driver = "nvidia"` but the driver is not usable.
    #[error("gpu.driver = \"nvidia\" but the NVIDIA driver is not usable here: {0}")]
    NvidiaUnavailable(String),
}

/// UUID of simulated GPU `index`: fixed, so state and logs are reproducible.
pub fn fake_gpu_uuid(index: u32) -> String {
    format!("GPU-fa4e0000-0000-4000-8000-{index:012x}")
}

/// Takes the inventory the config asks for.
pub fn discover(cfg: &GpuConfig) -> Result<Inventory, InventoryError> {
    match cfg.driver {
        GpuDriver::Fake => Ok(Inventory {
            source: "fake".to_owned(),
            gpus: (0..cfg.fake_gpus)
                .map(|index| GpuInfo {
                    index,
                    uuid: fake_gpu_uuid(index),
                    name: "Simulated GPU (fake-cuda test double)".to_owned(),
                    memory_mib: cfg.fake_gpu_memory_mib,
                    simulated: true,
                })
                .collect(),
        }),
        GpuDriver::None => Ok(Inventory { source: "none".to_owned(), gpus: Vec::new() }),
        GpuDriver::Nvidia => nvml_inventory(None).map_err(InventoryError::NvidiaUnavailable),
        GpuDriver::Auto => match nvml_inventory(None) {
            Ok(inv) => Ok(inv),
            Err(e) => {
                tracing::info!(reason = %e, "no usable NVIDIA driver; running with no GPUs");
                Ok(Inventory { source: "none".to_owned(), gpus: Vec::new() })
            }
        },
    }
}

/// Lists GPUs through NVML (`libnvidia-ml.so.1`, or the library at `lib`, e.g. the
/// fake-cuda TEST DOUBLE, which carries an NVML subset). A host without the driver
/// gives an error, never a panic.
pub fn nvml_inventory(lib: Option<&std::path::Path>) -> Result<Inventory, String> {
    use nvml_wrapper::Nvml;
    let nvml = match lib {
        Some(p) => Nvml::builder().lib_path(p.as_os_str()).init(),
        None => Nvml::init(),
    }
    .map_err(|e| format!("NVML init: {e}"))?;
    let n = nvml.device_count().map_err(|e| format!("NVML device count: {e}"))?;
    let mut gpus = Vec::new();
    for index in 0..n {
        let d = nvml.device_by_index(index).map_err(|e| format!("NVML device {index}: {e}"))?;
        let uuid = d.uuid().map_err(|e| format!("NVML device {index} UUID: {e}"))?;
        let name = d.name().unwrap_or_else(|_| "NVIDIA GPU".to_owned());
        let memory = d.memory_info().map_err(|e| format!("NVML device {index} memory: {e}"))?;
        let simulated = uuid.starts_with("GPU-fa4e0000-");
        gpus.push(GpuInfo { index, uuid, name, memory_mib: memory.total >> 20, simulated });
    }
    Ok(Inventory { source: if lib.is_some() { "nvml-library" } else { "nvidia" }.to_owned(), gpus })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_inventory_has_the_configured_gpus_with_distinct_uuids() {
        let cfg =
            GpuConfig { driver: GpuDriver::Fake, fake_gpus: 3, fake_gpu_memory_mib: 1024, ..GpuConfig::default() };
        let inv = discover(&cfg).expect("fake inventory");
        assert_eq!(inv.source, "fake");
        assert_eq!(inv.gpus.len(), 3);
        assert!(inv.gpus.iter().all(|g| g.simulated && g.memory_mib == 1024));
        let mut uuids: Vec<_> = inv.gpus.iter().map(|g| g.uuid.clone()).collect();
        uuids.dedup();
        assert_eq!(uuids.len(), 3);
    }

    #[test]
    fn nvml_inventory_lists_the_fake_cuda_nvml_gpus_with_the_fake_inventory_uuids() {
        // The fake-cuda TEST DOUBLE (a dev-dependency) sits next to this test binary.
        let Some(lib) = std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(|d| d.join("libfake_cuda.so")))
            .filter(|p| p.exists())
        else {
            panic!("libfake_cuda.so not built next to the test binary");
        };
        // Default fake-cuda config: 2 GPUs of 1024 MiB (the env of this test process is not set).
        let inv = nvml_inventory(Some(&lib)).expect("fake NVML");
        assert_eq!(inv.gpus.len(), 2);
        assert_eq!(inv.gpus[1].uuid, fake_gpu_uuid(1));
        assert_eq!(inv.gpus[0].memory_mib, 1024);
        assert!(inv.gpus.iter().all(|g| g.simulated));
    }

    #[test]
    fn missing_nvml_library_is_an_error_not_a_panic() {
        let e = nvml_inventory(Some(std::path::Path::new("/nonexistent/libnvidia-ml.so.1"))).expect_err("no library");
        assert!(e.contains("NVML init"), "{e}");
    }

    #[test]
    fn none_driver_has_no_gpus() {
        let cfg = GpuConfig { driver: GpuDriver::None, ..GpuConfig::default() };
        assert!(discover(&cfg).expect("none").gpus.is_empty());
    }
}
