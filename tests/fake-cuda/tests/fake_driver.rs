//! The fake-cuda TEST DOUBLE behaves like a driver: kernels compute, capacity is
//! enforced through the shared ledger, and the checkpoint API keeps contents and
//! pointers across a restore onto another GPU while blocking the process's calls.

use std::ffi::c_void;
use std::sync::mpsc;
use std::time::Duration;

use fake_cuda::api::*;
use fake_cuda::checkpoint::*;
use fake_cuda::config::uuid_bytes;
use fake_cuda::result;

/// Serialises the tests that count this process's bytes per GPU against the one that moves them.
static GPU_BYTES: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn setup() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let dir = tempfile::tempdir().expect("tempdir").keep();
        // SAFETY: set before any thread of this test binary reads the environment
        // (Once; config() is read first inside cuInit below).
        unsafe {
            std::env::set_var("FAKE_CUDA_STATE_DIR", dir);
            std::env::set_var("FAKE_CUDA_GPUS", "2");
            std::env::set_var("FAKE_CUDA_GPU_MEMORY_MIB", "16");
        }
        assert_eq!(cuInit(0), result::SUCCESS);
    });
}

fn ctx_on(dev: i32) {
    let mut ctx: Handle = std::ptr::null_mut();
    // SAFETY: valid output pointer.
    assert_eq!(unsafe { cuDevicePrimaryCtxRetain(&mut ctx, dev) }, result::SUCCESS);
    assert_eq!(cuCtxSetCurrent(ctx), result::SUCCESS);
}

fn function(name: &std::ffi::CStr) -> Handle {
    let (mut m, mut f): (Handle, Handle) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: valid output pointers; the image is ignored by the test double.
    unsafe {
        assert_eq!(cuModuleLoadData(&mut m, c"".as_ptr().cast()), result::SUCCESS);
        assert_eq!(cuModuleGetFunction(&mut f, m, name.as_ptr()), result::SUCCESS);
    }
    f
}

fn launch(f: Handle, args: &mut [*mut c_void]) -> u32 {
    // SAFETY: args point at the kernel's parameters.
    unsafe { cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, std::ptr::null_mut(), args.as_mut_ptr(), std::ptr::null_mut()) }
}

fn alloc(bytes: usize) -> (u32, u64) {
    let mut p = 0u64;
    // SAFETY: valid output pointer.
    let rc = unsafe { cuMemAlloc_v2(&mut p, bytes) };
    (rc, p)
}

fn fill(ptr: u64, v: f32, n: u64) {
    let (mut ptr, mut v, mut n) = (ptr, v, n);
    let f = function(c"fill_f32");
    let mut args = [(&raw mut ptr).cast(), (&raw mut v).cast(), (&raw mut n).cast()];
    assert_eq!(launch(f, &mut args), result::SUCCESS);
}

fn sum(x: u64, n: u64) -> f32 {
    let (o_rc, out) = alloc(4);
    assert_eq!(o_rc, result::SUCCESS);
    let (mut out_p, mut x, mut n) = (out, x, n);
    let f = function(c"sum_f32");
    let mut args = [(&raw mut out_p).cast(), (&raw mut x).cast(), (&raw mut n).cast()];
    assert_eq!(launch(f, &mut args), result::SUCCESS);
    let mut host = 0f32;
    assert_eq!(cuMemcpyDtoH_v2((&raw mut host).cast(), out, 4), result::SUCCESS);
    assert_eq!(cuMemFree_v2(out), result::SUCCESS);
    host
}

