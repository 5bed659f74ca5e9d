"""gpu.device_guard = "ebpf" end to end: a real kernel (created over REST, cells over the
WebSocket) opens GPU device files itself, bypassing the CUDA shim, before, while and after
it holds a GPU lease (fake-cuda TEST DOUBLE GPUs). The device files are made with mknod
(no GPU needed): EPERM is the kernel's cgroup refusing; ENXIO means the open got past the
cgroup and found no driver behind major 195. Needs root (mknod, cgroups, BPF); under
NBOS_REQUIRE_PRIVILEGED=1 it must run."""

import errno
import os
import stat
import tempfile

import pytest
from nbos_harness import Daemon, wait_for
from test_binding_shim import metric, metrics
from test_gpu_binding import call, connect
from nbos_testkit import run_cell

PROBE = """
import os
def probe(p):
    try:
        os.close(os.open(p, os.O_RDWR))
        return 0
    except OSError as e:
        return e.errno
print('ERRNO', *[probe(p) for p in {paths!r}])
"""


def cannot_run(why: str):
    if os.environ.get("NBOS_REQUIRE_PRIVILEGED") == "1":
        pytest.fail(f"NBOS_REQUIRE_PRIVILEGED=1 but the device guard test cannot run: {why}")
    pytest.skip(why)


def errnos(ws, paths) -> list[int]:
    out = run_cell(ws, PROBE.format(paths=[str(p) for p in paths]))
    assert out.reply["status"] == "ok", out
    line = next(l for l in out.stdout.splitlines() if l.startswith("ERRNO"))
    return [int(x) for x in line.split()[1:]]


def test_a_kernel_opens_a_gpu_device_file_only_while_it_holds_that_gpus_lease():
    if os.geteuid() != 0:
        cannot_run("needs root (mknod, cgroups, BPF)")
    nodes = tempfile.mkdtemp(prefix="nbos-device-guard-")
    os.chmod(nodes, 0o755)
    paths = [os.path.join(nodes, n) for n in ("nvidia0", "nvidia1", "nvidiactl")]
    for p, minor in zip(paths, (0, 1, 255)):
        os.mknod(p, stat.S_IFCHR | 0o666, os.makedev(195, minor))
        os.chmod(p, 0o666)
    paths.append("/dev/null")

    d = Daemon(fake_gpus=2, idle_release="1s", gpu_extra={"device_guard": "ebpf"})
    try:
        kernel = call(d, "POST", "/api/kernels", {"name": "notebookos-python-1gpu"})[1]["id"]
        ws = connect(d, kernel)
        # Before any lease: no GPU device file opens; nvidiactl and /dev/null are untouched.
        assert errnos(ws, paths) == [errno.EPERM, errno.EPERM, errno.ENXIO, 0]

        # While it holds a lease (the shim acquires one for the allocation).
        run_cell(ws, "from nbos_kernel import gpu\ndev = gpu.open_device()\nbuf = dev.buffer(4096, 1.0)\n")
        held = [l for l in call(d, "GET", "/api/v1/leases")[1] if l["kernel_id"] == kernel and l["gpus"]]
        assert held, "the cell's allocation holds a lease"
        leased = held[0]["gpus"][0]
        during = errnos(ws, paths)
        expected = [errno.EPERM, errno.EPERM, errno.ENXIO, 0]
        expected[leased] = errno.ENXIO
        assert during == expected, (leased, during)

        # After the idle lease is revoked (gpu.idle_release = 1s): refused again.
        wait_for(
            lambda: not any(
                l["gpus"] for l in call(d, "GET", "/api/v1/leases")[1] if l["kernel_id"] == kernel
            ),
            30,
            "the idle lease to be revoked",
        )
        assert errnos(ws, paths) == [errno.EPERM, errno.EPERM, errno.ENXIO, 0]
        ws.close()

        wait_for(lambda: metric(metrics(d), "notebookos_gpu_device_guard_denials_total") >= 5, 10, "denials")
        text = metrics(d)
        assert metric(text, 'notebookos_gpu_device_guard_updates_total{change="grant"}') >= 1, text
        assert metric(text, 'notebookos_gpu_device_guard_updates_total{change="release"}') >= 1, text
    finally:
        d.stop()
