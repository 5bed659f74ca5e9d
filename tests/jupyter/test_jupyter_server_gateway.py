"""What `jupyter lab --gateway-url` does: a jupyter_server whose kernels live on
notebookosd (GatewayMappingKernelManager for REST, GatewayWebSocketConnection for
the channels), with token auth on at both hops. A browser-like client talks only
to jupyter_server."""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

import pytest
import websocket
from nbos_harness import daemon, free_port, wait_for



@pytest.fixture(scope="module")
def jupyter_server(tmp_path_factory):
    d = daemon()
    port = free_port()
    token = uuid.uuid4().hex
    root = tmp_path_factory.mktemp("jupyter-root")
    log = open(root / "server.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter_server",
            f"--gateway-url={d.url}",
            f"--GatewayClient.auth_token={d.token}",
            f"--IdentityProvider.token={token}",
            "--allow-root",
            f"--ServerApp.port={port}",
            "--ServerApp.port_retries=0",
            "--ServerApp.ip=127.0.0.1",
            "--ServerApp.open_browser=False",
            f"--ServerApp.root_dir={root}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        # Keep its cookie secret and runtime files out of the user's home.
        env={**os.environ, "JUPYTER_RUNTIME_DIR": str(root / "runtime"), "JUPYTER_CONFIG_DIR": str(root / "config")},
    )
    url = f"http://127.0.0.1:{port}"

    def up():
        if proc.poll() is not None:
            raise RuntimeError((root / "server.log").read_text())
        try:
            urllib.request.urlopen(f"{url}/api?token={token}", timeout=2)
            return True
        except (urllib.error.URLError, ConnectionError):
            return False

    wait_for(up, 60, "jupyter_server to start")
    yield url, token
    proc.terminate()
    proc.wait(timeout=30)


def call(url: str, token: str, method: str, path: str, body=None):
    req = urllib.request.Request(f"{url}{path}", method=method, data=json.dumps(body).encode() if body is not None else None)
    req.add_header("Authorization", f"token {token}")
    with urllib.request.urlopen(req, timeout=120) as r:
        raw = r.read()
        return r.status, json.loads(raw) if raw else None


def test_kernel_through_jupyter_server_gateway(jupyter_server):
    url, token = jupyter_server
    d = daemon()
    status, specs = call(url, token, "GET", "/api/kernelspecs")
    assert status == 200 and "notebookos-python-1gpu" in specs["kernelspecs"], specs
    status, model = call(url, token, "POST", "/api/kernels", {"name": "python3"})
    assert status == 201, model
    kid = model["id"]
    # The kernel lives on notebookosd.
    status, ours = call(d.url, d.token, "GET", f"/api/kernels/{kid}")
    assert status == 200 and ours["pids"]

    ws = websocket.create_connection(url.replace("http", "ws") + f"/api/kernels/{kid}/channels?token={token}", timeout=60)
    msg_id = uuid.uuid4().hex
    ws.send(
        json.dumps(
            {
                "header": {"msg_id": msg_id, "msg_type": "execute_request", "session": "lab", "username": "u", "version": "5.3", "date": ""},
                "parent_header": {},
                "metadata": {},
                "content": {"code": "print('through lab'); 6*7", "silent": False},
                "channel": "shell",
            }
        )
    )
    seen = {}
    deadline = time.monotonic() + 60
    # Output (iopub) and reply (shell) have no order between them: wait for the
    # reply and for the idle status that follows the cell's output.
    while not ("execute_reply" in seen and seen.get("status", {}).get("execution_state") == "idle") and time.monotonic() < deadline:
        m = json.loads(ws.recv())
        if m.get("parent_header", {}).get("msg_id") == msg_id:
            seen[m["msg_type"]] = m["content"]
    assert seen["execute_reply"]["status"] == "ok"
    assert "through lab" in seen["stream"]["text"]
    assert seen["execute_result"]["data"]["text/plain"] == "42"
    ws.close()

    assert call(url, token, "POST", f"/api/kernels/{kid}/restart", {})[0] == 200
    status, _ = call(url, token, "DELETE", f"/api/kernels/{kid}")
    assert status == 204
    wait_for(lambda: kid not in [k["id"] for k in call(d.url, d.token, "GET", "/api/kernels")[1]], 30, "the kernel to be deleted on notebookosd")