#[test]
fn kernels_compute_and_capacity_is_enforced_and_checkpoint_restores_onto_another_gpu() {
    let _serial = GPU_BYTES.lock().unwrap_or_else(|e| e.into_inner());
    setup();
    ctx_on(0);
    let n = 1024u64;
    let (rc, x) = alloc(n as usize * 4);
    assert_eq!(rc, result::SUCCESS);
    let (rc, y) = alloc(n as usize * 4);
    assert_eq!(rc, result::SUCCESS);
    fill(x, 2.0, n);
    fill(y, 1.0, n);
    let (mut yp, mut xp, mut a, mut nn) = (y, x, 3.0f32, n);
    let axpy = function(c"axpy_f32");
    let mut args = [(&raw mut yp).cast(), (&raw mut xp).cast(), (&raw mut a).cast(), (&raw mut nn).cast()];
    assert_eq!(launch(axpy, &mut args), result::SUCCESS);
    assert_eq!(sum(y, n), 7.0 * 1024.0);

    // 16 MiB GPU: a 20 MiB allocation does not fit.
    assert_eq!(alloc(20 << 20).0, result::OUT_OF_MEMORY);
    // Out-of-range access is an error, not a crash.
    assert_eq!(cuMemcpyDtoH_v2([0u8; 8].as_mut_ptr().cast(), x + n * 4 - 4, 8), result::ILLEGAL_ADDRESS);

    let pid = std::process::id() as i32;
    let mut st = -1;
    // SAFETY: valid pointers / args throughout.
    unsafe {
        assert_eq!(cuCheckpointProcessLock(pid, &LockArgs { timeout_ms: 5000, ..Default::default() }), 0);
        assert_eq!(cuCheckpointProcessGetState(pid, &mut st), 0);
    }
    assert_eq!(st, 1, "LOCKED");

    // A CUDA call from another thread blocks while the process is locked.
    let (tx, rx) = mpsc::channel();
    let blocked = std::thread::spawn(move || {
        let mut host = 0f32;
        let rc = cuMemcpyDtoH_v2((&raw mut host).cast(), y, 4);
        tx.send((rc, host)).expect("send");
    });
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err(), "call must block while locked");

    assert_eq!(cuCheckpointProcessCheckpoint(pid, std::ptr::null()), 0);
    let pairs = [GpuPair { old_uuid: uuid_bytes(0), new_uuid: uuid_bytes(1) }];
    let args = RestoreArgs { gpu_pairs: pairs.as_ptr(), gpu_pairs_count: 1, reserved: [0; 44], reserved1: 0 };
    // SAFETY: args valid for the call.
    unsafe {
        assert_eq!(cuCheckpointProcessGetState(pid, &mut st), 0);
        assert_eq!(st, 2, "CHECKPOINTED");
        assert_eq!(cuCheckpointProcessRestore(pid, &args), 0);
    }
    assert_eq!(cuCheckpointProcessUnlock(pid, std::ptr::null()), 0);
    let (rc, host) = rx.recv_timeout(Duration::from_secs(10)).expect("call proceeds after unlock");
    blocked.join().expect("join");
    assert_eq!((rc, host), (result::SUCCESS, 7.0));

    // Same pointers, now on GPU 1, contents intact, kernels still compute.
    let mut dev = -1;
    // SAFETY: valid output pointer.
    assert_eq!(unsafe { cuCtxGetDevice(&mut dev) }, 0);
    assert_eq!(dev, 1);
    assert_eq!(sum(y, n), 7.0 * 1024.0);
    assert_eq!(sum(x, n), 2.0 * 1024.0);
}

#[test]
fn null_outputs_are_errors() {
    setup();
    // SAFETY: NULL is exactly what is being tested; the driver must not write through it.
    unsafe {
        assert_eq!(cuDeviceGetCount(std::ptr::null_mut()), result::INVALID_VALUE);
        assert_eq!(cuMemAlloc_v2(std::ptr::null_mut(), 16), result::INVALID_VALUE);
        assert_eq!(cuDriverGetVersion(std::ptr::null_mut()), result::INVALID_VALUE);
        assert_eq!(cuGetProcAddress_v2(c"cuInit".as_ptr(), std::ptr::null_mut(), 12000, 0, std::ptr::null_mut()), 1);
    }
}

