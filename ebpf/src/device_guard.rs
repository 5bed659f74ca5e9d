//! GPU device access of kernel processes, enforced in the kernel: loads
//! `bpf/device_guard.bpf.c` (a `BPF_PROG_TYPE_CGROUP_DEVICE` program), attaches it to each
//! kernel's cgroup (cgroup v2) and keeps its map of allowed GPU minors per cgroup.
//!
//! Policy (in the C program): char major 195 (NVIDIA) is narrowed to `/dev/nvidiactl` (minor
//! 255) and the GPU minors the cgroup's entry allows; every other device is left to whatever
//! else governs the cgroup (the program is attached by a BPF link, which runs alongside the
//! ancestors' device programs, as `BPF_F_ALLOW_MULTI` does). A cgroup with no entry (one below a kernel's) gets
//! no GPU minor at all.
//!
//! ```no_run
//! let mut guard = nbos_ebpf::DeviceGuard::load(4096)?;
//! let cg = guard.attach(std::path::Path::new("/sys/fs/cgroup/unified/notebookos/k"))?;
//! guard.allow(cg, &[0])?; // lease of GPU minor 0 granted
//! guard.allow(cg, &[])?; // released
//! guard.detach(cg)?;
//! # Ok::<(), nbos_ebpf::DeviceGuardError>(())
//! ```

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use aya::maps::{HashMap as BpfHashMap, MapData, MapError, PerCpuArray};
use aya::programs::cgroup_device::CgroupDeviceLinkId;
use aya::programs::{CgroupAttachMode, CgroupDevice};
use aya::{Ebpf, EbpfLoader};

use crate::error::with_sources;

/// The compiled object, built by `build.rs`.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/device_guard.bpf.o"));

const PROGRAM: &str = "nbos_device_guard";
const ALLOWED_MAP: &str = "gpu_minors";
const DENIALS_MAP: &str = "denials";

/// The NVIDIA driver's fixed char major (`/dev/nvidia0`.., `/dev/nvidiactl`).
pub const NVIDIA_MAJOR: u32 = 195;
/// `/dev/nvidiactl`'s minor: always allowed (the driver's control node holds no GPU).
pub const NVIDIACTL_MINOR: u32 = 255;
/// GPU minors the map can name: `0..MAX_MINORS` (the driver numbers GPUs from 0).
pub const MAX_MINORS: u32 = 256;
const MINOR_WORDS: usize = 4;

/// A cgroup v2 directory's id, as `bpf_get_current_cgroup_id()` reports it (its inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CgroupId(pub u64);

/// A failed device-guard operation, naming what failed.
#[derive(Debug, thiserror::Error)]
pub enum DeviceGuardError {
    /// Loading the program failed (no permission, kernel without BPF cgroup-device support).
    #[error("loading the GPU device guard (eBPF cgroup device program): {0}")]
    Load(String),
    /// The cgroup directory cannot be opened or is not a cgroup v2 directory.
    #[error("cgroup {path}: {source}")]
    Cgroup {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Attaching to, or detaching from, a cgroup failed.
    #[error("attaching the GPU device guard to cgroup {path}: {reason}")]
    Attach {
        /// The cgroup directory.
        path: PathBuf,
        /// The kernel's or aya's answer.
        reason: String,
    },
    /// Reading or writing a map failed.
    #[error("GPU device guard map {map}: {reason}")]
    Map {
        /// The map's name.
        map: &'static str,
        /// The error.
        reason: String,
    },
    /// A GPU minor the map cannot hold.
    #[error("GPU device minor {0} is out of range (0..{MAX_MINORS})")]
    MinorOutOfRange(u32),
    /// `allow` or `detach` for a cgroup the guard is not attached to.
    #[error("the GPU device guard is not attached to cgroup id {0}")]
    NotAttached(u64),
}

/// `struct nbos_gpu_minors` of `bpf/device_guard.h`: bit `m` set = GPU minor `m` allowed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RawGpuMinors {
    bits: [u64; MINOR_WORDS],
}

// SAFETY: `RawGpuMinors` is `repr(C)` and made only of `u64`s (no padding), so every bit
// pattern is a valid value.
unsafe impl aya::Pod for RawGpuMinors {}

