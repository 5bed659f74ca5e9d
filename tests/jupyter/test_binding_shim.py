"""Kernels run under the CUDA shim with the lease server: three kernels on one
simulated GPU (fake-cuda TEST DOUBLE) do real device work in turns through the
gateway, never two holding the GPU at once, and each kernel's device data
survives the evictions that hand the GPU to the others."""

import json
import os
import signal
import threading
import time
import urllib.request

import pytest
from nbos_harness import Daemon
from test_gpu_binding import call, connect
from nbos_testkit import run_cell


@pytest.fixture(scope="module")
def one_gpu():
    d = Daemon(fake_gpus=1, idle_release="1s")
    yield d
    d.stop()


def metrics(d: Daemon) -> str:
    req = urllib.request.Request(d.url + "/metrics")
    req.add_header("Authorization", f"token {d.token}")
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


def metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_kernels_load_the_shim_and_share_one_gpu_with_device_data_intact(one_gpu):
    d = one_gpu
    kernels = [call(d, "POST", "/api/kernels", {"name": "notebookos-python-1gpu"})[1]["id"] for _ in range(3)]
    results = {}
    errors = []

    def worker(i, k):
        try:
            ws = connect(d, k)
            # Cell 1: the shim is what the kernel loaded as libcuda.so.1; fill device memory.
            first = run_cell(
                ws,
                "import os\n"
                "from nbos_kernel import gpu\n"
                "dev = gpu.open_device()\n"
                f"buf = dev.buffer(4096, {i + 1}.0)\n"
                "maps = open('/proc/self/maps').read()\n"
                "print('SHIM', any(l.endswith('/cuda/libcuda.so.1') for l in maps.splitlines()))\n"
                "print('PRELOAD', os.environ.get('LD_PRELOAD', ''))\n",
            )
            # Cell 2: a little training, while the others want the GPU too.
            second = run_cell(ws, "print('TRAIN', gpu.train(steps=5, n=4096, lr=1.0, device=dev))")
            # Cell 3: the buffer from cell 1, after the GPU served the other kernels.
            third = run_cell(ws, "print('SUM', dev.sum(buf))")
            ws.close()
            results[k] = (first, second, third)
        except Exception as e:  # reported below with the kernel
            errors.append((k, repr(e)))

    # Sample the lease server while the kernels run: a GPU is never held by two
    # processes at once (bound, idle-held or still being revoked).
    overlaps, samples, done = [], [], threading.Event()

    def sample():
        while not done.is_set():
            leases = call(d, "GET", "/api/v1/leases")[1]
            holders = [l for l in leases if 0 in l["gpus"]]
            samples.append(leases)
            if len(holders) > 1:
                overlaps.append(holders)

    sampler = threading.Thread(target=sample)
    sampler.start()
    threads = [threading.Thread(target=worker, args=(i, k)) for i, k in enumerate(kernels)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    done.set()
    sampler.join()
    assert not errors, errors
    assert not overlaps, overlaps[:3]
    assert any(l["gpus"] == [0] for leases in samples for l in leases), "the sampler never saw a lease"
    assert {l["kernel_id"] for l in call(d, "GET", "/api/v1/leases")[1]} == set(kernels)
    for i, k in enumerate(kernels):
        first, second, third = results[k]
        for cell in (first, second, third):
            assert cell.reply["status"] == "ok", (k, cell)
        assert "SHIM True" in first.stdout, first
        assert "/cuda/libcuda.so.1" in first.stdout, first
        assert "TRAIN" in second.stdout, second
        assert f"SUM {4096 * (i + 1)}.0" in third.stdout, (k, third)

    text = metrics(d)
    # Every kernel got the GPU through the lease server at least once, and turns
    # were taken by revoking (evicting) leases, never by sharing the GPU.
    assert metric(text, "notebookos_lease_grants_total") >= 3, text
    assert metric(text, "notebookos_lease_revocations_total") >= 2, text
    assert metric(text, "notebookos_lease_acquire_seconds_count") >= 3, text
    assert metric(text, 'notebookos_gpu_evictions_total{mode="checkpoint"}') >= 2, text
    assert 'notebookos_observer_mode{mode="' in text, text
    for k in kernels:
        call(d, "DELETE", f"/api/kernels/{k}")


def send_cell(ws, msg_id: str, code: str) -> None:
    ws.send(json.dumps({"header": {"msg_id": msg_id, "msg_type": "execute_request", "session": "s"}, "content": {"code": code}}))


def read_until(ws, msg_id: str, pred) -> dict:
    """Reads the cell's messages until `pred(message)` holds; returns that message."""
    while True:
        m = json.loads(ws.recv())
        if m["parent_header"].get("msg_id") == msg_id and pred(m):
            return m


def test_a_kernel_killed_mid_cell_frees_its_lease_for_the_next_kernel(one_gpu):
    d = one_gpu
    holder, waiter = (call(d, "POST", "/api/kernels", {"name": "notebookos-python-1gpu"})[1]["id"] for _ in range(2))
    ws_h, ws_w = connect(d, holder), connect(d, waiter)
    run_cell(ws_h, "print('ready')")
    # The pid an operator sees (`ps`, the API): inside its PID namespace the kernel is pid 2.
    pid = call(d, "GET", f"/api/kernels/{holder}")[1]["pids"][0]
    grants = metric(metrics(d), "notebookos_lease_grants_total")
    # The holder computes on the GPU until it is killed.
    send_cell(ws_h, "spin", "from nbos_kernel import gpu\ndev = gpu.open_device()\nwhile True: gpu.train(steps=5, n=1024, device=dev)")
    deadline = time.monotonic() + 60
    while metric(metrics(d), "notebookos_lease_grants_total") <= grants:
        assert time.monotonic() < deadline, "the holder never got a lease"
        time.sleep(0.05)
    # The waiter's cell is told it waits for the GPU.
    code = "from nbos_kernel import gpu\nprint('VALUE', gpu.open_device().buffer(1024, 2.0).to_host()[0])"
    send_cell(ws_w, "wait", code)
    read_until(ws_w, "wait", lambda m: m["msg_type"] == "stream" and "waiting for" in m["content"]["text"])
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    started = read_until(ws_w, "wait", lambda m: m["msg_type"] == "execute_input")
    took = time.monotonic() - killed
    print(f"the waiting cell started {took:.3f} s after the holder was killed")
    out = read_until(ws_w, "wait", lambda m: m["msg_type"] == "stream" and "VALUE" in m["content"]["text"])
    assert started and "VALUE 2.0" in out["content"]["text"], out
    reply = read_until(ws_w, "wait", lambda m: m["msg_type"] == "execute_reply")
    assert reply["content"]["status"] == "ok", reply
    ws_h.close()
    ws_w.close()
    for k in (holder, waiter):
        call(d, "DELETE", f"/api/kernels/{k}")


def test_graceful_shutdown_stops_kernels_and_the_lease_server():
    d = Daemon(fake_gpus=1, idle_release="30s")
    try:
        k = call(d, "POST", "/api/kernels", {"name": "notebookos-python-1gpu"})[1]["id"]
        ws = connect(d, k)
        # The kernel holds (idle-held) the GPU lease when the daemon is told to stop.
        run_cell(ws, "from nbos_kernel import gpu\nb = gpu.open_device().buffer(16, 1.0)")
        pid = call(d, "GET", f"/api/kernels/{k}")[1]["pids"][0]
        ws.close()
        sock = d.dir / "run" / "lease.sock"
        assert sock.exists()
    finally:
        d.proc.send_signal(signal.SIGTERM)
        code = d.proc.wait(timeout=60)
    assert code == 0, (d.dir / "daemon.log").read_text()
    # Nothing orphaned: the kernel process is gone and the lease socket removed.
    assert not os.path.exists(f"/proc/{pid}"), f"kernel process {pid} outlived the daemon"
    assert not sock.exists(), "the lease socket outlived the daemon"


def test_a_restarted_kernel_may_lease_again(one_gpu):
    d = one_gpu
    k = call(d, "POST", "/api/kernels", {"name": "notebookos-python-1gpu"})[1]["id"]
    code = "from nbos_kernel import gpu\nprint('VALUE', gpu.open_device().buffer(64, 3.0).to_host()[0])"
    ws = connect(d, k)
    assert "VALUE 3.0" in run_cell(ws, code).stdout
    ws.close()
    status, _ = call(d, "POST", f"/api/kernels/{k}/restart")
    assert status == 200
    # The new process is registered with the lease server: its shim is not refused.
    ws = connect(d, k)
    out = run_cell(ws, code)
    assert out.reply["status"] == "ok" and "VALUE 3.0" in out.stdout, out
    ws.close()
    call(d, "DELETE", f"/api/kernels/{k}")
