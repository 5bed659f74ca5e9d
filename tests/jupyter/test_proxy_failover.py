"""`nbos kernel-proxy --gateway A,B`: when the WebSocket to the gateway in use is
lost, the proxy reconnects to the next gateway that serves the same kernel id; the
Jupyter client keeps its kernel (and its state), and a cell that was in flight on
the lost socket gets an error reply instead of hanging.

The two "gateways" are TCP forwarders in front of one daemon, so losing one is a
real connection loss (sockets shut down, port closed) while the kernel lives on.
The cluster version (gateways on different hosts) is in test_cluster.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import urllib.request
from pathlib import Path

import pytest
from jupyter_client.manager import KernelManager
from nbos_harness import daemon, wait_for
from nbos_testkit import run_cell


class Forwarder:
    """Accepts on a loopback port and pipes every connection to `target`."""

    def __init__(self, target: tuple[str, int], port: int = 0) -> None:
        self.target = target
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", port))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self.lock:
                if self.stopped:
                    client.close()
                    upstream.close()
                    return
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self) -> None:
        """Closes the port and every connection through it (a dead gateway)."""
        with self.lock:
            self.stopped = True
            conns, self.conns = self.conns, []
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def kernels(d) -> list[dict]:
    req = urllib.request.Request(d.url + "/api/kernels", headers=d.headers())
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def shell_reply(kc, msg_id: str, timeout: float) -> dict:
    """The shell reply to `msg_id` (late kernel_info replies of wait_for_ready are skipped)."""
    while True:
        reply = kc.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply


def test_proxy_reconnects_to_the_next_gateway_and_keeps_the_kernel(tmp_path: Path) -> None:
    d = daemon()
    host, port = d.url.removeprefix("http://").rsplit(":", 1)
    a = Forwarder((host, int(port)))
    b = Forwarder((host, int(port)))
    kernels_dir = tmp_path / "jupyter" / "kernels"
    subprocess.run(
        [
            d.nbos,
            "install-kernelspec",
            "--name",
            "nbos-failover",
            "--kernels-dir",
            str(kernels_dir),
            "--token-file",
            str(d.token_file),
            "--gateway",
            f"{a.url},{b.url}",
        ],
        check=True,
        capture_output=True,
    )
    spec = json.loads((kernels_dir / "nbos-failover" / "kernel.json").read_text())
    assert "--gateway" in spec["argv"] and f"{a.url},{b.url}" in spec["argv"]
    old_path = os.environ.get("JUPYTER_PATH", "")
    os.environ["JUPYTER_PATH"] = str(tmp_path / "jupyter") + os.pathsep + old_path
    before = {k["id"] for k in kernels(d)}
    km = KernelManager(kernel_name="nbos-failover")
    proxy_stderr = tmp_path / "proxy.stderr"
    with proxy_stderr.open("wb") as err:
        km.start_kernel(stderr=err)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        created = [k["id"] for k in kernels(d) if k["id"] not in before]
        assert len(created) == 1, created
        kernel_id = created[0]

        cell = run_cell(kc, "x = 41", timeout=60)
        reply, _ = cell.reply, [cell.stdout, cell.stderr]
        assert reply["status"] == "ok"

        # Gateway A dies between cells: the next cell runs on the same kernel through B.
        a.stop()
        # The proxy notices the loss and reconnects through B on its own, not only when
        # the client next sends something.
        wait_for(lambda: len(b.conns) >= 2, 60, "the proxy to reconnect through gateway B")
        cell = run_cell(kc, "x += 1\nprint(x)", timeout=60)
        reply, out = cell.reply, [cell.stdout, cell.stderr]
        assert reply["status"] == "ok", reply
        assert "".join(out).strip() == "42"

        # Gateway B dies while a cell runs; A is back (a restarted host): the cell in
        # flight gets an error reply, no hang, and the kernel keeps its state.
        # In the daemon's directory (0711): the kernel runs as another uid (kernel.user) and
        # cannot see into pytest's private tmp_path.
        gate = d.dir / f"gate-{kernel_id}"
        msg_id = kc.execute(
            f"import os, time\nwhile not os.path.exists({str(gate)!r}):\n    time.sleep(0.02)\nprint('late')"
        )
        wait_for(
            lambda: (m := kc.get_iopub_msg(timeout=30))["msg_type"] == "execute_input"
            and m["parent_header"].get("msg_id") == msg_id,
            60,
            "the gated cell to start",
        )
        a = Forwarder((host, int(port)), port=a.port)
        b.stop()
        reply = shell_reply(kc, msg_id, 60)
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "GatewayConnectionLost"
        gate.write_text("go")

        cell = run_cell(kc, "print(x)", timeout=60)
        reply, out = cell.reply, [cell.stdout, cell.stderr]
        assert reply["status"] == "ok", reply
        assert "".join(out).strip() == "42", "the late cell's output must not leak into this one"
        assert [k["id"] for k in kernels(d) if k["id"] not in before] == [kernel_id], "same kernel, no new one"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
        os.environ["JUPYTER_PATH"] = old_path
        a.stop()
        b.stop()
    wait_for(lambda: kernel_id not in {k["id"] for k in kernels(d)}, 30, "the proxy to delete its kernel")
    # The proxy's stderr is the Jupyter server's terminal or log: plain text, and only what
    # needs a person (the lost gateways), no JSON records of every connection.
    lines = [line for line in proxy_stderr.read_text().splitlines() if line.strip()]
    assert not [line for line in lines if line.lstrip().startswith("{")], lines
    assert any("WARN" in line for line in lines), lines
    assert not [line for line in lines if "interrupt failed" in line], "a normal shutdown is not a failure"


def test_proxy_refuses_an_empty_gateway_list(tmp_path: Path) -> None:
    d = daemon()
    conn = tmp_path / "conn.json"
    conn.write_text(
        json.dumps(
            {
                "shell_port": 0,
                "iopub_port": 0,
                "stdin_port": 0,
                "control_port": 0,
                "hb_port": 0,
                "ip": "127.0.0.1",
                "key": "k",
                "transport": "tcp",
                "signature_scheme": "hmac-sha256",
            }
        )
    )
    r = subprocess.run(
        [d.nbos, "kernel-proxy", "-f", str(conn), "--gateway", ","], capture_output=True, text=True, timeout=30
    )
    assert r.returncode != 0
    assert "--gateway names no URL" in r.stderr


@pytest.fixture(autouse=True)
def _no_leftover_env():
    saved = os.environ.get("JUPYTER_PATH")
    yield
    if saved is None:
        os.environ.pop("JUPYTER_PATH", None)
    else:
        os.environ["JUPYTER_PATH"] = saved