impl RawGpuMinors {
    /// The bitmap of `minors`; [`NVIDIACTL_MINOR`] is allowed by the program itself and may be
    /// left out.
    pub(crate) fn of(minors: &[u32]) -> Result<Self, DeviceGuardError> {
        let mut v = Self::default();
        for &m in minors {
            if m >= MAX_MINORS {
                return Err(DeviceGuardError::MinorOutOfRange(m));
            }
            v.bits[(m / 64) as usize] |= 1u64 << (m % 64);
        }
        Ok(v)
    }

    /// Whether minor `m` is allowed.
    pub(crate) fn allows(&self, m: u32) -> bool {
        m < MAX_MINORS && self.bits[(m / 64) as usize] & (1u64 << (m % 64)) != 0
    }
}

/// The id of the cgroup v2 directory `dir`.
pub fn cgroup_id(dir: &Path) -> Result<CgroupId, DeviceGuardError> {
    let meta = std::fs::metadata(dir).map_err(|source| DeviceGuardError::Cgroup { path: dir.to_owned(), source })?;
    Ok(CgroupId(meta.ino()))
}

/// The loaded program, its maps, and the cgroups it is attached to. Dropping it detaches the
/// program from every cgroup (the links are owned here).
pub struct DeviceGuard {
    bpf: Ebpf,
    allowed: BpfHashMap<MapData, u64, RawGpuMinors>,
    denials: PerCpuArray<MapData, u64>,
    attached: HashMap<CgroupId, (PathBuf, CgroupDeviceLinkId)>,
}

impl std::fmt::Debug for DeviceGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceGuard").field("attached", &self.attached.len()).finish_non_exhaustive()
    }
}

impl DeviceGuard {
    /// Loads the program (not attached anywhere yet); at most `max_cgroups` cgroups at once.
    pub fn load(max_cgroups: u32) -> Result<Self, DeviceGuardError> {
        let mut bpf = EbpfLoader::new()
            .map_max_entries(ALLOWED_MAP, max_cgroups.max(1))
            .load(OBJECT)
            .map_err(|e| DeviceGuardError::Load(with_sources(&e)))?;
        program(&mut bpf)?.load().map_err(|e| DeviceGuardError::Load(with_sources(&e)))?;
        let allowed = BpfHashMap::try_from(take_map(&mut bpf, ALLOWED_MAP)?).map_err(map_err(ALLOWED_MAP))?;
        let denials = PerCpuArray::try_from(take_map(&mut bpf, DENIALS_MAP)?).map_err(map_err(DENIALS_MAP))?;
        Ok(Self { bpf, allowed, denials, attached: HashMap::new() })
    }

    /// Attaches the program to the cgroup v2 directory `dir`, with no GPU minor allowed yet.
    /// Attaching again to the same cgroup is a no-op.
    pub fn attach(&mut self, dir: &Path) -> Result<CgroupId, DeviceGuardError> {
        let file =
            std::fs::File::open(dir).map_err(|source| DeviceGuardError::Cgroup { path: dir.to_owned(), source })?;
        let id = CgroupId(
            file.metadata().map_err(|source| DeviceGuardError::Cgroup { path: dir.to_owned(), source })?.ino(),
        );
        if self.attached.contains_key(&id) {
            return Ok(id);
        }
        // The entry first: from the moment the program runs, the cgroup is known (and empty).
        self.allowed.insert(id.0, RawGpuMinors::default(), 0).map_err(map_err(ALLOWED_MAP))?;
        // aya attaches by bpf_link on kernels >= 5.7, and a cgroup link always runs alongside
        // the ancestors' programs (the kernel refuses flags on it): `Single` asks for no flag.
        let link = match program(&mut self.bpf)?.attach(&file, CgroupAttachMode::Single) {
            Ok(link) => link,
            Err(e) => {
                let _ = self.allowed.remove(&id.0);
                return Err(DeviceGuardError::Attach { path: dir.to_owned(), reason: with_sources(&e) });
            }
        };
        self.attached.insert(id, (dir.to_owned(), link));
        Ok(id)
    }

    /// Sets the GPU minors processes of `cgroup` may open (all others of major 195 but
    /// [`NVIDIACTL_MINOR`] are refused with `EPERM`). Takes effect for the next `open`.
    pub fn allow(&mut self, cgroup: CgroupId, minors: &[u32]) -> Result<(), DeviceGuardError> {
        if !self.attached.contains_key(&cgroup) {
            return Err(DeviceGuardError::NotAttached(cgroup.0));
        }
        let value = RawGpuMinors::of(minors)?;
        self.allowed.insert(cgroup.0, value, 0).map_err(map_err(ALLOWED_MAP))
    }

