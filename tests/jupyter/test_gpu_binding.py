"""Per-cell GPU binding with simulated GPUs: kernels take turns on one GPU, a
waiting cell is told it waits, a killed kernel frees its GPU at once, and a cell
that asks for more GPUs than the host has gets a clear error in its reply."""

import json
import os
import signal
import threading
import time
import urllib.request

import pytest
import websocket
from nbos_harness import Daemon, kill_until_given_up, wait_for
from nbos_testkit import run_cell

# The per-cell GPU commitment is bookkeeping in the daemon's scheduler (the
# lease server enforces it inside the process with the CUDA shim); these tests
# check the scheduling a client sees.


@pytest.fixture(scope="module")
def one_gpu():
    # The ratio this test checks (3 kernels on 1 GPU), not the shipped default.
    d = Daemon(fake_gpus=1, idle_release="2s", gpu_extra={"subscription_ratio": 3.0})
    yield d
    d.stop()


def call(d: Daemon, method: str, path: str, body=None):
    req = urllib.request.Request(d.url + path, method=method, data=json.dumps(body).encode() if body else None)
    req.add_header("Authorization", f"token {d.token}")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def connect(d: Daemon, kernel_id: str):
    return websocket.create_connection(
        d.url.replace("http", "ws") + f"/api/kernels/{kernel_id}/channels",
        header=[f"Authorization: token {d.token}"],
        timeout=120,
    )


def gpus_view(d: Daemon) -> dict:
    return call(d, "GET", "/api/v1/gpus")[1]


def test_three_kernels_take_turns_on_one_gpu(one_gpu):
    d = one_gpu
    kernels = [call(d, "POST", "/api/kernels", {"name": "notebookos-python-1gpu"})[1]["id"] for _ in range(3)]
    results = {}

    def worker(k):
        ws = connect(d, k)
        # The cell keeps a value in the kernel; the next cell checks it survived.
        first = run_cell(ws, "import time; t0 = time.time(); time.sleep(1.0); t1 = time.time(); print(t0, t1); data = list(range(1000))")
        results[k] = (first, run_cell(ws, "print(sum(data))"))
        ws.close()

    threads = [threading.Thread(target=worker, args=(k,)) for k in kernels]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(results) == 3
    spans = []
    for k, (r, after) in results.items():
        assert r.reply["status"] == "ok", r
        t0, t1 = map(float, r.stdout.split())
        spans.append((t0, t1))
        assert after.stdout.strip() == str(sum(range(1000)))
    spans.sort()
    for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
        assert a1 <= b0, f"two cells held the only GPU at once: {spans}"
    waited = [r for r, _ in results.values() if "[NotebookOS] waiting for 1 GPU" in r.stderr]
    assert waited, "no client was told its cell waits for a GPU"
    # Per-cell binding bound less GPU time than reserving the GPU for each session.
    view = gpus_view(d)
    assert 0 < view["gpu_seconds_bound"] < view["gpu_seconds_reserved"], view
    metrics = urllib.request.urlopen(d.url + "/metrics", timeout=10).read().decode()
    assert "notebookos_subscription_ratio 3.0" in metrics, metrics
    # A fourth 1-GPU kernel would exceed the subscription ratio (3 x 1 GPU).
    status, body = call(d, "POST", "/api/kernels", {"name": "notebookos-python-1gpu"})
    assert status == 503 and "oversubscribed" in body, (status, body)
    for k in kernels:
        assert call(d, "DELETE", f"/api/kernels/{k}")[0] == 204
    assert gpus_view(d)["holders"] == ["free"]


def test_a_killed_kernel_frees_its_gpu_within_a_second(one_gpu):
    d = one_gpu
    a = call(d, "POST", "/api/kernels", {"name": "notebookos-python-1gpu"})[1]
    b = call(d, "POST", "/api/kernels", {"name": "notebookos-python-1gpu"})[1]
    wa, wb = connect(d, a["id"]), connect(d, b["id"])
    wa.send(json.dumps({"header": {"msg_id": "long", "msg_type": "execute_request", "session": "s"}, "content": {"code": "import time; time.sleep(300)"}}))
    wait_for(lambda: gpus_view(d)["holders"] == [f"committed:{a['id']}"], 10, "kernel A to hold the GPU")
    result = {}
    t = threading.Thread(target=lambda: result.update(cell=run_cell(wb, "print('B ran')")))
    t.start()
    wait_for(lambda: gpus_view(d)["waiting"], 10, "kernel B's cell to wait")
    metrics = urllib.request.urlopen(d.url + "/metrics", timeout=10).read().decode()
    assert "notebookos_cells_waiting_for_gpus 1" in metrics and "notebookos_gpus_committed 1" in metrics, metrics
    os.kill(a["pids"][0], signal.SIGKILL)
    wait_for(lambda: gpus_view(d)["holders"] != [f"committed:{a['id']}"], 1.0, "the dead kernel's GPU to be freed")
    t.join(timeout=60)
    assert result["cell"].reply["status"] == "ok" and "B ran" in result["cell"].stdout
    wa.close()
    wb.close()
    for k in (a, b):
        call(d, "DELETE", f"/api/kernels/{k['id']}")


