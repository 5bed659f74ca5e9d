"""Starts a real notebookosd for the Jupyter client tests and tears it down.

One daemon per test session (kernels are cheap, the daemon start is not free on
2 cores). Binaries come from $NBOS_BIN_DIR, else `cargo build` puts them in
target/debug.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The test kit (tests/support/python): binaries, config builder, launcher, run_cell.
sys.path.insert(0, str(REPO / "tests" / "support" / "python"))

from nbos_testkit import bin_dir, wait_for, write_config  # noqa: E402


_next_port = random.randrange(12_000)


def free_port() -> int:
    """A loopback TCP port that is free now, chosen below Linux's ephemeral range (32768+) so
    that no outgoing connection or port-0 listener of the machine takes it between choosing
    and binding (raft_store::service::free_loopback_addr does the same for the Rust tests)."""
    global _next_port
    for _ in range(12_000):
        port = 20_000 + _next_port % 12_000
        _next_port += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port in 20000..32000")


def kill_until_given_up(model, first_pid: int, most: int = 8) -> list[int]:
    """SIGKILLs a kernel's process, then each new one the daemon restarts as soon as it
    shows, until the kernel is given up (`dead`) or `most` kills; returns the pids killed.
    `model()` is the kernel's Kernel Gateway model."""

    killed: list[int] = []

    def new_pid_or_dead():
        m = model()
        if m["execution_state"] == "dead":
            return "dead"
        return next((p for p in m["pids"] if p not in killed), None)

    pid = first_pid
    while len(killed) < most:
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)
        pid = wait_for(new_pid_or_dead, 120, "a new kernel process, or the kernel given up")
        if pid == "dead":
            return killed
    raise AssertionError(f"still restarted after {len(killed)} deaths")


