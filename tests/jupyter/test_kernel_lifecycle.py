"""Kernel lifecycle through the REST API: output replayed after a reconnect,
interrupt, restart, a kernel that dies, and delete cleaning up its process."""

import json
import os
import signal
import time
import urllib.request
import uuid

import websocket
from nbos_harness import daemon, wait_for
from test_bad_input import execute, http


def connect(kernel_id: str):
    d = daemon()
    return websocket.create_connection(
        d.url.replace("http", "ws") + f"/api/kernels/{kernel_id}/channels",
        header=[f"Authorization: token {d.token}"],
        timeout=60,
    )


def new_kernel() -> dict:
    status, model = http("POST", "/api/kernels", daemon().token, {"name": "python3"})
    assert status == 201, model
    return model


def model_of(kernel_id: str) -> dict:
    status, model = http("GET", f"/api/kernels/{kernel_id}", daemon().token)
    assert status == 200, model
    return model


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is not alive for our purpose.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def send_execute(ws, code: str) -> str:
    msg_id = uuid.uuid4().hex
    ws.send(
        json.dumps(
            {
                "header": {"msg_id": msg_id, "msg_type": "execute_request", "session": "t", "username": "t", "version": "5.3"},
                "content": {"code": code, "silent": False},
                "channel": "shell",
            }
        )
    )
    return msg_id


def test_output_while_disconnected_is_replayed_on_reconnect():
    k = new_kernel()
    try:
        ws = connect(k["id"])
        msg_id = send_execute(ws, "import time; time.sleep(1); print('while you were away')")
        # Wait until the cell is running, then leave.
        wait_for(lambda: model_of(k["id"])["execution_state"] == "busy", 30, "the cell to start")
        ws.close()
        wait_for(lambda: model_of(k["id"])["execution_state"] == "idle", 30, "the cell to finish")
        ws = connect(k["id"])
        seen = set()
        deadline = time.monotonic() + 30
        # The replay keeps arrival order, and shell and iopub have none between them.
        while not {"stream", "execute_reply"} <= seen and time.monotonic() < deadline:
            m = json.loads(ws.recv())
            if m["parent_header"].get("msg_id") == msg_id:
                seen.add(m["msg_type"])
                if m["msg_type"] == "stream":
                    assert "while you were away" in m["content"]["text"]
        assert {"stream", "execute_reply"} <= seen, seen
        ws.close()
    finally:
        http("DELETE", f"/api/kernels/{k['id']}", daemon().token)


def test_interrupt_restart_and_delete():
    d = daemon()
    k = new_kernel()
    ws = connect(k["id"])
    assert execute(ws, "x = 5; x")["value"] == "5"
    msg_id = send_execute(ws, "import time; print('started', flush=True); time.sleep(120)")
    # Interrupt once the cell's code runs (a SIGINT that lands while ipykernel is
    # still setting the cell up is a different test).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = json.loads(ws.recv())
        if m["msg_type"] == "stream" and "started" in m["content"]["text"]:
            break
    assert http("POST", f"/api/kernels/{k['id']}/interrupt", d.token)[0] == 204
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = json.loads(ws.recv())
        if m["msg_type"] == "execute_reply" and m["parent_header"]["msg_id"] == msg_id:
            assert m["content"]["status"] == "error" and m["content"]["ename"] == "KeyboardInterrupt"
            break
    else:
        raise AssertionError("no reply after the interrupt")

    old_pid = model_of(k["id"])["pids"][0]
    status, model = http("POST", f"/api/kernels/{k['id']}/restart", d.token)
    assert status == 200 and model["execution_state"] == "idle", model
    new_pid = model["pids"][0]
    assert new_pid != old_pid
    wait_for(lambda: not pid_alive(old_pid), 10, "the old process to exit")
    # Same WebSocket, fresh interpreter: the restart dropped `x`.
    assert execute(ws, "'x' in globals()")["value"] == "False"
    ws.close()

    assert http("DELETE", f"/api/kernels/{k['id']}", d.token)[0] == 204
    wait_for(lambda: not pid_alive(new_pid), 10, "the kernel process to exit")
    assert http("GET", f"/api/kernels/{k['id']}", d.token)[0] == 404


def test_a_killed_kernel_is_reported_dead():
    d = daemon()
    k = new_kernel()
    pid = k["pids"][0]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: model_of(k["id"])["execution_state"] == "dead", 10, "the kernel to be reported dead")
    assert http("DELETE", f"/api/kernels/{k['id']}", d.token)[0] == 204


def test_kernel_models_have_kernel_gateway_fields():
    k = new_kernel()
    try:
        status, models = http("GET", "/api/kernels", daemon().token)
        assert status == 200
        mine = [m for m in models if m["id"] == k["id"]][0]
        for field in ("id", "name", "last_activity", "execution_state", "connections"):
            assert field in mine
        time.strptime(mine["last_activity"], "%Y-%m-%dT%H:%M:%S.%fZ")
    finally:
        http("DELETE", f"/api/kernels/{k['id']}", daemon().token)


def test_nbos_kernel_helper_is_loaded_into_every_kernel():
    k = new_kernel()
    try:
        ws = connect(k["id"])
        assert execute(ws, "type(_nbos_tracker).__module__")["value"] == "'nbos_kernel.namespace'"
        ws.close()
    finally:
        http("DELETE", f"/api/kernels/{k['id']}", daemon().token)


def test_a_stopped_kernel_is_shown_unresponsive_until_it_answers_again():
    k = new_kernel()
    pid = k["pids"][0]
    try:
        os.kill(pid, signal.SIGSTOP)
        wait_for(lambda: model_of(k["id"])["execution_state"] == "unresponsive", 20, "the missed heartbeats to show")
        os.kill(pid, signal.SIGCONT)
        wait_for(lambda: model_of(k["id"])["execution_state"] == "idle", 20, "the kernel to answer again")
    finally:
        os.kill(pid, signal.SIGCONT)
        http("DELETE", f"/api/kernels/{k['id']}", daemon().token)


def test_daemon_shutdown_stops_every_kernel():
    from nbos_harness import Daemon

    d = Daemon()
    pids = []
    for _ in range(2):
        req = urllib.request.Request(d.url + "/api/kernels", method="POST", data=b'{"name":"python3"}')
        req.add_header("Authorization", f"token {d.token}")
        with urllib.request.urlopen(req, timeout=60) as r:
            pids.append(json.loads(r.read())["pids"][0])
    assert all(pid_alive(p) for p in pids)
    d.stop()
    assert d.proc.returncode == 0
    wait_for(lambda: not any(pid_alive(p) for p in pids), 10, "the kernels to be gone after SIGTERM")
    assert not list((d.dir / "run" / "kernels").iterdir()), "kernel directories left behind"
