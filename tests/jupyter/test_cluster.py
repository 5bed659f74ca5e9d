"""A plain Jupyter client (jupyter_client's KernelManager, as nbclient and papermill use
it) on a 3-host cluster through the `nbos kernel-proxy` kernelspec with every host's
gateway: the proxy's gateway host is killed (`kill -9` of the daemon and its kernel
processes) between cells, and the client keeps its kernel and its state; the cells
run on the surviving replicas."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from nbos_testkit import Cluster, run_cell
from jupyter_client.manager import KernelManager
from nbos_harness import wait_for


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    yield c
    c.stop()


def test_a_jupyter_client_keeps_its_kernel_when_its_gateway_host_dies(cluster: Cluster, tmp_path: Path) -> None:
    kernels_dir = tmp_path / "jupyter" / "kernels"
    subprocess.run(
        [
            cluster.nbos,
            *cluster.nbos_tls_args,
            "install-kernelspec",
            "--name",
            "nbos-cluster",
            "--kernels-dir",
            str(kernels_dir),
            "--token-file",
            str(cluster.token_file),
            "--gpus",
            "1",
            "--gateway",
            ",".join(cluster.urls),
        ],
        check=True,
        capture_output=True,
    )
    old_path = os.environ.get("JUPYTER_PATH", "")
    os.environ["JUPYTER_PATH"] = str(tmp_path / "jupyter") + os.pathsep + old_path
    km = KernelManager(kernel_name="nbos-cluster")
    try:
        km.start_kernel()
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=90)
        kernels = cluster.get(0, "/api/kernels")
        assert len(kernels) == 1, kernels
        kernel_id = kernels[0]["id"]
        assert {r["node_id"] for r in kernels[0]["replicas"]} == {1, 2, 3}, kernels

        executors = []
        for i in range(1, 4):
            cell = run_cell(kc, f"x{i} = {i}", timeout=90)
            reply, meta, _ = cell.reply, cell.metadata, cell.stdout
            assert reply["status"] == "ok", reply
            executors.append(meta["nbos_election"]["node_id"])

        # The proxy's gateway is host 1: it dies with its kernel replica.
        cluster.kill(0)
        # The proxy reconnects on its own (a surviving gateway's front-end gets its client).
        wait_for(
            lambda: any((cluster.get(i, f"/api/kernels/{kernel_id}") or {}).get("connections", 0) >= 1 for i in (1, 2)),
            60,
            "the proxy to reconnect to a surviving gateway",
        )
        cell = run_cell(kc, "print(x1 + x2 + x3)", timeout=90)
        reply, meta, out = cell.reply, cell.metadata, cell.stdout
        assert reply["status"] == "ok", (reply, cluster.logs())
        assert out.strip() == "6"
        assert meta["nbos_election"]["node_id"] in (2, 3)

        cell = run_cell(kc, "import os\nprint(os.environ['NOTEBOOKOS_KERNEL_ID'])", timeout=90)
        reply, _, out = cell.reply, cell.metadata, cell.stdout
        assert reply["status"] == "ok", reply
        assert out.strip() == kernel_id, "the same kernel, not a new one"
        assert [k["id"] for k in cluster.get(1, "/api/kernels")] == [kernel_id]

        kc.stop_channels()
    finally:
        km.shutdown_kernel(now=False)
        os.environ["JUPYTER_PATH"] = old_path
    # The proxy deleted its kernel through a surviving gateway.
    wait_for(lambda: cluster.get(1, "/api/kernels") == [], 30, "the kernel to be deleted")
