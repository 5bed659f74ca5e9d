//! The CUDA driver entry points the observer probes, and the attach cookie each one gets.
//!
//! The cookie tells the single BPF uprobe program (`nbos_cuda_call`) what the call is and
//! where its byte count is, see `bpf/observer.h`.

/// What a probed call does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallKind {
    /// Submits a kernel or graph.
    Launch = 1,
    /// Copies memory.
    Copy = 2,
    /// Sets device memory.
    Memset = 3,
    /// Waits for the device.
    Sync = 4,
}

/// Where the call's byte count lives (`enum nbos_bytes_from`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bytes {
    None,
    /// The n-th integer argument, 1-based.
    Arg(u8),
    /// `WidthInBytes * Height` of the `CUDA_MEMCPY2D *` first argument.
    Memcpy2D,
    /// `WidthInBytes * Height * Depth` of the `CUDA_MEMCPY3D *` first argument.
    Memcpy3D,
    /// Argument 4 times argument 5 (width and height of `cuMemsetD2D*`).
    Args45,
}

/// One probed symbol.
#[derive(Clone, Copy, Debug)]
pub struct EntryPoint {
    /// Exported symbol name in the driver library.
    pub symbol: &'static str,
    /// What the call does.
    pub kind: CallKind,
    bytes: Bytes,
    /// Element size for memsets (bytes per element).
    elem: u8,
}

impl EntryPoint {
    /// The attach cookie: kind in byte 0, byte-count source in byte 1, element size in byte 2.
    pub fn cookie(&self) -> u64 {
        let from: u64 = match self.bytes {
            Bytes::None => 0,
            Bytes::Arg(n) => u64::from(n),
            Bytes::Memcpy2D => 0x10,
            Bytes::Memcpy3D => 0x11,
            Bytes::Args45 => 0x12,
        };
        (self.kind as u64) | (from << 8) | (u64::from(self.elem) << 16)
    }
}

const fn ep(symbol: &'static str, kind: CallKind, bytes: Bytes, elem: u8) -> EntryPoint {
    EntryPoint { symbol, kind, bytes, elem }
}

use Bytes::{Arg, Args45, Memcpy2D, Memcpy3D, None as NoBytes};
const LAUNCH: CallKind = CallKind::Launch;
const COPY: CallKind = CallKind::Copy;
const MEMSET: CallKind = CallKind::Memset;
const SYNC: CallKind = CallKind::Sync;

