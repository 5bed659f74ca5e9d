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
        GpuDriver::Nvidia => Err(InventoryError::NvidiaUnavailable(
            "NVML inventory is not in this build yet (cuda-shim work, issue 4)".to_owned(),
        )),
        GpuDriver::Auto => {
            tracing::info!("no GPU driver support in this build yet; running with no GPUs");
            Ok(Inventory { source: "none".to_owned(), gpus: Vec::new() })
        }
    }
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
    fn none_driver_has_no_gpus() {
        let cfg = GpuConfig { driver: GpuDriver::None, ..GpuConfig::default() };
        assert!(discover(&cfg).expect("none").gpus.is_empty());
    }
}
