"""kernel.memory_limit_mib with kernel.limit_address_space: a cell that allocates past the
limit gets a MemoryError in its reply and the kernel keeps its other state. (Without
limit_address_space, the shipped default since CUDA reserves more address space than it
uses, only the memory cgroup bounds the kernel.)"""

import json
import uuid

import pytest
import websocket
from nbos_harness import Daemon


@pytest.fixture(scope="module")
def limited():
    d = Daemon(memory_limit_mib=1024, limit_address_space=True)
    yield d
    d.stop()


def test_allocation_beyond_the_limit_is_a_memoryerror_not_a_dead_kernel(limited):
    from nbos_testkit import run_cell
    from test_gpu_binding import call, connect

    d = limited
    status, k = call(d, "POST", "/api/kernels", {"name": "python3"})
    assert status == 201, k
    ws = connect(d, k["id"])
    assert run_cell(ws, "keep = 'still here'").reply["status"] == "ok"
    r = run_cell(ws, "big = bytearray(2 * 1024**3)")
    assert r.reply["status"] == "error" and r.reply["ename"] == "MemoryError", r.reply
    r = run_cell(ws, "print(keep)")
    assert r.stdout.strip() == "still here"
    ws.close()
    call(d, "DELETE", f"/api/kernels/{k['id']}")