#[test]
fn get_proc_address_resolves_versions_and_per_thread_stream() {
    setup();
    let mut p: *mut c_void = std::ptr::null_mut();
    let mut status = -1;
    // SAFETY: valid pointers.
    unsafe {
        assert_eq!(cuGetProcAddress_v2(c"cuMemAlloc".as_ptr(), &mut p, 12000, 0, &mut status), 0);
        assert_eq!((p as usize, status), (cuMemAlloc_v2 as *const () as usize, 0));
        assert_eq!(cuGetProcAddress_v2(c"cuLaunchKernel".as_ptr(), &mut p, 12000, 2, &mut status), 0);
        assert_eq!(p as usize, cuLaunchKernel_ptsz as *const () as usize);
        assert_eq!(cuGetProcAddress_v2(c"cuNoSuchThing".as_ptr(), &mut p, 12000, 0, &mut status), 500);
        assert_eq!(status, 1);
    }
}

#[test]
fn launch_kernel_ex_computes_like_launch_kernel() {
    setup();
    ctx_on(0);
    let (rc, x) = alloc(64 * 4);
    assert_eq!(rc, result::SUCCESS);
    let (mut p, mut v, mut n) = (x, 4.0f32, 64u64);
    let mut args = [(&raw mut p).cast::<c_void>(), (&raw mut v).cast(), (&raw mut n).cast()];
    let cfg = LaunchConfig {
        dims: [1, 1, 1, 32, 1, 1],
        shared: 0,
        stream: std::ptr::null_mut(),
        attrs: std::ptr::null_mut(),
        num_attrs: 0,
    };
    // SAFETY: valid config and parameters for fill_f32.
    let rc = unsafe { cuLaunchKernelEx(&cfg, function(c"fill_f32"), args.as_mut_ptr(), std::ptr::null_mut()) };
    assert_eq!(rc, result::SUCCESS);
    assert_eq!(sum(x, 64), 256.0);
    assert_eq!(cuGraphLaunch(std::ptr::null_mut(), std::ptr::null_mut()), result::NOT_SUPPORTED);
}

#[test]
fn nvml_lists_this_process_with_the_bytes_it_allocated_and_answers_size_queries() {
    use fake_cuda::nvml::*;
    let _serial = GPU_BYTES.lock().unwrap_or_else(|e| e.into_inner());
    setup();
    ctx_on(1);
    let mut dev: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid output pointer.
    assert_eq!(unsafe { nvmlDeviceGetHandleByIndex_v2(1, &mut dev) }, NVML_SUCCESS);
    let me = std::process::id();
    let mine = |infos: &[NvmlProcessInfo]| infos.iter().filter(|i| i.pid == me).map(|i| i.used_gpu_memory).sum::<u64>();
    let query = || -> Vec<NvmlProcessInfo> {
        // Size query first, as nvidia-smi does: a zero-capacity buffer gets the count.
        let mut n = 0u32;
        // SAFETY: valid in/out count; no buffer with a zero capacity.
        let rc = unsafe { nvmlDeviceGetComputeRunningProcesses_v3(dev, &mut n, std::ptr::null_mut()) };
        assert!(rc == NVML_SUCCESS || rc == NVML_ERROR_INSUFFICIENT_SIZE, "{rc}");
        let mut infos = vec![
            NvmlProcessInfo { pid: 0, used_gpu_memory: 0, gpu_instance_id: 0, compute_instance_id: 0 };
            n as usize
        ];
        let mut cap = n;
        // SAFETY: `cap` elements at `infos`.
        assert_eq!(unsafe { nvmlDeviceGetComputeRunningProcesses_v3(dev, &mut cap, infos.as_mut_ptr()) }, NVML_SUCCESS);
        infos.truncate(cap as usize);
        infos
    };
    let before = mine(&query());
    let (rc, p) = alloc(3 << 20);
    assert_eq!(rc, result::SUCCESS);
    // Recording memory took this process's liveness file, which other processes test.
    let state_dir = std::env::var_os("FAKE_CUDA_STATE_DIR").expect("set by setup");
    assert!(std::path::Path::new(&state_dir).join("live").join(me.to_string()).exists());
    let infos = query();
    assert!(!infos.is_empty());
    assert_eq!(mine(&infos), before + (3 << 20));
    assert!(infos.iter().all(|i| i.gpu_instance_id == NO_MIG_INSTANCE));
    // A buffer one too small: the count comes back with INSUFFICIENT_SIZE.
    let mut small = infos.len() as u32 - 1;
    let mut buf = vec![infos[0]; infos.len()];
    // SAFETY: `small` < buf.len() elements.
    let rc = unsafe { nvmlDeviceGetComputeRunningProcesses_v3(dev, &mut small, buf.as_mut_ptr()) };
    assert_eq!((rc, small as usize), (NVML_ERROR_INSUFFICIENT_SIZE, infos.len()));
    // A bad handle is an error.
    let mut n = 0u32;
    // SAFETY: valid in/out count; the handle is invalid on purpose.
    let rc = unsafe { nvmlDeviceGetComputeRunningProcesses_v3(std::ptr::null_mut(), &mut n, std::ptr::null_mut()) };
    assert_eq!(rc, NVML_ERROR_INVALID_ARGUMENT);
    assert_eq!(cuMemFree_v2(p), result::SUCCESS);
    assert_eq!(mine(&query()), before);
}

