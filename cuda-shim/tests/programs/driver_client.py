"""The Python side of the lease tests: ctypes through the shim (libcuda.so.1 found via
LD_LIBRARY_PATH), every entry point resolved with cuGetProcAddress_v2, computing with
the fake-cuda TEST DOUBLE's built-in kernels. Prints "PY COUNT <n> SUM <s>"."""
import ctypes
import sys

cu = ctypes.CDLL("libcuda.so.1")
get_proc = cu.cuGetProcAddress_v2
get_proc.restype = ctypes.c_int
get_proc.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64,
                     ctypes.POINTER(ctypes.c_int)]
P = ctypes.c_void_p
U64 = ctypes.c_uint64


def fn(name, *argtypes):
    p, status = ctypes.c_void_p(), ctypes.c_int(-1)
    r = get_proc(name.encode(), ctypes.byref(p), 12080, 0, ctypes.byref(status))
    if r != 0 or status.value != 0 or not p.value:
        sys.exit(f"resolve {name}: {r} {status.value}")
    return ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(p.value)


def check(r, what):
    if r != 0:
        sys.exit(f"{what} failed: {r}")


init = fn("cuInit", ctypes.c_uint)
count = fn("cuDeviceGetCount", ctypes.POINTER(ctypes.c_int))
device_get = fn("cuDeviceGet", ctypes.POINTER(ctypes.c_int), ctypes.c_int)
retain = fn("cuDevicePrimaryCtxRetain", ctypes.POINTER(P), ctypes.c_int)
set_current = fn("cuCtxSetCurrent", P)
alloc = fn("cuMemAlloc", ctypes.POINTER(U64), ctypes.c_size_t)
dtoh = fn("cuMemcpyDtoH", P, U64, ctypes.c_size_t)
load = fn("cuModuleLoadData", ctypes.POINTER(P), ctypes.c_char_p)
get_fn = fn("cuModuleGetFunction", ctypes.POINTER(P), P, ctypes.c_char_p)
launch = fn("cuLaunchKernel", P, *([ctypes.c_uint] * 7), P, ctypes.POINTER(P), P)

check(init(0), "cuInit")
n = ctypes.c_int(-1)
check(count(ctypes.byref(n)), "cuDeviceGetCount")
dev, ctx, mod = ctypes.c_int(), P(), P()
check(device_get(ctypes.byref(dev), 0), "cuDeviceGet")
check(retain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
check(set_current(ctx), "cuCtxSetCurrent")
check(load(ctypes.byref(mod), b""), "cuModuleLoadData")
fill, total = P(), P()
check(get_fn(ctypes.byref(fill), mod, b"fill_f32"), "fill_f32")
check(get_fn(ctypes.byref(total), mod, b"sum_f32"), "sum_f32")
N = 1000
x, out = U64(), U64()
check(alloc(ctypes.byref(x), N * 4), "cuMemAlloc x")
check(alloc(ctypes.byref(out), 4), "cuMemAlloc out")


def run(f, *args):
    arr = (P * len(args))(*[ctypes.cast(ctypes.byref(a), P) for a in args])
    check(launch(f, 1, 1, 1, 32, 1, 1, 0, None, arr, None), "cuLaunchKernel")


value, count_arg = ctypes.c_float(0.5), U64(N)
run(fill, x, value, count_arg)
run(total, out, x, count_arg)
s = ctypes.c_float(-1)
check(dtoh(ctypes.byref(s), out, 4), "cuMemcpyDtoH")
print(f"PY COUNT {n.value} SUM {s.value:.1f}", flush=True)
