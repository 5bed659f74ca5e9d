//! The exported CUDA driver entry points of the test double.
//!
//! Every function catches panics (none crosses `extern "C"`) and checks its output
//! pointers for NULL. Calls touching contexts, memory or work hold the checkpoint gate.

#![expect(clippy::missing_safety_doc, reason = "the CUDA driver API contract applies to every export")]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::time::Instant;

use crate::config::config;
use crate::kernels::{self, Kernel};
use crate::ledger::{self, LedgerError};
use crate::memory::{self, Allocation};
use crate::result::{self, CUresult};
use crate::state::{self, gated, ungated, Ctx, Driver};

/// `CUdevice`.
pub type CUdevice = c_int;
/// `CUdeviceptr`.
pub type CUdeviceptr = u64;
/// Any opaque handle (`CUcontext`, `CUstream`, …).
pub type Handle = *mut c_void;

/// The driver version this test double reports (12.8).
pub const DRIVER_VERSION: c_int = 12080;

macro_rules! out {
    ($p:expr, $v:expr) => {{
        if $p.is_null() {
            return result::INVALID_VALUE;
        }
        // SAFETY: non-null output pointer supplied by the caller per the CUDA API contract.
        unsafe { $p.write($v) };
    }};
}

fn device(ordinal: CUdevice) -> Result<&'static crate::config::FakeGpu, CUresult> {
    usize::try_from(ordinal).ok().and_then(|i| config().gpus.get(i)).ok_or(result::INVALID_DEVICE)
}

fn initialised() -> bool {
    state::STATE.lock().is_some()
}

pub(crate) fn current_device(d: &Driver) -> Result<u32, CUresult> {
    d.contexts.get(&state::current()).map(|c| c.device).ok_or(result::INVALID_CONTEXT)
}

