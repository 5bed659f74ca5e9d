"""nbos_kernel.gpu does real work on a CUDA driver through ctypes: here the
fake-cuda TEST DOUBLE (built by cargo), loaded directly (the shim is not yet put
into kernels by the daemon)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from nbos_harness import REPO, bin_dir


@pytest.fixture(scope="module")
def fake_cuda(tmp_path_factory) -> dict:
    subprocess.run(["cargo", "build", "-q", "-p", "fake-cuda"], cwd=REPO, check=True)
    lib = bin_dir() / "libfake_cuda.so"
    assert lib.exists(), lib
    state = tmp_path_factory.mktemp("fake-cuda-state")
    return {**os.environ, "NBOS_CUDA_LIBRARY": str(lib), "FAKE_CUDA_STATE_DIR": str(state), "PYTHONPATH": str(REPO / "python")}


def run_python(code: str, env: dict) -> str:
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_train_computes_on_the_device(fake_cuda):
    out = run_python(
        "from nbos_kernel import gpu; d = gpu.open_device(); print(d.count, round(gpu.train(steps=50, n=4096, lr=0.5, device=d), 1))",
        fake_cuda,
    )
    count, total = out.split()
    assert int(count) >= 1
    assert float(total) == 4096 * 50 * 0.5


def test_errors_name_the_call(fake_cuda):
    out = run_python(
        "from nbos_kernel import gpu\n"
        "try:\n    gpu.open_device(99)\nexcept ValueError as e:\n    print('refused:', e)\n",
        fake_cuda,
    )
    assert "device 99 does not exist" in out
