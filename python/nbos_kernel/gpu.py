"""Small GPU workloads through the CUDA driver API with ctypes, so a NotebookOS demo
can "train" without PyTorch.

Inside a NotebookOS kernel ``libcuda.so.1`` is the NotebookOS shim, which forwards to
the host's driver: the real NVIDIA driver, or the fake-cuda TEST DOUBLE on machines
without GPUs. The kernels used here (``fill_f32``, ``axpy_f32``, ``sum_f32``) are the
built-in kernels of fake-cuda; on a real driver a module providing them must be given
(``NBOS_CUDA_MODULE``: a PTX or cubin file, e.g. ``cuda-shim/tests/programs/kernels.ptx``,
the PTX twins of those kernels), because this package ships no GPU code.

Every call is checked; a failure raises :class:`CudaError` naming the call and the
CUresult, never a silent wrong answer.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

__all__ = ["CudaError", "Device", "Buffer", "open_device", "train", "train_step"]

_P = ctypes.c_void_p
_U64 = ctypes.c_uint64
# The driver API version asked of cuGetProcAddress (12.8).
_API_VERSION = 12080


class CudaError(RuntimeError):
    """A CUDA driver call failed."""

    def __init__(self, call: str, code: int):
        super().__init__(f"{call} failed with CUresult {code}")
        self.call = call
        self.code = code


def _library() -> ctypes.CDLL:
    # NBOS_CUDA_LIBRARY names the driver explicitly (tests use fake-cuda directly);
    # otherwise the dynamic loader finds libcuda.so.1 (the shim in NotebookOS kernels).
    return ctypes.CDLL(os.environ.get("NBOS_CUDA_LIBRARY", "libcuda.so.1"))


@dataclass
class Buffer:
    """A float32 array in device memory."""

    device: "Device"
    ptr: ctypes.c_uint64
    n: int

    def to_host(self) -> list[float]:
        out = (ctypes.c_float * self.n)()
        self.device._check("cuMemcpyDtoH", self.device._dtoh(ctypes.cast(out, _P), self.ptr, self.n * 4))
        return list(out)

    def to_numpy(self):
        """The buffer's values as a new numpy float32 array (needs numpy)."""
        import numpy as np

        out = np.empty(self.n, dtype=np.float32)
        self.device._check("cuMemcpyDtoH", self.device._dtoh(_P(out.ctypes.data), self.ptr, self.n * 4))
        return out

    def free(self) -> None:
        if self.ptr.value:
            self.device._check("cuMemFree", self.device._free(self.ptr))
            self.ptr = _U64(0)


