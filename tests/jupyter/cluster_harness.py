"""Three notebookosd processes forming one cluster on loopback, for the Jupyter client
tests of issue 7. Each host has its own state and runtime directories, HTTP and raft
ports, one simulated GPU and its own process group (so `kill()` takes its kernel
processes down with it, like a host losing power); they share a token and a
large-object directory."""

from __future__ import annotations

import json
import os
import secrets
import signal
import ssl
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from nbos_harness import bin_dir, free_port, wait_for



class Cluster:
    def __init__(
        self,
        hosts: int = 3,
        tls: bool = True,
        founders: int | None = None,
        host_bins: list[Path] | None = None,
        host_python: list[str] | None = None,
    ) -> None:
        """`hosts` host slots, of which the first `founders` (default: all) found the meta
        group and start now; the others are configured (ports, certificate, the founders as
        seeds) and wait for `start` and `join`. `host_bins`/`host_python`: each slot's
        notebookosd directory and kernel Python (a rolling upgrade mixes two versions)."""
        founders = hosts if founders is None else founders
        self.bins = bin_dir()
        self.host_bins = host_bins or [self.bins] * hosts
        python = host_python or [sys.executable] * hosts
        self.nbos = str(self.bins / "nbos")
        self.dir = Path(tempfile.mkdtemp(prefix="nbos-cluster-test-"))
        # Kernels run as another uid (kernel.user): they pass through (0711), never list.
        self.dir.chmod(0o711)
        # A PKI made by `nbos pki`: raft mutual TLS, HTTPS with client certificates, and
        # node certificates on host-to-host calls. Plain HTTP only where a TLS-terminating
        # proxy would sit in front (tls=False).
        self.pki = self.dir / "pki"
        self.nbos_tls_args: list[str] = []
        self.ssl_context = None
        if tls:
            self._pki("init")
            for i in range(hosts):
                self._pki("issue", "node", str(i + 1), "--ip", "127.0.0.1")
            self.nbos_tls_args = ["--ca-cert", str(self.pki / "ca.pem")]
            self.ssl_context = ssl.create_default_context(cafile=str(self.pki / "ca.pem"))
        self.token = secrets.token_hex(24)
        self.token_file = self.dir / "token"
        self.token_file.write_text(self.token + "\n")
        self.token_file.chmod(0o600)
        # Membership and drain; also what hosts call each other with when they have no
        # node certificates (tls=False): never the users' token.
        self.operator_token = secrets.token_hex(24)
        self.operator_token_file = self.dir / "operator-token"
        self.operator_token_file.write_text(self.operator_token + "\n")
        self.operator_token_file.chmod(0o600)
        objects = self.dir / "objects"
        objects.mkdir()
        raft = [free_port() for _ in range(hosts)]
        http = [free_port() for _ in range(hosts)]
        self.raft = raft
        seeds = ", ".join(f'"{i + 1}=127.0.0.1:{p}"' for i, p in enumerate(raft[:founders]))
        scheme = "https" if tls else "http"
        self.urls = [f"{scheme}://127.0.0.1:{p}" for p in http]
        self.configs = []
        self.procs: list[subprocess.Popen | None] = []
        for i in range(hosts):
            d = self.dir / f"h{i + 1}"
            d.mkdir()
            config = d / "notebookosd.toml"
            node, ca = self.pki / f"node-{i + 1}", self.pki / "ca.pem"
            http_tls = f'tls = {{ cert = "{node}.pem", key = "{node}.key", client_ca = "{ca}" }}' if tls else ""
            raft_tls = f'tls = {{ ca_cert = "{ca}", cert = "{node}.pem", key = "{node}.key" }}' if tls else ""
            config.write_text(
                f"""
[node]
name = "h{i + 1}"
state_dir = "{d / 'state'}"
runtime_dir = "{d / 'run'}"
[http]
listen = "127.0.0.1:{http[i]}"
token_file = "{self.token_file}"
operator_token_file = "{self.operator_token_file}"
{http_tls}
[kernel]
python = "{python[i]}"
[gpu]
driver = "fake"
fake_gpus = 1
[observer]
mode = "procfs"
[cluster]
enabled = true
node_id = {i + 1}
raft_listen = "127.0.0.1:{raft[i]}"
seeds = [{seeds}]
host_ttl = "1s"
object_store = "file://{objects}"
{raft_tls}
[log]
format = "text"
"""
            )
            self.configs.append(config)
            self.procs.append(None)
        for i in range(founders):
            self.start(i)
        self.wait_ready()

    def _pki(self, *args: str) -> None:
        subprocess.run([self.nbos, "pki", args[0], "--dir", str(self.pki), *args[1:]], check=True, capture_output=True)

    def client_certificate(self, name: str) -> tuple[Path, Path]:
        """A client certificate from the cluster's CA (`nbos pki issue client`): cert, key."""
        self._pki("issue", "client", name)
        return self.pki / f"client-{name}.pem", self.pki / f"client-{name}.key"

    def start(self, i: int) -> None:
        log = open(self.dir / f"h{i + 1}" / "daemon.log", "ab")
        self.procs[i] = subprocess.Popen(
            [str(self.host_bins[i] / "notebookosd"), "--config", str(self.configs[i])],
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
        )

    def nbos_operator(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """`nbos ARGS` with the operator token (membership, drain); raises with its output."""
        env = {**os.environ, "NBOS_OPERATOR_TOKEN": self.operator_token, "NBOS_TOKEN": self.token}
        r = subprocess.run(
            [self.nbos, *self.nbos_tls_args, *args], env=env, capture_output=True, text=True, timeout=timeout
        )
        if r.returncode != 0:
            raise AssertionError(f"nbos {' '.join(args)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}\n{self.logs()}")
        return r

    def join(self, i: int, via: int) -> None:
        """Host slot `i` (started) joins the meta group through member `via`."""
        wait_for(lambda: self.get(i, "/api/v1/cluster/status") is not None, 60, f"host {i + 1} to listen")
        self.nbos_operator("--url", self.urls[i], "cluster", "join", self.urls[via])

    def leave(self, i: int) -> None:
        """`nbos cluster leave` on host `i`: its replicas move away, then it leaves."""
        self.nbos_operator("--url", self.urls[i], "cluster", "leave", "--timeout", "3m")

    def stop_host(self, i: int) -> None:
        """SIGTERM to host `i`'s daemon, as `systemctl stop` does."""
        p = self.procs[i]
        if p is None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        self.procs[i] = None

    def kill(self, i: int) -> None:
        """kill -9 of the host's daemon and every process of its group (its kernels)."""
        p = self.procs[i]
        if p is not None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            self.procs[i] = None

    def get(self, i: int, path: str):
        req = urllib.request.Request(self.urls[i] + path, headers={"Authorization": f"token {self.token}"})
        try:
            with urllib.request.urlopen(req, timeout=10, context=self.ssl_context) as r:
                return json.loads(r.read())
        except OSError:
            return None

    def wait_ready(self) -> None:
        running = [i for i, p in enumerate(self.procs) if p is not None]

        def ready():
            for i in running:
                s = self.get(i, "/api/v1/cluster/status")
                if not s or not s.get("ready"):
                    return False
                up = {m["node_id"] for m in s.get("members", []) if m.get("up")}
                if not {j + 1 for j in running} <= up:
                    return False
            return True

        wait_for(ready, 60, "the cluster to be ready")

    def logs(self) -> str:
        return "\n".join(
            f"--- h{i + 1} ---\n" + (self.dir / f"h{i + 1}" / "daemon.log").read_text()[-3000:]
            for i in range(len(self.procs))
            if (self.dir / f"h{i + 1}" / "daemon.log").exists()
        )

    def stop(self) -> None:
        for i in range(len(self.procs)):
            self.stop_host(i)