/// Every entry point probed when launch probes are on. The argument positions follow `cuda.h`;
/// `_ptsz`/`_ptds` are the per-thread-default-stream variants with the same arguments.
pub const ENTRY_POINTS: &[EntryPoint] = &[
    ep("cuLaunchKernel", LAUNCH, NoBytes, 0),
    ep("cuLaunchKernel_ptsz", LAUNCH, NoBytes, 0),
    ep("cuLaunchKernelEx", LAUNCH, NoBytes, 0),
    ep("cuLaunchKernelEx_ptsz", LAUNCH, NoBytes, 0),
    ep("cuLaunchCooperativeKernel", LAUNCH, NoBytes, 0),
    ep("cuLaunchCooperativeKernel_ptsz", LAUNCH, NoBytes, 0),
    ep("cuGraphLaunch", LAUNCH, NoBytes, 0),
    ep("cuGraphLaunch_ptsz", LAUNCH, NoBytes, 0),
    // Linear copies: (dst, src, ByteCount[, stream]).
    ep("cuMemcpy", COPY, Arg(3), 0),
    ep("cuMemcpy_ptds", COPY, Arg(3), 0),
    ep("cuMemcpyAsync", COPY, Arg(3), 0),
    ep("cuMemcpyAsync_ptsz", COPY, Arg(3), 0),
    ep("cuMemcpyHtoD", COPY, Arg(3), 0),
    ep("cuMemcpyHtoD_v2", COPY, Arg(3), 0),
    ep("cuMemcpyHtoD_v2_ptds", COPY, Arg(3), 0),
    ep("cuMemcpyHtoDAsync", COPY, Arg(3), 0),
    ep("cuMemcpyHtoDAsync_v2", COPY, Arg(3), 0),
    ep("cuMemcpyHtoDAsync_v2_ptsz", COPY, Arg(3), 0),
    ep("cuMemcpyDtoH", COPY, Arg(3), 0),
    ep("cuMemcpyDtoH_v2", COPY, Arg(3), 0),
    ep("cuMemcpyDtoH_v2_ptds", COPY, Arg(3), 0),
    ep("cuMemcpyDtoHAsync", COPY, Arg(3), 0),
    ep("cuMemcpyDtoHAsync_v2", COPY, Arg(3), 0),
    ep("cuMemcpyDtoHAsync_v2_ptsz", COPY, Arg(3), 0),
    ep("cuMemcpyDtoD", COPY, Arg(3), 0),
    ep("cuMemcpyDtoD_v2", COPY, Arg(3), 0),
    ep("cuMemcpyDtoD_v2_ptds", COPY, Arg(3), 0),
    ep("cuMemcpyDtoDAsync", COPY, Arg(3), 0),
    ep("cuMemcpyDtoDAsync_v2", COPY, Arg(3), 0),
    ep("cuMemcpyDtoDAsync_v2_ptsz", COPY, Arg(3), 0),
    // Peer: (dstDevice, dstContext, srcDevice, srcContext, ByteCount[, stream]).
    ep("cuMemcpyPeer", COPY, Arg(5), 0),
    ep("cuMemcpyPeer_ptds", COPY, Arg(5), 0),
    ep("cuMemcpyPeerAsync", COPY, Arg(5), 0),
    ep("cuMemcpyPeerAsync_ptsz", COPY, Arg(5), 0),
    // Arrays: (dst, dstOffset|srcArray, src|srcOffset, ByteCount).
    ep("cuMemcpyHtoA_v2", COPY, Arg(4), 0),
    ep("cuMemcpyAtoH_v2", COPY, Arg(4), 0),
    ep("cuMemcpyDtoA_v2", COPY, Arg(4), 0),
    ep("cuMemcpyAtoD_v2", COPY, Arg(4), 0),
    ep("cuMemcpyAtoA_v2", COPY, Arg(5), 0),
    // Structured copies: sizes come from the descriptor.
    ep("cuMemcpy2D_v2", COPY, Memcpy2D, 0),
    ep("cuMemcpy2D_v2_ptds", COPY, Memcpy2D, 0),
    ep("cuMemcpy2DUnaligned_v2", COPY, Memcpy2D, 0),
    ep("cuMemcpy2DAsync_v2", COPY, Memcpy2D, 0),
    ep("cuMemcpy2DAsync_v2_ptsz", COPY, Memcpy2D, 0),
    ep("cuMemcpy3D_v2", COPY, Memcpy3D, 0),
    ep("cuMemcpy3D_v2_ptds", COPY, Memcpy3D, 0),
    ep("cuMemcpy3DAsync_v2", COPY, Memcpy3D, 0),
    ep("cuMemcpy3DAsync_v2_ptsz", COPY, Memcpy3D, 0),
    // Memsets: (dstDevice, value, N[, stream]) and (dstDevice, pitch, value, Width, Height[, stream]).
    ep("cuMemsetD8_v2", MEMSET, Arg(3), 1),
    ep("cuMemsetD8_v2_ptds", MEMSET, Arg(3), 1),
    ep("cuMemsetD16_v2", MEMSET, Arg(3), 2),
    ep("cuMemsetD16_v2_ptds", MEMSET, Arg(3), 2),
    ep("cuMemsetD32_v2", MEMSET, Arg(3), 4),
    ep("cuMemsetD32_v2_ptds", MEMSET, Arg(3), 4),
    ep("cuMemsetD8Async", MEMSET, Arg(3), 1),
    ep("cuMemsetD8Async_ptsz", MEMSET, Arg(3), 1),
    ep("cuMemsetD16Async", MEMSET, Arg(3), 2),
    ep("cuMemsetD16Async_ptsz", MEMSET, Arg(3), 2),
    ep("cuMemsetD32Async", MEMSET, Arg(3), 4),
    ep("cuMemsetD32Async_ptsz", MEMSET, Arg(3), 4),
    ep("cuMemsetD2D8_v2", MEMSET, Args45, 1),
    ep("cuMemsetD2D8_v2_ptds", MEMSET, Args45, 1),
    ep("cuMemsetD2D16_v2", MEMSET, Args45, 2),
    ep("cuMemsetD2D16_v2_ptds", MEMSET, Args45, 2),
    ep("cuMemsetD2D32_v2", MEMSET, Args45, 4),
    ep("cuMemsetD2D32_v2_ptds", MEMSET, Args45, 4),
    // Waits.
    ep("cuCtxSynchronize", SYNC, NoBytes, 0),
    ep("cuStreamSynchronize", SYNC, NoBytes, 0),
    ep("cuStreamSynchronize_ptsz", SYNC, NoBytes, 0),
    ep("cuEventSynchronize", SYNC, NoBytes, 0),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_encode_kind_source_and_element_size() {
        let find = |s: &str| ENTRY_POINTS.iter().find(|e| e.symbol == s).copied().expect(s);
        assert_eq!(find("cuLaunchKernel").cookie(), 1);
        assert_eq!(find("cuMemcpyHtoD_v2").cookie(), 2 | (3 << 8));
        assert_eq!(find("cuMemcpyPeerAsync").cookie(), 2 | (5 << 8));
        assert_eq!(find("cuMemcpy3D_v2").cookie(), 2 | (0x11 << 8));
        assert_eq!(find("cuMemsetD32_v2").cookie(), 3 | (3 << 8) | (4 << 16));
        assert_eq!(find("cuMemsetD2D16_v2").cookie(), 3 | (0x12 << 8) | (2 << 16));
        assert_eq!(find("cuCtxSynchronize").cookie(), 4);
    }

    #[test]
    fn symbols_are_unique() {
        let mut names: Vec<_> = ENTRY_POINTS.iter().map(|e| e.symbol).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len());
    }
}