class Device:
    """One CUDA device (the kernel's virtual device ``ordinal``) with a context."""

    def __init__(self, ordinal: int = 0):
        self._cu = _library()
        get_proc = getattr(self._cu, "cuGetProcAddress_v2", None)
        if get_proc is not None:
            get_proc.restype = ctypes.c_int
            get_proc.argtypes = [ctypes.c_char_p, ctypes.POINTER(_P), ctypes.c_int, ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
        self._get_proc = get_proc

        self._init = self._fn("cuInit", ctypes.c_uint)
        self._count = self._fn("cuDeviceGetCount", ctypes.POINTER(ctypes.c_int))
        self._device_get = self._fn("cuDeviceGet", ctypes.POINTER(ctypes.c_int), ctypes.c_int)
        self._name = self._fn("cuDeviceGetName", ctypes.c_char_p, ctypes.c_int, ctypes.c_int)
        self._retain = self._fn("cuDevicePrimaryCtxRetain", ctypes.POINTER(_P), ctypes.c_int)
        self._set_current = self._fn("cuCtxSetCurrent", _P)
        self._sync = self._fn("cuCtxSynchronize")
        self._alloc = self._fn("cuMemAlloc", ctypes.POINTER(_U64), ctypes.c_size_t)
        self._free = self._fn("cuMemFree", _U64)
        self._dtoh = self._fn("cuMemcpyDtoH", _P, _U64, ctypes.c_size_t)
        self._htod = self._fn("cuMemcpyHtoD", _U64, _P, ctypes.c_size_t)
        self._load_data = self._fn("cuModuleLoadData", ctypes.POINTER(_P), ctypes.c_char_p)
        self._get_function = self._fn("cuModuleGetFunction", ctypes.POINTER(_P), _P, ctypes.c_char_p)
        self._launch = self._fn("cuLaunchKernel", _P, *([ctypes.c_uint] * 7), _P, ctypes.POINTER(_P), _P)

        self._check("cuInit", self._init(0))
        n = ctypes.c_int(-1)
        self._check("cuDeviceGetCount", self._count(ctypes.byref(n)))
        if not 0 <= ordinal < n.value:
            raise ValueError(f"device {ordinal} does not exist: this kernel sees {n.value} device(s)")
        self.count = n.value
        self.ordinal = ordinal
        dev, self._ctx = ctypes.c_int(), _P()
        self._check("cuDeviceGet", self._device_get(ctypes.byref(dev), ordinal))
        name = ctypes.create_string_buffer(256)
        self._check("cuDeviceGetName", self._name(name, 256, dev))
        self.name = name.value.decode(errors="replace")
        self._check("cuDevicePrimaryCtxRetain", self._retain(ctypes.byref(self._ctx), dev))
        self._check("cuCtxSetCurrent", self._set_current(self._ctx))
        module_path = os.environ.get("NBOS_CUDA_MODULE")
        image = open(module_path, "rb").read() + b"\0" if module_path else b""
        self._module = _P()
        self._check("cuModuleLoadData", self._load_data(ctypes.byref(self._module), image))
        self._kernels = {}
        for k in ("fill_f32", "axpy_f32", "sum_f32"):
            f = _P()
            self._check(f"cuModuleGetFunction({k})", self._get_function(ctypes.byref(f), self._module, k.encode()))
            self._kernels[k] = f

    def _fn(self, name: str, *argtypes):
        proto = ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)
        if self._get_proc is not None:
            p, status = _P(), ctypes.c_int(-1)
            r = self._get_proc(name.encode(), ctypes.byref(p), _API_VERSION, 0, ctypes.byref(status))
            if r == 0 and status.value == 0 and p.value:
                return proto(p.value)
        for symbol in (name + "_v2", name):
            f = getattr(self._cu, symbol, None)
            if f is not None:
                return proto(ctypes.cast(f, _P).value)
        raise CudaError(f"resolving {name}", -1)

    @staticmethod
    def _check(call: str, code: int) -> None:
        if code != 0:
            raise CudaError(call, code)

    def _run(self, kernel: str, *args) -> None:
        arr = (_P * len(args))(*[ctypes.cast(ctypes.byref(a), _P) for a in args])
        self._check(f"cuLaunchKernel({kernel})", self._launch(self._kernels[kernel], 1, 1, 1, 256, 1, 1, 0, None, arr, None))

    def buffer(self, n: int, value: float = 0.0) -> Buffer:
        """Allocates ``n`` float32 values on the device, all ``value``."""
        ptr = _U64()
        self._check("cuMemAlloc", self._alloc(ctypes.byref(ptr), n * 4))
        buf = Buffer(self, ptr, n)
        self._run("fill_f32", buf.ptr, ctypes.c_float(value), _U64(n))
        return buf

    def upload(self, values) -> Buffer:
        """Copies a float32 array (numpy, or anything with a float32 buffer) to the device."""
        view = memoryview(values).cast("B")
        if view.nbytes % 4:
            raise ValueError(f"upload of {view.nbytes} bytes: not a whole number of float32 values")
        n = view.nbytes // 4
        host = (ctypes.c_char * view.nbytes).from_buffer_copy(view)
        ptr = _U64()
        self._check("cuMemAlloc", self._alloc(ctypes.byref(ptr), view.nbytes))
        buf = Buffer(self, ptr, n)
        self._check("cuMemcpyHtoD", self._htod(buf.ptr, ctypes.cast(host, _P), view.nbytes))
        return buf

    def axpy(self, y: Buffer, x: Buffer, a: float) -> None:
        """``y += a * x`` on the device."""
        if x.n != y.n:
            raise ValueError(f"axpy of arrays of {x.n} and {y.n} values")
        self._run("axpy_f32", y.ptr, x.ptr, ctypes.c_float(a), _U64(y.n))

    def sum(self, x: Buffer) -> float:
        """The sum of ``x``, computed on the device."""
        out = self.buffer(1)
        try:
            self._run("sum_f32", out.ptr, x.ptr, _U64(x.n))
            self._check("cuCtxSynchronize", self._sync())
            return out.to_host()[0]
        finally:
            out.free()


def open_device(ordinal: int = 0) -> Device:
    """Opens virtual device ``ordinal`` of this kernel."""
    return Device(ordinal)


def train(steps: int = 100, n: int = 1 << 16, lr: float = 0.01, device: Device | None = None) -> float:
    """A stand-in for a training loop: ``steps`` updates ``w += lr * g`` of ``n``
    weights on the GPU. Returns the sum of the weights, ``n * steps * lr``, so a
    caller can check that the GPU really computed (also across evictions)."""
    dev = device or open_device()
    w = dev.buffer(n, 0.0)
    g = dev.buffer(n, 1.0)
    try:
        for _ in range(steps):
            dev.axpy(w, g, lr)
        return dev.sum(w)
    finally:
        w.free()
        g.free()


_device: Device | None = None


def train_step(w, steps: int = 100, lr: float = 0.01):
    """One "epoch" on weights kept in host memory (a numpy float32 array): copy them to
    the GPU, run ``steps`` updates ``w += lr * 1``, copy them back. Returns the new
    array. Weights that live in host memory between cells are what NotebookOS
    synchronises to a kernel's other replicas, so the next cell may run on any of them.
    The device is opened once per process (it is process state, not user state)."""
    global _device
    if _device is None:
        _device = open_device()
    dev = _device
    wb = dev.upload(w)
    g = dev.buffer(wb.n, 1.0)
    try:
        for _ in range(steps):
            dev.axpy(wb, g, lr)
        return wb.to_numpy()
    finally:
        wb.free()
        g.free()