class Daemon:
    """A running notebookosd with a token."""

    def __init__(
        self,
        fake_gpus: int = 0,
        idle_release: str = "30s",
        memory_limit_mib: int = 0,
        limit_address_space: bool = False,
        tls: bool = False,
        gpu_extra: dict | None = None,
        extra_sections: dict | None = None,
    ) -> None:
        """`extra_sections`: more config sections, each merged key by key over this one's (e.g.
        `{"auth": {...}, "kernel": {"run_as": "owner"}}`)."""
        self.bins = bin_dir()
        self.dir = Path(tempfile.mkdtemp(prefix="nbos-jupyter-test-"))
        # Kernels run as another uid (kernel.user): they pass through (0711), never list.
        self.dir.chmod(0o711)
        self.nbos = str(self.bins / "nbos")
        # HTTPS with a client CA: a PKI made by `nbos pki`, a node certificate for the
        # listener (127.0.0.1) and a client certificate for jupyter_server.
        self.pki = self.dir / "pki"
        http: dict = {"listen": "127.0.0.1:0"}
        tls_args: list[str] = []
        if tls:
            for args in (["init"], ["issue", "node", "1", "--ip", "127.0.0.1"], ["issue", "client", "jupyter"]):
                subprocess.run(
                    [self.nbos, "pki", args[0], "--dir", str(self.pki), *args[1:]], check=True, capture_output=True
                )
            self.ca_cert = self.pki / "ca.pem"
            self.client_cert = self.pki / "client-jupyter.pem"
            self.client_key = self.pki / "client-jupyter.key"
            http["tls"] = {
                "cert": str(self.pki / "node-1.pem"),
                "key": str(self.pki / "node-1.key"),
                "client_ca": str(self.ca_cert),
            }
            tls_args = ["--ca-cert", str(self.ca_cert)]
        self.token = secrets.token_hex(24)
        self.token_file = self.dir / "token"
        self.token_file.write_text(self.token + "\n")
        self.token_file.chmod(0o600)
        runtime = self.dir / "run"
        http["token_file"] = str(self.token_file)
        sections = {
            "node": {"name": "pytest"},
            "http": http,
            "kernel": {
                "python": sys.executable,
                "memory_limit_mib": memory_limit_mib,
                "limit_address_space": limit_address_space,
            },
            "log": {"format": "text"},
        }
        if fake_gpus:
            sections["gpu"] = {"driver": "fake", "fake_gpus": fake_gpus, "idle_release": idle_release, **(gpu_extra or {})}
        for name, values in (extra_sections or {}).items():
            sections[name] = {**sections.get(name, {}), **values}
        config = write_config(self.dir / "notebookosd.toml", self.dir, sections)
        self.log = open(self.dir / "daemon.log", "wb")
        self.proc = subprocess.Popen(
            [str(self.bins / "notebookosd"), "--config", str(config)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        endpoint = runtime / "endpoint.json"

        def ready():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"notebookosd exited: {(self.dir / 'daemon.log').read_text()}"
                )
            return endpoint.exists() and json.loads(endpoint.read_text())

        self.url = wait_for(ready, 30, "notebookosd to listen")["url"]
        self.jupyter_path = self.dir / "jupyter"
        subprocess.run(
            [
                self.nbos,
                *tls_args,
                "--url",
                self.url,
                "install-kernelspec",
                "--name",
                "notebookos-test",
                "--kernels-dir",
                str(self.jupyter_path / "kernels"),
                "--token-file",
                str(self.token_file),
            ],
            check=True,
            capture_output=True,
        )
        atexit.register(self.stop)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_DAEMON: Daemon | None = None


def daemon() -> Daemon:
    """The session's daemon, started on first use. Also points JUPYTER_PATH at
    its kernelspec and the jupyter_server gateway client at it."""
    global _DAEMON
    if _DAEMON is None:
        _DAEMON = Daemon()
        os.environ["JUPYTER_PATH"] = str(_DAEMON.jupyter_path) + os.pathsep + os.environ.get("JUPYTER_PATH", "")
        os.environ["JUPYTER_GATEWAY_URL"] = _DAEMON.url
        os.environ["JUPYTER_GATEWAY_AUTH_TOKEN"] = _DAEMON.token
    return _DAEMON


_TLS_DAEMON: Daemon | None = None


def tls_daemon() -> Daemon:
    """A second session daemon serving HTTPS with a client CA (started on first use)."""
    global _TLS_DAEMON
    if _TLS_DAEMON is None:
        _TLS_DAEMON = Daemon(tls=True)
    return _TLS_DAEMON


_GATEWAY_ENV = (
    "JUPYTER_GATEWAY_URL",
    "JUPYTER_GATEWAY_AUTH_TOKEN",
    "JUPYTER_GATEWAY_CA_CERTS",
    "JUPYTER_GATEWAY_CLIENT_CERT",
    "JUPYTER_GATEWAY_CLIENT_KEY",
)


@contextlib.contextmanager
def gateway_client_over_tls():
    """jupyter_server's gateway client pointed at the HTTPS daemon for the block.

    Its `GatewayKernelClient` opens the channels WebSocket with no headers (no token):
    it authenticates with a client certificate from the daemon's client CA. The
    client is a singleton configured from the environment when first made, so the
    environment is set, the singleton dropped, and both restored afterwards (other
    tests use the plain-HTTP daemon)."""
    from jupyter_server.gateway.gateway_client import GatewayClient

    d = tls_daemon()
    saved = {k: os.environ.get(k) for k in _GATEWAY_ENV}
    os.environ.update(
        {
            "JUPYTER_GATEWAY_URL": d.url,
            "JUPYTER_GATEWAY_AUTH_TOKEN": d.token,
            "JUPYTER_GATEWAY_CA_CERTS": str(d.ca_cert),
            "JUPYTER_GATEWAY_CLIENT_CERT": str(d.client_cert),
            "JUPYTER_GATEWAY_CLIENT_KEY": str(d.client_key),
        }
    )
    GatewayClient.clear_instance()
    try:
        yield d
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        GatewayClient.clear_instance()
