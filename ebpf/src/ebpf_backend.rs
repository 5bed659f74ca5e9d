//! The eBPF backend: loads `bpf/observer.bpf.c`'s object, attaches the uprobes and the exit
//! tracepoint, and reads the per-process map.

use std::num::NonZeroU32;

use aya::maps::{HashMap as BpfHashMap, MapData, MapError, PerCpuArray, RingBuf};
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope};
use aya::programs::{BtfTracePoint, UProbe};
use aya::{Btf, Ebpf, EbpfLoader};

use crate::bpf_abi::RawActivity;
use crate::driver_library::DriverLibrary;
use crate::error::ObserverError;

/// The compiled object, built by `build.rs`.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/observer.bpf.o"));

const UPROBE_PROGRAM: &str = "nbos_cuda_call";
const EXIT_PROGRAM: &str = "nbos_process_exit";
const EXIT_TRACEPOINT: &str = "sched_process_exit";
const IOCTL_PROGRAM: &str = "nbos_sys_enter";
const SYSCALL_TRACEPOINT: &str = "sys_enter";

/// Loaded and attached programs plus the maps user space reads.
pub(crate) struct EbpfBackend {
    /// Owns the programs; dropping it detaches every probe (aya's links are owned by programs).
    _bpf: Ebpf,
    activity: BpfHashMap<MapData, u32, RawActivity>,
    watched: BpfHashMap<MapData, u32, u8>,
    exit_drops: PerCpuArray<MapData, u64>,
    /// Number of uprobes attached, for the start-up log line.
    pub probes: usize,
}

impl EbpfBackend {
    /// Loads the programs, attaches the exit tracepoint and one uprobe per probe site.
    /// On any failure everything attached so far is detached when the `Ebpf` is dropped.
    /// `ioctl_devices`: kernel device numbers for the optional ioctl probe, `None` to leave it out.
    pub(crate) fn load(
        libraries: &[DriverLibrary],
        max_processes: u32,
        ioctl_devices: Option<&[u32]>,
    ) -> Result<(Self, RingBuf<MapData>), ObserverError> {
        let btf = Btf::from_sys_fs().map_err(|e| ObserverError::Load(format!("reading kernel BTF: {e}")))?;
        let mut bpf = EbpfLoader::new()
            .btf(Some(&btf))
            .map_max_entries("activity", max_processes)
            .map_max_entries("watched", max_processes)
            .load(OBJECT)
            .map_err(|e| ObserverError::Load(load_error(&e)))?;

        let exit: &mut BtfTracePoint = program(&mut bpf, EXIT_PROGRAM)?;
        exit.load(EXIT_TRACEPOINT, &btf).map_err(|e| ObserverError::Load(format!("{EXIT_PROGRAM}: {e}")))?;
        exit.attach().map_err(|e| ObserverError::Attach { what: EXIT_TRACEPOINT.into(), reason: e.to_string() })?;

        let uprobe: &mut UProbe = program(&mut bpf, UPROBE_PROGRAM)?;
        uprobe.load().map_err(|e| ObserverError::Load(format!("{UPROBE_PROGRAM}: {e}")))?;
        let mut probes = 0;
        for lib in libraries {
            for site in &lib.sites {
                let point = UProbeAttachPoint {
                    location: UProbeAttachLocation::AbsoluteOffset(site.file_offset),
                    cookie: Some(site.entry.cookie()),
                };
                uprobe.attach(point, &lib.path, UProbeScope::AllProcesses).map_err(|e| ObserverError::Attach {
                    what: format!("uprobe on {} in {}", site.entry.symbol, lib.path.display()),
                    reason: e.to_string(),
                })?;
                probes += 1;
            }
        }

        if let Some(devices) = ioctl_devices {
            let mut map: BpfHashMap<&mut MapData, u32, u8> = BpfHashMap::try_from(
                bpf.map_mut("gpu_devices")
                    .ok_or(ObserverError::Map { map: "gpu_devices", reason: "missing from the object".into() })?,
            )
            .map_err(map_err("gpu_devices"))?;
            for &dev in devices {
                map.insert(dev, 1, 0).map_err(map_err("gpu_devices"))?;
            }
            let ioctl: &mut BtfTracePoint = program(&mut bpf, IOCTL_PROGRAM)?;
            ioctl.load(SYSCALL_TRACEPOINT, &btf).map_err(|e| ObserverError::Load(format!("{IOCTL_PROGRAM}: {e}")))?;
            ioctl
                .attach()
                .map_err(|e| ObserverError::Attach { what: SYSCALL_TRACEPOINT.into(), reason: e.to_string() })?;
        }

        let activity = BpfHashMap::try_from(take_map(&mut bpf, "activity")?).map_err(map_err("activity"))?;
        let watched = BpfHashMap::try_from(take_map(&mut bpf, "watched")?).map_err(map_err("watched"))?;
        let exit_drops = PerCpuArray::try_from(take_map(&mut bpf, "exit_drops")?).map_err(map_err("exit_drops"))?;
        let exits = RingBuf::try_from(take_map(&mut bpf, "exits")?).map_err(map_err("exits"))?;
        Ok((Self { _bpf: bpf, activity, watched, exit_drops, probes }, exits))
    }

