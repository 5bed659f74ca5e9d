"""JupyterLab through a host failure: three cluster hosts behind haproxy (health checks
on /healthz, the setup docs/operations.md describes), JupyterLab's `--gateway-url` at the
balancer. HTTPS end to end: haproxy passes TLS through to the hosts (mode tcp, checks over
TLS against the cluster CA), and jupyter_server talks to them with the CA and a client
certificate, as a deployment does. The host serving the notebook's WebSocket is killed (kill -9 of its daemon and
kernels); the notebook reconnects by itself and the next cell runs on a survivor with the
namespace of the last completed cell, with no dialog and no lost kernel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from nbos_testkit import Cluster
from nbos_harness import free_port
from lab_harness import ARTIFACTS_DIR, Lab, Notebook, chromium, close, wait_until

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"


def haproxy_config(port: int, urls: list[str], ca: Path) -> str:
    """The balancer a user puts in front of the gateways (docs/operations.md)."""
    servers = "\n".join(f"    server h{i + 1} {u.removeprefix('https://')} check" for i, u in enumerate(urls))
    return f"""
global
    maxconn 1024
defaults
    mode tcp
    timeout connect 2s
    timeout client 1h
    timeout server 1h
    timeout tunnel 1h
    option redispatch
    retries 3
frontend notebookos
    bind 127.0.0.1:{port}
    default_backend gateways
backend gateways
    balance roundrobin
    option httpchk GET /healthz
    http-check expect status 200
    default-server inter 500ms fall 2 rise 2 check-ssl verify required ca-file {ca}
{servers}
"""


class Balancer:
    def __init__(self, urls: list[str], ca: Path, where: Path) -> None:
        if not os.path.exists(HAPROXY):
            if os.environ.get("NBOS_REQUIRE_PRIVILEGED") == "1":
                pytest.fail("haproxy is missing: run scripts/install-deps.sh (apt-get install haproxy)")
            pytest.skip("haproxy is missing: apt-get install haproxy (scripts/install-deps.sh)")
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        cfg = where / "haproxy.cfg"
        cfg.write_text(haproxy_config(self.port, urls, ca))
        check = subprocess.run([HAPROXY, "-c", "-f", str(cfg)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        self.log = open(where / "haproxy.log", "wb")
        self.proc = subprocess.Popen([HAPROXY, "-db", "-f", str(cfg)], stdout=self.log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture
def cluster():
    # HTTPS with client certificates (the cluster's PKI); haproxy passes TLS through.
    c = Cluster(tls=True)
    yield c
    c.stop()


@pytest.fixture
def lab(cluster, tmp_path):
    """JupyterLab with `--gateway-url` at the balancer (fixtures, so that a failed test's
    screenshot and logs are taken before they stop)."""
    ca = cluster.pki / "ca.pem"
    balancer = Balancer(cluster.urls, ca, tmp_path)
    (tmp_path / "lab").mkdir()
    client = cluster.client_certificate("jupyter")
    tls = [f"--GatewayClient.ca_certs={ca}", f"--GatewayClient.client_cert={client[0]}", f"--GatewayClient.client_key={client[1]}"]
    # jupyter_server reconnects to the gateway after gateway_retry_interval (default 1 s)
    # plus 0.1-1 s of jitter; docs/operations.md recommends 0.2 s.
    lab = Lab(balancer.url, cluster.token, tmp_path / "lab", ["--GatewayClient.gateway_retry_interval=0.2", *tls])
    yield lab
    lab.stop()
    balancer.stop()


@pytest.fixture
def browser():
    driver = chromium()
    yield driver
    close(driver)


def test_the_notebook_survives_the_death_of_the_host_serving_it(cluster, lab, browser):
    nb = Notebook(browser, lab.new_notebook("failover.ipynb", "python3"))
    c = nb.run("weights = [0.5, 1.5]\nprint('trained', sum(weights))")
    nb.wait_output(c, "trained 2.0", 120)
    kernel_id = lab.session_kernel("failover.ipynb")["id"]

    # The host whose front-end serves the notebook's WebSocket (jupyter_server's hop) is
    # the one whose front-end ran the cell. (jupyter_server can leave a second, idle
    # WebSocket open on another host when the browser reconnects during its connect.)
    def ran_the_cell(i: int) -> bool:
        model = cluster.get(i, f"/api/kernels/{kernel_id}") or {}
        return ((model.get("execution") or {}).get("cells_executed") or 0) > 0

    serving = wait_until(lambda: [i for i in range(3) if ran_the_cell(i)], 30, "the host serving the notebook")
    assert len(serving) == 1, f"one front-end ran the cell: {serving}"
    host = serving[0]
    connects_before = lab.log_path.read_text().count("Connecting to wss://")
    killed = time.monotonic()
    cluster.kill(host)
    # jupyter_server reconnects by itself through the balancer, to a survivor. A message
    # the browser sends before jupyter_server starts that reconnect is dropped by
    # jupyter_server (GatewayWebSocketConnection._write_message on the closed socket;
    # docs/operations.md); from then on it is queued until the connection is up.
    wait_until(lambda: lab.log_path.read_text().count("Connecting to wss://") > connects_before, 30, "jupyter_server to reconnect to the gateway")
    reconnected = time.monotonic() - killed
    c = nb.run("print('after the failure', sum(weights) * 2)")
    nb.wait_output(c, "after the failure 4.0", 120)
    seconds = time.monotonic() - killed
    assert not nb.dialogs(), f"the user saw a dialog: {nb.dialogs()}"
    assert lab.session_kernel("failover.ipynb")["id"] == kernel_id, "the notebook kept its kernel"
    nb.wait_kernel_idle(30)
    ARTIFACTS_DIR.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS_DIR / "failover.json").write_text(json.dumps({"killed_host": host + 1, "kill_to_reconnected_s": round(reconnected, 2), "kill_to_next_output_s": round(seconds, 2)}))
    print(f"kill of h{host + 1} -> reconnected {reconnected:.2f} s, the next cell's output in the browser {seconds:.2f} s")