    /// The GPU minors `cgroup` may open now, as the map says.
    pub fn allowed(&self, cgroup: CgroupId) -> Result<Vec<u32>, DeviceGuardError> {
        match self.allowed.get(&cgroup.0, 0) {
            Ok(v) => Ok((0..MAX_MINORS).filter(|m| v.allows(*m)).collect()),
            Err(MapError::KeyNotFound) => Err(DeviceGuardError::NotAttached(cgroup.0)),
            Err(e) => Err(map_err(ALLOWED_MAP)(e)),
        }
    }

    /// Detaches the program from `cgroup` and forgets its entry (absent is fine).
    pub fn detach(&mut self, cgroup: CgroupId) -> Result<(), DeviceGuardError> {
        let Some((path, link)) = self.attached.remove(&cgroup) else { return Ok(()) };
        let _ = self.allowed.remove(&cgroup.0);
        program(&mut self.bpf)?
            .detach(link)
            .map_err(|e| DeviceGuardError::Attach { path, reason: format!("detaching: {}", with_sources(&e)) })
    }

    /// Cgroups the program is attached to now.
    pub fn attached(&self) -> usize {
        self.attached.len()
    }

    /// NVIDIA device accesses the program refused since it was loaded.
    pub fn denials(&self) -> Result<u64, DeviceGuardError> {
        let per_cpu = self.denials.get(&0, 0).map_err(map_err(DENIALS_MAP))?;
        Ok(per_cpu.iter().copied().fold(0u64, u64::saturating_add))
    }
}

fn program(bpf: &mut Ebpf) -> Result<&mut CgroupDevice, DeviceGuardError> {
    let p = bpf.program_mut(PROGRAM).ok_or_else(|| DeviceGuardError::Load(format!("program {PROGRAM} missing")))?;
    p.try_into().map_err(|e: aya::programs::ProgramError| DeviceGuardError::Load(format!("program {PROGRAM}: {e}")))
}

fn take_map(bpf: &mut Ebpf, name: &'static str) -> Result<aya::maps::Map, DeviceGuardError> {
    bpf.take_map(name).ok_or(DeviceGuardError::Map { map: name, reason: "missing from the object".into() })
}

fn map_err(map: &'static str) -> impl Fn(MapError) -> DeviceGuardError {
    move |e| DeviceGuardError::Map { map, reason: e.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of `#define NAME value` in `bpf/device_guard.h`.
    fn header_define(name: &str) -> u32 {
        let src = include_str!("../bpf/device_guard.h");
        let prefix = format!("#define {name} ");
        let line = src.lines().find_map(|l| l.strip_prefix(prefix.as_str())).unwrap_or_else(|| panic!("{name}"));
        line.trim().parse().unwrap_or_else(|e| panic!("{name} = {line:?}: {e}"))
    }

    #[test]
    fn constants_and_layout_match_the_c_header() {
        assert_eq!(header_define("NBOS_NVIDIA_MAJOR"), NVIDIA_MAJOR);
        assert_eq!(header_define("NBOS_NVIDIACTL_MINOR"), NVIDIACTL_MINOR);
        assert_eq!(header_define("NBOS_MAX_MINORS"), MAX_MINORS);
        assert_eq!(header_define("NBOS_MINOR_WORDS") as usize, MINOR_WORDS);
        assert_eq!(std::mem::size_of::<RawGpuMinors>(), MINOR_WORDS * 8);
    }

    #[test]
    fn minors_become_bits_and_out_of_range_is_refused() {
        let v = RawGpuMinors::of(&[0, 3, 64, 200]).expect("in range");
        assert_eq!(v.bits, [0b1001, 1, 0, 1 << (200 - 192)]);
        assert!(v.allows(3) && v.allows(200) && !v.allows(1) && !v.allows(256));
        assert!(matches!(RawGpuMinors::of(&[256]), Err(DeviceGuardError::MinorOutOfRange(256))));
        assert_eq!(RawGpuMinors::of(&[]).expect("empty"), RawGpuMinors::default());
    }
}
