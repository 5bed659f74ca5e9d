//! How much GPU memory a process holds, from NVML's per-process accounting
//! (`nvmlDeviceGetComputeRunningProcesses_v3`, what `nvidia-smi` shows): the byte
//! counts of evictions and restores.

use std::path::Path;

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;

/// NVML, opened once (loading and initialising it per eviction would cost milliseconds).
pub struct ProcessGpuMemory {
    nvml: Nvml,
}

impl std::fmt::Debug for ProcessGpuMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessGpuMemory").finish_non_exhaustive()
    }
}

impl ProcessGpuMemory {
    /// Opens `libnvidia-ml.so.1`, or the library at `lib` (e.g. the fake-cuda TEST
    /// DOUBLE, which carries an NVML subset). A host without the driver is an error.
    pub fn open(lib: Option<&Path>) -> Result<Self, String> {
        let nvml = match lib {
            Some(p) => Nvml::builder().lib_path(p.as_os_str()).init(),
            None => Nvml::init(),
        }
        .map_err(|e| format!("NVML init: {e}"))?;
        Ok(Self { nvml })
    }

    /// Bytes `pid` holds on GPU `index`.
    pub fn bytes_on(&self, pid: u32, index: usize) -> Result<u64, String> {
        let i = u32::try_from(index).map_err(|_| format!("NVML device {index}: no such index"))?;
        let d = self.nvml.device_by_index(i).map_err(|e| format!("NVML device {index}: {e}"))?;
        let procs = d.running_compute_processes().map_err(|e| format!("NVML device {index} processes: {e}"))?;
        let mut total = 0u64;
        for p in procs.iter().filter(|p| p.pid == pid) {
            match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => total = total.saturating_add(b),
                UsedGpuMemory::Unavailable => {
                    return Err(format!("NVML device {index}: per-process memory not available"))
                }
            }
        }
        Ok(total)
    }

    /// Bytes `pid` holds, summed over every GPU of the host.
    pub fn bytes_of(&self, pid: u32) -> Result<u64, String> {
        let n = self.nvml.device_count().map_err(|e| format!("NVML device count: {e}"))?;
        let mut total = 0u64;
        for index in 0..n {
            let d = self.nvml.device_by_index(index).map_err(|e| format!("NVML device {index}: {e}"))?;
            let procs = d.running_compute_processes().map_err(|e| format!("NVML device {index} processes: {e}"))?;
            for p in procs.iter().filter(|p| p.pid == pid) {
                match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => total = total.saturating_add(b),
                    UsedGpuMemory::Unavailable => {
                        return Err(format!("NVML device {index}: per-process memory not available"))
                    }
                }
            }
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_nvml_library_is_an_error_not_a_panic() {
        let e = ProcessGpuMemory::open(Some(Path::new("/nonexistent/libnvidia-ml.so.1"))).expect_err("no library");
        assert!(e.contains("NVML init"), "{e}");
    }

    #[test]
    fn a_process_without_gpu_memory_holds_zero_bytes_on_the_fake_cuda_nvml() {
        // The fake-cuda TEST DOUBLE (a dev-dependency) sits next to this test binary.
        let Some(lib) = std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(|d| d.join("libfake_cuda.so")))
            .filter(|p| p.exists())
        else {
            panic!("libfake_cuda.so not built next to the test binary");
        };
        let m = ProcessGpuMemory::open(Some(&lib)).expect("fake NVML");
        assert_eq!(m.bytes_of(std::process::id()).expect("query"), 0);
    }
}
