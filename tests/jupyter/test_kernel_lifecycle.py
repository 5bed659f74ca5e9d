"""Kernel lifecycle through the REST API: output replayed after a reconnect,
interrupt, restart, a kernel that dies (restarted, or given up when it keeps
dying), and delete cleaning up its process."""

import json
import os
import signal
import threading
import time
import urllib.request
import uuid

import websocket
from nbos_harness import daemon, kill_until_given_up, wait_for
from nbos_testkit import run_cell
from test_bad_input import http


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
    # A zombie is not alive for our purpose; nor is one reaped since the kill above.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def metric(name: str) -> float:
    with urllib.request.urlopen(daemon().url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


def send_request(ws, msg_type: str, content: dict, channel: str = "shell") -> str:
    msg_id = uuid.uuid4().hex
    header = {"msg_id": msg_id, "msg_type": msg_type, "session": "t", "username": "t", "version": "5.3"}
    ws.send(json.dumps({"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": channel}))
    return msg_id


def read_states(ws, until, timeout: float = 120) -> list:
    """IOPub statuses (of any parent) read until `until(states)` holds."""
    states = []
    deadline = time.monotonic() + timeout
    while not until(states):
        assert time.monotonic() < deadline, f"statuses so far: {states}"
        m = json.loads(ws.recv())
        if m["msg_type"] == "status":
            states.append(m["content"]["execution_state"])
    return states


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
    assert run_cell(ws, "x = 5; x", timeout=60).result == "5"
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
    assert run_cell(ws, "'x' in globals()", timeout=60).result == "False"
    ws.close()

    assert http("DELETE", f"/api/kernels/{k['id']}", d.token)[0] == 204
    wait_for(lambda: not pid_alive(new_pid), 10, "the kernel process to exit")
    assert http("GET", f"/api/kernels/{k['id']}", d.token)[0] == 404


def test_a_requested_restart_is_not_reported_as_a_crash_and_a_cell_sent_during_it_runs_after_it():
    d = daemon()
    k = new_kernel()
    try:
        ws = connect(k["id"])
        assert run_cell(ws, "x = 5; x", timeout=60).result == "5"
        old_pid = k["pids"][0]
        restarted = {}

        def restart():
            restarted["response"] = http("POST", f"/api/kernels/{k['id']}/restart", d.token)

        t = threading.Thread(target=restart)
        t.start()
        # As JupyterLab does after its restart button: the next cell goes out while the
        # restart runs (here once the old process is gone, before the new one answers).
        wait_for(lambda: not pid_alive(old_pid), 30, "the restart to stop the old process")
        sent_during_restart = t.is_alive()
        r = run_cell(ws, "print('after restart'); 'x' in globals()")
        t.join(timeout=60)
        status, model = restarted["response"]
        # (Its execution_state may already be the queued cell's `busy`.)
        assert status == 200, model
        assert sent_during_restart, "the restart ended before the cell was sent: nothing was tested"
        # Answered by the new interpreter, and no `restarting` (JupyterLab's "kernel died" dialog).
        assert r.reply["status"] == "ok", r
        assert "after restart" in r.stdout and r.result == "False", r
        assert "restarting" not in r.states, r.states
        assert model_of(k["id"])["pids"] == model["pids"] != [old_pid]
        ws.close()
    finally:
        http("DELETE", f"/api/kernels/{k['id']}", daemon().token)


def test_a_killed_kernel_is_restarted_with_a_fresh_namespace():
    k = new_kernel()
    try:
        ws = connect(k["id"])
        assert run_cell(ws, "x = 5; x", timeout=60).result == "5"
        old_pid = k["pids"][0]
        restarts = metric("notebookos_kernel_auto_restarts_total")
        os.kill(old_pid, signal.SIGKILL)
        # As jupyter_server's restarter: `restarting`, then `idle` once the new process
        # answers (`starting` between them may come before the client reads it).
        states = read_states(ws, lambda s: "restarting" in s and "idle" in s[s.index("restarting"):])
        assert "dead" not in states, states
        # The new process's own statuses for the daemon's kernel_info may still follow.
        wait_for(lambda: model_of(k["id"])["execution_state"] == "idle", 30, "the restarted kernel to be idle")
        model = model_of(k["id"])
        assert len(model["pids"]) == 1 and model["pids"] != [old_pid], model
        assert not pid_alive(old_pid)
        assert metric("notebookos_kernel_auto_restarts_total") > restarts
        # The namespace died with the process; new cells run.
        r = run_cell(ws, "x")
        assert r.reply["status"] == "error" and r.reply["ename"] == "NameError", r
        assert run_cell(ws, "y = 2; y + 1", timeout=60).result == "3"
        ws.close()
    finally:
        http("DELETE", f"/api/kernels/{k['id']}", daemon().token)


def test_a_kernel_that_keeps_dying_right_after_it_starts_is_given_up_and_answers_with_errors():
    d = daemon()
    k = new_kernel()
    try:
        ws = connect(k["id"])
        # Kill every new process as soon as it shows; as jupyter_client's restarter
        # (restart_limit 5), after 5 restarts of processes that each died within 10 s of
        # their start, the next such death is final.
        killed = kill_until_given_up(lambda: model_of(k["id"]), k["pids"][0])
        # Not given up before the 6th death (the first process may have lived past 10 s).
        assert 6 <= len(killed) <= 7, killed
        model = model_of(k["id"])
        assert model["execution_state"] == "dead" and model["pids"] == [], model
        states = read_states(ws, lambda s: "dead" in s)
        assert "restarting" in states, states
        # A request now gets an error reply instead of silence.
        r = run_cell(ws, "print('never')")
        assert r.reply["status"] == "error" and r.reply["ename"] == "DeadKernel", r
        assert "never" not in r.stdout
        msg_id = send_request(ws, "kernel_info_request", {})
        while True:
            m = json.loads(ws.recv())
            if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "kernel_info_reply":
                assert m["content"]["status"] == "error" and m["content"]["ename"] == "DeadKernel", m
                break
        ws.close()
        # A dead kernel is still deleted cleanly.
        assert http("DELETE", f"/api/kernels/{k['id']}", d.token)[0] == 204
    finally:
        http("DELETE", f"/api/kernels/{k['id']}", d.token)


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
        assert run_cell(ws, "type(_nbos_tracker).__module__", timeout=60).result == "'nbos_kernel.namespace'"
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
    # Kernel directories live under state_dir (their homes on disk); the pool's launcher
    # files may stay, a kernel's directory (named by its id) may not.
    left = [p.name for p in (d.dir / "state" / "kernels").iterdir() if not p.name.startswith(".")]
    assert not left, f"kernel directories left behind: {left}"