def test_a_cell_needing_more_gpus_than_the_host_has_gets_an_error_reply(one_gpu):
    d = one_gpu
    k = call(d, "POST", "/api/kernels", {"name": "notebookos-python-2gpu"})[1]
    ws = connect(d, k["id"])
    r = run_cell(ws, "print('should not run')")
    assert r.reply["status"] == "error"
    assert r.reply["ename"] == "NotEnoughGPUs"
    assert "needs 2 GPUs but the host has 1" in r.reply["evalue"]
    assert "should not run" not in r.stdout
    # A CPU-only request on the same kernel is unaffected.
    ws.send(json.dumps({"header": {"msg_id": "ki", "msg_type": "kernel_info_request", "session": "s"}, "content": {}}))
    while json.loads(ws.recv())["msg_type"] != "kernel_info_reply":
        pass
    ws.close()
    call(d, "DELETE", f"/api/kernels/{k['id']}")


def test_idle_held_gpu_is_released_after_idle_release(one_gpu):
    d = one_gpu
    k = call(d, "POST", "/api/kernels", {"name": "notebookos-python-1gpu"})[1]
    ws = connect(d, k["id"])
    assert run_cell(ws, "1").reply["status"] == "ok"
    assert gpus_view(d)["holders"] == [f"idle:{k['id']}"]
    wait_for(lambda: gpus_view(d)["holders"] == ["free"], 10, "idle_release (2 s) to free the GPU")
    ws.close()
    call(d, "DELETE", f"/api/kernels/{k['id']}")


def test_restarting_a_kernel_mid_cell_frees_its_gpu_and_answers_its_waiting_cells(one_gpu):
    d = one_gpu
    a = call(d, "POST", "/api/kernels", {"name": "notebookos-python-1gpu"})[1]
    wa = connect(d, a["id"])
    wa.send(json.dumps({"header": {"msg_id": "long", "msg_type": "execute_request", "session": "s"}, "content": {"code": "import time; time.sleep(300)"}}))
    # A second cell of the same kernel waits behind the first.
    wa.send(json.dumps({"header": {"msg_id": "next", "msg_type": "execute_request", "session": "s"}, "content": {"code": "print('never')"}}))
    wait_for(lambda: gpus_view(d)["holders"] == [f"committed:{a['id']}"], 10, "kernel A to hold the GPU")
    status, model = call(d, "POST", f"/api/kernels/{a['id']}/restart")
    assert status == 200, model
    assert gpus_view(d)["holders"] == ["free"]
    replies = {}
    deadline = time.monotonic() + 30
    while "next" not in replies and time.monotonic() < deadline:
        m = json.loads(wa.recv())
        if m["msg_type"] == "execute_reply":
            replies[m["parent_header"]["msg_id"]] = m["content"]
    assert replies["next"]["ename"] == "KernelRestarted", replies
    # The restarted kernel runs new cells on the GPU.
    r = run_cell(wa, "print('after restart')")
    assert r.reply["status"] == "ok" and "after restart" in r.stdout
    wa.close()
    call(d, "DELETE", f"/api/kernels/{a['id']}")


def test_a_gpu_kernel_that_is_given_up_answers_its_cells_with_errors(one_gpu):
    """A GPU kernel that keeps dying right after it starts is given up (`dead`, GPU freed);
    a cell sent to it then gets an error reply from binding, never silence."""
    d = one_gpu
    k = call(d, "POST", "/api/kernels", {"name": "notebookos-python-1gpu"})[1]
    ws = connect(d, k["id"])
    kill_until_given_up(lambda: call(d, "GET", f"/api/kernels/{k['id']}")[1], k["pids"][0])
    assert gpus_view(d)["holders"] == ["free"]
    r = run_cell(ws, "print('never')")
    assert r.reply["status"] == "error" and r.reply["ename"] == "DeadKernel", r
    assert "never" not in r.stdout
    ws.close()
    call(d, "DELETE", f"/api/kernels/{k['id']}")
