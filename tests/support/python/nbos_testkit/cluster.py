"""The Python launcher of a loopback cluster. `nbos-test-cluster prepare` (the Rust support
crate) writes the cluster's directory — tokens, PKI, each host's directory, ports and
config — and prints it as JSON; this module starts, stops and kills the daemons from it,
each in its own process group (so `kill()` takes its kernel processes down with it, like
a host losing power)."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from nbos_testkit.bins import bin_dir


def wait_for(predicate, timeout: float, what: str):
    """Polls `predicate` until it returns something true; that, or TimeoutError."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def prepare(
    directory: Path,
    hosts: int = 3,
    founders: int | None = None,
    tls: bool = True,
    python: list[str] | None = None,
    fake_gpus: int = 1,
    log_level: str = "info",
    extra: list[str] | None = None,
    overlay: dict | None = None,
) -> dict:
    """Lays out a cluster in `directory` with `nbos-test-cluster prepare`; its layout:
    `dir`, `token`, `operator_token`, `token_file`, `operator_token_file`, `ca_cert`,
    `seeds`, `hosts` (each `node_id`, `dir`, `config_path`, `raft_addr`, `url`, `seed`).
    `overlay`: config sections merged over every host's (`{"auth": {...}}`; values are
    strings, numbers or booleans)."""
    args = [
        str(bin_dir() / "nbos-test-cluster"),
        "prepare",
        "--dir",
        str(directory),
        "--hosts",
        str(hosts),
        "--fake-gpus",
        str(fake_gpus),
        "--log-level",
        log_level,
    ]
    if founders is not None:
        args += ["--founders", str(founders)]
    if tls:
        args.append("--tls")
    for p in python or []:
        args += ["--python", p]
    if overlay:
        args += ["--overlay", _toml(overlay)]
    r = subprocess.run([*args, *(extra or [])], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"nbos-test-cluster prepare: exit {r.returncode}\n{r.stderr}")
    return json.loads(r.stdout)


def _toml(sections: dict) -> str:
    """TOML of sections of scalars (JSON's strings, numbers and booleans are TOML's)."""
    out = []
    for name, values in sections.items():
        out.append(f"[{name}]")
        out += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
    return "\n".join(out) + "\n"


class Cluster:
    def __init__(
        self,
        hosts: int = 3,
        tls: bool = True,
        founders: int | None = None,
        host_bins: list[Path] | None = None,
        host_python: list[str] | None = None,
        overlay: dict | None = None,
    ) -> None:
        """`hosts` host slots, of which the first `founders` (default: all) found the meta
        group and start now; the others are configured (ports, certificate, the founders as
        seeds) and wait for `start` and `join`. `host_bins`/`host_python`: each slot's
        notebookosd directory and kernel Python (a rolling upgrade mixes two versions)."""
        founders = hosts if founders is None else founders
        self.bins = bin_dir()
        self.host_bins = host_bins or [self.bins] * hosts
        self.nbos = str(self.bins / "nbos")
        self.dir = Path(tempfile.mkdtemp(prefix="nbos-cluster-test-"))
        layout = prepare(self.dir, hosts, founders, tls, host_python or [sys.executable], overlay=overlay)
        self.layout = layout
        # A PKI (raft mutual TLS, HTTPS with client certificates, node certificates on
        # host-to-host calls). Plain HTTP only where a TLS-terminating proxy would sit in
        # front (tls=False).
        self.pki = self.dir / "pki"
        self.nbos_tls_args: list[str] = []
        self.ssl_context = None
        if tls:
            self.nbos_tls_args = ["--ca-cert", layout["ca_cert"]]
            self.ssl_context = ssl.create_default_context(cafile=layout["ca_cert"])
        self.token = layout["token"]
        self.token_file = Path(layout["token_file"])
        # Membership and drain; also what hosts call each other with when they have no
        # node certificates (tls=False): never the users' token.
        self.operator_token = layout["operator_token"]
        self.operator_token_file = Path(layout["operator_token_file"])
        # What `get` and `wait_ready` ask with: with users (`[auth]` in the overlay) the users'
        # token names no one (a Hub would be asked about it), so the operator's.
        self.status_token = self.operator_token if overlay and "auth" in overlay else self.token
        self.raft = [int(h["raft_addr"].rsplit(":", 1)[1]) for h in layout["hosts"]]
        self.urls = [h["url"] for h in layout["hosts"]]
        self.host_dirs = [Path(h["dir"]) for h in layout["hosts"]]
        self.configs = [Path(h["config_path"]) for h in layout["hosts"]]
        self.procs: list[subprocess.Popen | None] = [None] * hosts
        for i in range(founders):
            self.start(i)
        self.wait_ready()

    def _pki(self, *args: str) -> None:
        subprocess.run([self.nbos, "pki", args[0], "--dir", str(self.pki), *args[1:]], check=True, capture_output=True)

    def client_certificate(self, name: str) -> tuple[Path, Path]:
        """A client certificate from the cluster's CA (`nbos pki issue client`): cert, key."""
        self._pki("issue", "client", name)
        return self.pki / f"client-{name}.pem", self.pki / f"client-{name}.key"

    def log_path(self, i: int) -> Path:
        return self.host_dirs[i] / "daemon.log"

    def start(self, i: int) -> None:
        log = open(self.log_path(i), "ab")
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
        req = urllib.request.Request(self.urls[i] + path, headers={"Authorization": f"token {self.status_token}"})
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
            f"--- host {i + 1} ---\n" + self.log_path(i).read_text()[-3000:]
            for i in range(len(self.procs))
            if self.log_path(i).exists()
        )

    def stop(self) -> None:
        for i in range(len(self.procs)):
            self.stop_host(i)