#[test]
fn injected_faults_make_lock_checkpoint_and_restore_time_out_fail_or_leave_memory_behind() {
    use fake_cuda::config::config;
    use fake_cuda::faults::{self, Op};
    let _serial = GPU_BYTES.lock().unwrap_or_else(|e| e.into_inner());
    setup();
    ctx_on(0);
    let (rc, p) = alloc(1 << 20);
    assert_eq!(rc, result::SUCCESS);
    let pid = std::process::id() as i32;
    let gpu0 = &config().gpus[0];
    let mine = || {
        fake_cuda::ledger::processes(gpu0)
            .expect("ledger")
            .iter()
            .filter(|(q, _)| *q == pid as u32)
            .map(|(_, b)| *b)
            .sum::<u64>()
    };
    let charged = mine();
    assert!(charged >= 1 << 20);
    let inject = |op: Op, word: &str| {
        let path = faults::path(&config().state_dir, op);
        std::fs::create_dir_all(path.parent().expect("dir")).expect("faults dir");
        std::fs::write(path, word).expect("write fault");
    };
    let clear = |op: Op| std::fs::remove_file(faults::path(&config().state_dir, op)).expect("clear fault");
    let lock = || {
        // SAFETY: valid args.
        unsafe { cuCheckpointProcessLock(pid, &LockArgs { timeout_ms: 5000, ..Default::default() }) }
    };
    let state = || {
        let mut st = -1;
        // SAFETY: valid output pointer.
        assert_eq!(unsafe { cuCheckpointProcessGetState(pid, &mut st) }, 0);
        st
    };

    inject(Op::Lock, "timeout");
    assert_eq!(lock(), result::TIMEOUT);
    assert_eq!(state(), 0, "still RUNNING");
    clear(Op::Lock);
    assert_eq!(lock(), 0);

    inject(Op::Checkpoint, "fail");
    assert_eq!(cuCheckpointProcessCheckpoint(pid, std::ptr::null()), result::UNKNOWN);
    assert_eq!((state(), mine()), (1, charged), "still LOCKED, memory still charged");
    inject(Op::Checkpoint, "leave");
    assert_eq!(cuCheckpointProcessCheckpoint(pid, std::ptr::null()), 0);
    assert_eq!((state(), mine()), (2, charged), "CHECKPOINTED, yet the memory stays charged");
    clear(Op::Checkpoint);

    inject(Op::Restore, "fail");
    // SAFETY: null args: restore onto the same GPUs.
    assert_eq!(unsafe { cuCheckpointProcessRestore(pid, std::ptr::null()) }, result::UNKNOWN);
    assert_eq!(state(), 2, "still CHECKPOINTED");
    inject(Op::Restore, "timeout");
    // SAFETY: as above.
    assert_eq!(unsafe { cuCheckpointProcessRestore(pid, std::ptr::null()) }, result::TIMEOUT);
    clear(Op::Restore);
    // SAFETY: as above.
    assert_eq!(unsafe { cuCheckpointProcessRestore(pid, std::ptr::null()) }, 0);
    assert_eq!(cuCheckpointProcessUnlock(pid, std::ptr::null()), 0);
    assert_eq!(cuMemFree_v2(p), result::SUCCESS);
}
