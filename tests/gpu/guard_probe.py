"""A CUDA program driven line by line, for the GPU device guard's check on a GPU host
(daemon/tests/device_guard.rs, `the_real_driver_under_the_device_guard`).

Usage: guard_probe.py LIBCUDA. Reads commands on stdin and answers each with one JSON line:
  init   cuInit(0) and cuDeviceGetCount
  use    primary context on device 0, cuMemAlloc/cuMemFree of 1 MiB, context released
  exit
Each answer lists the /dev/nvidia* files the process holds open, which is what the guard
(checked at open(2)) can and cannot stop. The driver is loaded at `init`, not before, so
the test can move the process into its cgroup first.
"""

import ctypes
import json
import os
import sys


def open_nvidia_files():
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            found.add(target)
    return sorted(found)


def answer(**fields):
    fields["files"] = open_nvidia_files()
    print(json.dumps(fields), flush=True)


def main():
    cuda = None
    for line in sys.stdin:
        command = line.strip()
        if command == "init":
            cuda = ctypes.CDLL(sys.argv[1])
            rc = cuda.cuInit(0)
            count = ctypes.c_int(-1)
            if rc == 0:
                rc = cuda.cuDeviceGetCount(ctypes.byref(count))
            answer(step="init", rc=rc, count=count.value)
        elif command == "use":
            if cuda is None:
                answer(step="use", rc=-1, error="use before init")
                continue
            dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
            rc = cuda.cuDeviceGet(ctypes.byref(dev), 0)
            if rc == 0:
                rc = cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
                if rc == 0:
                    rc = cuda.cuCtxSetCurrent(ctx)
                    if rc == 0:
                        rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), 1 << 20)
                    if rc == 0:
                        rc = cuda.cuMemFree_v2(ptr)
                    cuda.cuCtxSetCurrent(None)
                    cuda.cuDevicePrimaryCtxRelease_v2(dev)
            answer(step="use", rc=rc)
        elif command == "exit":
            return


if __name__ == "__main__":
    main()