    /// The activity entry of `pid`, if it made any probed call.
    pub(crate) fn activity(&self, pid: u32) -> Result<Option<RawActivity>, ObserverError> {
        match self.activity.get(&pid, 0) {
            Ok(a) => Ok(Some(a)),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(map_err("activity")(e)),
        }
    }

    /// Every tracked process.
    pub(crate) fn all(&self) -> Vec<(u32, RawActivity)> {
        // An entry deleted by the exit program between the key walk and the lookup shows up as an
        // error; it is simply gone, so errors are skipped.
        self.activity.iter().filter_map(Result::ok).collect()
    }

    /// Exit events the kernel could not queue because the ring buffer was full, since load.
    pub(crate) fn exit_drops(&self) -> Result<u64, ObserverError> {
        let per_cpu = self.exit_drops.get(&0, 0).map_err(map_err("exit_drops"))?;
        Ok(per_cpu.iter().copied().fold(0u64, u64::saturating_add))
    }

    /// Pids in the `watched` map.
    pub(crate) fn watched_pids(&self) -> Vec<u32> {
        self.watched.keys().filter_map(Result::ok).collect()
    }

    /// Removes `pid` from the `watched` map (absent is fine).
    pub(crate) fn unwatch(&mut self, pid: u32) {
        let _ = self.watched.remove(&pid);
    }

    /// Asks the exit program to report `pid`'s exit even if it never touches the GPU.
    pub(crate) fn watch(&mut self, pid: NonZeroU32) -> Result<(), ObserverError> {
        self.watched.insert(pid.get(), 1, 0).map_err(map_err("watched"))
    }
}

/// A load error with its causes, plus what is usually missing.
fn load_error(e: &dyn std::error::Error) -> String {
    format!("{} (needs root, or CAP_BPF and CAP_PERFMON, and kernel BTF)", crate::error::with_sources(e))
}

fn program<'a, T>(bpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, ObserverError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let p =
        bpf.program_mut(name).ok_or_else(|| ObserverError::Load(format!("program {name} missing from the object")))?;
    p.try_into().map_err(|e: aya::programs::ProgramError| ObserverError::Load(format!("program {name}: {e}")))
}

fn take_map(bpf: &mut Ebpf, name: &'static str) -> Result<aya::maps::Map, ObserverError> {
    bpf.take_map(name).ok_or(ObserverError::Map { map: name, reason: "missing from the object".into() })
}

fn map_err(map: &'static str) -> impl Fn(MapError) -> ObserverError {
    move |e| ObserverError::Map { map, reason: e.to_string() }
}