#[no_mangle]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    ungated(|| if flags != 0 { result::INVALID_VALUE } else { state::init() })
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut c_int) -> CUresult {
    ungated(|| {
        out!(v, DRIVER_VERSION);
        result::SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    ungated(|| {
        if !initialised() {
            return result::NOT_INITIALIZED;
        }
        out!(count, config().gpus.len() as c_int);
        result::SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(dev: *mut CUdevice, ordinal: c_int) -> CUresult {
    ungated(|| {
        if !initialised() {
            return result::NOT_INITIALIZED;
        }
        if let Err(e) = device(ordinal) {
            return e;
        }
        out!(dev, ordinal);
        result::SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    ungated(|| {
        let gpu = match device(dev) {
            Ok(g) => g,
            Err(e) => return e,
        };
        let Ok(len) = usize::try_from(len) else { return result::INVALID_VALUE };
        if name.is_null() || len == 0 {
            return result::INVALID_VALUE;
        }
        let text = format!("Simulated GPU {} (fake-cuda test double)", gpu.index);
        let n = text.len().min(len - 1);
        // SAFETY: caller provides `len` writable bytes at `name`; we write n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), name.cast::<u8>(), n);
            *name.add(n) = 0;
        }
        result::SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    device_uuid(uuid, dev)
}

// Exports never call other exports by name: an interposer (the shim) would be called instead.
fn device_uuid(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    ungated(|| match device(dev) {
        Ok(g) => {
            out!(uuid, g.uuid);
            result::SUCCESS
        }
        Err(e) => e,
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: CUdevice) -> CUresult {
    device_uuid(uuid, dev)
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    ungated(|| match device(dev) {
        Ok(g) => {
            out!(bytes, g.memory_bytes as usize);
            result::SUCCESS
        }
        Err(e) => e,
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(pi: *mut c_int, attrib: c_int, dev: CUdevice) -> CUresult {
    ungated(|| {
        if let Err(e) = device(dev) {
            return e;
        }
        // A few attributes frameworks ask first; the rest read as 0 ("not supported").
        let v = match attrib {
            1 => 1024,     // MAX_THREADS_PER_BLOCK
            2..=4 => 1024, // MAX_BLOCK_DIM_X/Y/Z
            10 => 32,      // WARP_SIZE
            16 => 4,       // MULTIPROCESSOR_COUNT
            41 => 1,       // UNIFIED_ADDRESSING
            75 => 9,       // COMPUTE_CAPABILITY_MAJOR
            76 => 0,       // COMPUTE_CAPABILITY_MINOR
            _ => 0,
        };
        out!(pi, v);
        result::SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut Handle, dev: CUdevice) -> CUresult {
    if ctx.is_null() {
        return result::INVALID_VALUE;
    }
    gated(|d| {
        let gpu = match device(dev) {
            Ok(g) => g,
            Err(e) => return e,
        };
        let h = match d.primary.get(&gpu.index) {
            Some(h) => *h,
            None => {
                let h = d.handle();
                d.contexts.insert(h, Ctx { device: gpu.index, primary: true });
                d.primary.insert(gpu.index, h);
                h
            }
        };
        out!(ctx, h as Handle);
        result::SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    gated(|_| device(dev).map_or_else(|e| e, |_| result::SUCCESS))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(ctx: *mut Handle, _flags: c_uint, dev: CUdevice) -> CUresult {
    if ctx.is_null() {
        return result::INVALID_VALUE;
    }
    gated(|d| {
        let gpu = match device(dev) {
            Ok(g) => g,
            Err(e) => return e,
        };
        let h = d.handle();
        d.contexts.insert(h, Ctx { device: gpu.index, primary: false });
        state::set_current(h);
        out!(ctx, h as Handle);
        result::SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn cuCtxDestroy_v2(ctx: Handle) -> CUresult {
    gated(|d| {
        let h = ctx as u64;
        match d.contexts.get(&h) {
            Some(c) if !c.primary => {
                d.contexts.remove(&h);
                if state::current() == h {
                    state::set_current(0);
                }
                result::SUCCESS
            }
            _ => result::INVALID_CONTEXT,
        }
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: Handle) -> CUresult {
    set_current(ctx)
}

fn set_current(ctx: Handle) -> CUresult {
    gated(|d| {
        let h = ctx as u64;
        if h != 0 && !d.contexts.contains_key(&h) {
            return result::INVALID_CONTEXT;
        }
        state::set_current(h);
        result::SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut Handle) -> CUresult {
    ungated(|| {
        out!(ctx, state::current() as Handle);
        result::SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn cuCtxPushCurrent_v2(ctx: Handle) -> CUresult {
    // One level of nesting is all the shim and tests need: push == set.
    set_current(ctx)
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(ctx: *mut Handle) -> CUresult {
    ungated(|| {
        let h = state::current();
        if !ctx.is_null() {
            // SAFETY: non-null output pointer from the caller.
            unsafe { ctx.write(h as Handle) };
        }
        state::set_current(0);
        result::SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult {
    if dev.is_null() {
        return result::INVALID_VALUE;
    }
    gated(|d| match current_device(d) {
        Ok(i) => {
            out!(dev, i as CUdevice);
            result::SUCCESS
        }
        Err(e) => e,
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    // Work runs at submission, so there is never anything to wait for.
    gated(|d| current_device(d).map_or_else(|e| e, |_| result::SUCCESS))
}

/// Allocates `bytes` on `dev`, charged to this process in the GPU's capacity ledger.
pub(crate) fn allocate(d: &mut Driver, dev: u32, bytes: usize) -> Result<CUdeviceptr, CUresult> {
    if bytes == 0 {
        return Err(result::INVALID_VALUE);
    }
    let gpu = config().gpus.get(dev as usize).ok_or(result::INVALID_DEVICE)?;
    let want = d.bytes_on(dev).saturating_add(bytes as u64);
    match ledger::set(gpu, state::pid(), want) {
        Ok(()) => {}
        Err(LedgerError::OutOfMemory) => return Err(result::OUT_OF_MEMORY),
        Err(LedgerError::Io(e)) => {
            eprintln!("fake-cuda (test double): capacity ledger: {e}");
            return Err(result::OPERATING_SYSTEM);
        }
    }
    let Some((base, mapped)) = memory::map(bytes) else {
        let _ = ledger::set(gpu, state::pid(), d.bytes_on(dev));
        return Err(result::OUT_OF_MEMORY);
    };
    d.allocs.insert(base, Allocation { size: bytes, mapped, device: dev, backup: None });
    Ok(base)
}

/// Frees the allocation at `dptr` (exactly its base) and gives its capacity back.
pub(crate) fn free(d: &mut Driver, dptr: CUdeviceptr) -> CUresult {
    let Some(a) = d.allocs.remove(&dptr) else { return result::INVALID_VALUE };
    memory::unmap(dptr, &a);
    let gpu = &config().gpus[a.device as usize];
    let _ = ledger::set(gpu, state::pid(), d.bytes_on(a.device));
    result::SUCCESS
}

/// Allocates `bytes` on the current context's device into `*dptr`.
pub(crate) fn allocate_current(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult {
    if dptr.is_null() || bytes == 0 {
        return result::INVALID_VALUE;
    }
    gated(|d| {
        let dev = match current_device(d) {
            Ok(v) => v,
            Err(e) => return e,
        };
        match allocate(d, dev, bytes) {
            Ok(base) => {
                out!(dptr, base);
                result::SUCCESS
            }
            Err(e) => e,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult {
    allocate_current(dptr, bytes)
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    gated(|d| free(d, dptr))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    if free.is_null() || total.is_null() {
        return result::INVALID_VALUE;
    }
    gated(|d| {
        let dev = match current_device(d) {
            Ok(v) => v,
            Err(e) => return e,
        };
        let gpu = &config().gpus[dev as usize];
        let used = ledger::used(gpu).unwrap_or(0);
        out!(free, gpu.memory_bytes.saturating_sub(used) as usize);
        out!(total, gpu.memory_bytes as usize);
        result::SUCCESS
    })
}

fn copy_htod(d: &Driver, dst: CUdeviceptr, src: *const c_void, bytes: usize) -> CUresult {
    if src.is_null() {
        return result::INVALID_VALUE;
    }
    if let Err(e) = d.check_range(dst, bytes) {
        return e;
    }
    // SAFETY: dst range checked live and writable; src is `bytes` readable host bytes per the API contract.
    unsafe { std::ptr::copy(src.cast::<u8>(), dst as *mut u8, bytes) };
    result::SUCCESS
}

fn copy_dtoh(d: &Driver, dst: *mut c_void, src: CUdeviceptr, bytes: usize) -> CUresult {
    if dst.is_null() {
        return result::INVALID_VALUE;
    }
    if let Err(e) = d.check_range(src, bytes) {
        return e;
    }
    // SAFETY: src range checked live; dst is `bytes` writable host bytes per the API contract.
    unsafe { std::ptr::copy(src as *const u8, dst.cast::<u8>(), bytes) };
    result::SUCCESS
}

fn copy_dtod(d: &Driver, dst: CUdeviceptr, src: CUdeviceptr, bytes: usize) -> CUresult {
    if let Err(e) = d.check_range(src, bytes).and_then(|()| d.check_range(dst, bytes)) {
        return e;
    }
    // SAFETY: both ranges checked live and writable.
    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
    result::SUCCESS
}

#[no_mangle]
pub extern "C" fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, bytes: usize) -> CUresult {
    gated(|d| copy_htod(d, dst, src, bytes))
}

#[no_mangle]
pub extern "C" fn cuMemcpyHtoD_v2_ptds(dst: CUdeviceptr, src: *const c_void, bytes: usize) -> CUresult {
    gated(|d| copy_htod(d, dst, src, bytes))
}

#[no_mangle]
pub extern "C" fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, bytes: usize, _s: Handle) -> CUresult {
    gated(|d| copy_htod(d, dst, src, bytes))
}

#[no_mangle]
pub extern "C" fn cuMemcpyHtoDAsync_v2_ptsz(dst: CUdeviceptr, src: *const c_void, bytes: usize, s: Handle) -> CUresult {
    let _ = s;
    gated(|d| copy_htod(d, dst, src, bytes))
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, bytes: usize) -> CUresult {
    gated(|d| copy_dtoh(d, dst, src, bytes))
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoH_v2_ptds(dst: *mut c_void, src: CUdeviceptr, bytes: usize) -> CUresult {
    gated(|d| copy_dtoh(d, dst, src, bytes))
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, bytes: usize, _s: Handle) -> CUresult {
    gated(|d| copy_dtoh(d, dst, src, bytes))
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize) -> CUresult {
    gated(|d| copy_dtod(d, dst, src, bytes))
}

#[no_mangle]
pub extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, value: u8, n: usize) -> CUresult {
    gated(|d| {
        if let Err(e) = d.check_range(dst, n) {
            return e;
        }
        // SAFETY: range checked live and writable.
        unsafe { std::ptr::write_bytes(dst as *mut u8, value, n) };
        result::SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn cuMemsetD32_v2(dst: CUdeviceptr, value: c_uint, n: usize) -> CUresult {
    gated(|d| {
        let Some(len) = n.checked_mul(4) else { return result::INVALID_VALUE };
        if let Err(e) = d.check_range(dst, len) {
            return e;
        }
        if !dst.is_multiple_of(4) {
            return result::INVALID_VALUE;
        }
        // SAFETY: range checked live, writable and 4-aligned.
        unsafe { std::slice::from_raw_parts_mut(dst as *mut u32, n) }.fill(value);
        result::SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut Handle, _image: *const c_void) -> CUresult {
    if module.is_null() {
        return result::INVALID_VALUE;
    }
    gated(|d| {
        if let Err(e) = current_device(d) {
            return e;
        }
        let h = d.handle();
        d.modules.insert(h);
        out!(module, h as Handle);
        result::SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn cuModuleUnload(module: Handle) -> CUresult {
    gated(|d| if d.modules.remove(&(module as u64)) { result::SUCCESS } else { result::INVALID_HANDLE })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(f: *mut Handle, module: Handle, name: *const c_char) -> CUresult {
    if f.is_null() || name.is_null() {
        return result::INVALID_VALUE;
    }
    gated(|d| {
        if !d.modules.contains(&(module as u64)) {
            return result::INVALID_HANDLE;
        }
        // SAFETY: name is a NUL-terminated string per the API contract (checked non-null).
        let name = unsafe { CStr::from_ptr(name) };
        match Kernel::by_name(name.to_bytes()) {
            Some(k) => {
                out!(f, k as usize as Handle);
                result::SUCCESS
            }
            None => result::NOT_FOUND,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    _shared: c_uint,
    _stream: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { launch_kernel(f, [gx, gy, gz, bx, by, bz], _shared, _stream, params, extra) }
}

unsafe fn launch_kernel(
    f: Handle,
    dims: [c_uint; 6],
    _shared: c_uint,
    _stream: Handle,
    params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    gated(|d| {
        if let Err(e) = current_device(d) {
            return e;
        }
        if dims.contains(&0) {
            return result::INVALID_VALUE;
        }
        let Some(k) = Kernel::by_handle(f as usize) else { return result::INVALID_HANDLE };
        // SAFETY: params follow the cuLaunchKernel contract for k (caller's obligation).
        unsafe { kernels::launch(d, k, params) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { launch_kernel(f, [gx, gy, gz, bx, by, bz], shared, stream, params, extra) }
}

/// `CUlaunchConfig`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct LaunchConfig {
    /// Grid and block dimensions, then dynamic shared memory bytes.
    pub dims: [c_uint; 6],
    /// Dynamic shared memory, bytes.
    pub shared: c_uint,
    /// Stream.
    pub stream: Handle,
    /// Launch attributes (ignored).
    pub attrs: *mut c_void,
    /// Number of attributes.
    pub num_attrs: c_uint,
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const LaunchConfig,
    f: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    if config.is_null() {
        return result::INVALID_VALUE;
    }
    // SAFETY: non-null CUlaunchConfig per the API contract.
    let c = unsafe { *config };
    // SAFETY: same contract as cuLaunchKernel.
    unsafe { launch_kernel(f, c.dims, c.shared, c.stream, params, extra) }
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const LaunchConfig,
    f: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    if config.is_null() {
        return result::INVALID_VALUE;
    }
    // SAFETY: non-null CUlaunchConfig per the API contract.
    let c = unsafe { *config };
    // SAFETY: same contract as cuLaunchKernel.
    unsafe { launch_kernel(f, c.dims, c.shared, c.stream, params, extra) }
}

/// CUDA graphs are not simulated: the entry point exists (so tools can attach to it)
/// and says so.
#[no_mangle]
pub extern "C" fn cuGraphLaunch(_exec: Handle, _stream: Handle) -> CUresult {
    gated(|_| result::NOT_SUPPORTED)
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut Handle, _flags: c_uint) -> CUresult {
    if stream.is_null() {
        return result::INVALID_VALUE;
    }
    gated(|d| {
        if let Err(e) = current_device(d) {
            return e;
        }
        let h = d.handle();
        d.streams.insert(h);
        out!(stream, h as Handle);
        result::SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn cuStreamDestroy_v2(stream: Handle) -> CUresult {
    gated(|d| if d.streams.remove(&(stream as u64)) { result::SUCCESS } else { result::INVALID_HANDLE })
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize(stream: Handle) -> CUresult {
    gated(|d| {
        let h = stream as u64;
        // 0 and the legacy/per-thread default stream handles (1, 2) are always valid.
        if h > 2 && !d.streams.contains(&h) {
            return result::INVALID_HANDLE;
        }
        result::SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(event: *mut Handle, _flags: c_uint) -> CUresult {
    if event.is_null() {
        return result::INVALID_VALUE;
    }
    gated(|d| {
        let h = d.handle();
        d.events.insert(h, None);
        out!(event, h as Handle);
        result::SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn cuEventRecord(event: Handle, _stream: Handle) -> CUresult {
    gated(|d| match d.events.get_mut(&(event as u64)) {
        Some(t) => {
            *t = Some(Instant::now());
            result::SUCCESS
        }
        None => result::INVALID_HANDLE,
    })
}

#[no_mangle]
pub extern "C" fn cuEventSynchronize(event: Handle) -> CUresult {
    gated(|d| if d.events.contains_key(&(event as u64)) { result::SUCCESS } else { result::INVALID_HANDLE })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(ms: *mut f32, start: Handle, end: Handle) -> CUresult {
    if ms.is_null() {
        return result::INVALID_VALUE;
    }
    gated(|d| match (d.events.get(&(start as u64)), d.events.get(&(end as u64))) {
        (Some(Some(a)), Some(Some(b))) => {
            out!(ms, b.saturating_duration_since(*a).as_secs_f32() * 1000.0);
            result::SUCCESS
        }
        (Some(_), Some(_)) => result::INVALID_VALUE,
        _ => result::INVALID_HANDLE,
    })
}

#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(event: Handle) -> CUresult {
    gated(|d| if d.events.remove(&(event as u64)).is_some() { result::SUCCESS } else { result::INVALID_HANDLE })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(code: CUresult, s: *mut *const c_char) -> CUresult {
    error_name(code, s)
}

fn error_name(code: CUresult, s: *mut *const c_char) -> CUresult {
    ungated(|| {
        out!(s, result::name(code).as_ptr());
        result::SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(code: CUresult, s: *mut *const c_char) -> CUresult {
    error_name(code, s)
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
) -> CUresult {
    get_proc_address(symbol, pfn, cuda_version, flags, std::ptr::null_mut())
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    get_proc_address(symbol, pfn, cuda_version, flags, status)
}

fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    ungated(|| {
        if symbol.is_null() || pfn.is_null() {
            return result::INVALID_VALUE;
        }
        // SAFETY: NUL-terminated per the API contract (checked non-null).
        let name = unsafe { CStr::from_ptr(symbol) };
        let found = crate::proc_address::resolve(name.to_bytes(), cuda_version, flags);
        // SAFETY: pfn checked non-null.
        unsafe { pfn.write(found.unwrap_or(std::ptr::null_mut())) };
        if !status.is_null() {
            // SAFETY: optional output, non-null.
            unsafe { status.write(if found.is_some() { 0 } else { 1 }) };
        }
        if found.is_some() {
            result::SUCCESS
        } else {
            result::NOT_FOUND
        }
    })
}

/// Marker export: lets tools tell the TEST DOUBLE from a real driver (always 1).
#[no_mangle]
pub extern "C" fn fakeCudaIsTestDouble() -> c_int {
    1
}
