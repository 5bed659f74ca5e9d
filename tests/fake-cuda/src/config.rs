//! The simulated GPUs, from the environment (read once per process).

use std::path::PathBuf;
use std::sync::OnceLock;

/// Default number of simulated GPUs.
pub const DEFAULT_GPUS: u32 = 2;
/// Default memory of each simulated GPU, MiB.
pub const DEFAULT_MEMORY_MIB: u64 = 1024;
/// Cap on `FAKE_CUDA_GPUS`, so a typo cannot create a million ledgers.
pub const MAX_GPUS: u32 = 64;

/// One simulated GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeGpu {
    /// Ordinal (`CUdevice`).
    pub index: u32,
    /// The 16 UUID bytes.
    pub uuid: [u8; 16],
    /// Capacity, bytes.
    pub memory_bytes: u64,
}

/// The simulated machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The GPUs.
    pub gpus: Vec<FakeGpu>,
    /// Where the per-GPU capacity ledgers live (shared by all processes using the same GPUs).
    pub state_dir: PathBuf,
}

/// UUID bytes of simulated GPU `index`: `fa4e0000-0000-4000-8000-<index>` (matches the daemon's fake inventory).
pub fn uuid_bytes(index: u32) -> [u8; 16] {
    let mut u = [0xfa, 0x4e, 0, 0, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, 0];
    u[12..16].copy_from_slice(&index.to_be_bytes());
    u
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, the form NVML and `nvidia-smi` print.
pub fn uuid_string(u: &[u8; 16]) -> String {
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

impl Config {
    /// Reads `FAKE_CUDA_GPUS` (capped at [`MAX_GPUS`]), `FAKE_CUDA_GPU_MEMORY_MIB`,
    /// `FAKE_CUDA_STATE_DIR`.
    pub fn from_env() -> Self {
        let n = env_number("FAKE_CUDA_GPUS", u64::from(DEFAULT_GPUS)).min(u64::from(MAX_GPUS)) as u32;
        let mib = env_number("FAKE_CUDA_GPU_MEMORY_MIB", DEFAULT_MEMORY_MIB);
        let state_dir = std::env::var_os("FAKE_CUDA_STATE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| std::env::temp_dir().join(format!("fake-cuda-{}", current_uid())));
        let gpus = (0..n).map(|index| FakeGpu { index, uuid: uuid_bytes(index), memory_bytes: mib << 20 }).collect();
        Self { gpus, state_dir }
    }
}

/// A numeric setting; an unparsable value is reported on stderr (a driver has no other
/// channel) and the default used.
fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Err(_) => default,
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            eprintln!("fake-cuda (test double): {name}={v:?} is not a number; using {default}");
            default
        }),
    }
}

fn current_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// This process's configuration.
pub fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(Config::from_env)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_string_matches_daemon_format() {
        assert_eq!(uuid_string(&uuid_bytes(3)), "GPU-fa4e0000-0000-4000-8000-000000000003");
    }
}
