"""A rolling upgrade as docs/operations.md tells an operator to do it, between two
versions' binaries (tests/upgrade/run.sh builds the old one from git): three hosts run the
old version and a kernel whose client is a plain Jupyter client (the `nbos kernel-proxy`
kernelspec, listing every host's gateway). Each old host in turn is replaced by a
new-version host: the new one starts and joins, the old one is drained (`nbos cluster
leave`: its replica moves to the new host) and stopped. A cell runs after every step, in a
cluster of mixed versions, and the kernel's namespace holds every earlier cell's effect."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from nbos_testkit import Cluster, bin_dir, run_cell, wait_for
from jupyter_client.manager import KernelManager

OLD_BINS = os.environ.get("NBOS_OLD_BIN_DIR")

pytestmark = pytest.mark.skipif(not OLD_BINS, reason="needs the old version's binaries: run tests/upgrade/run.sh")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def replica_hosts(cluster: Cluster, via: int, kernel_id: str) -> set[int]:
    k = cluster.get(via, f"/api/kernels/{kernel_id}") or {}
    return {r["node_id"] for r in k.get("replicas", [])}


def test_three_old_hosts_are_replaced_one_by_one_and_the_kernel_keeps_its_namespace(tmp_path: Path) -> None:
    old, new = Path(OLD_BINS), bin_dir()
    assert digest(old / "notebookosd") != digest(new / "notebookosd"), "the two versions' daemons are the same build"
    cluster = Cluster(
        hosts=6,
        founders=3,
        host_bins=[old] * 3 + [new] * 3,
        host_python=[str(old / "python")] * 3 + [sys.executable] * 3,
    )
    km = None
    old_path = os.environ.get("JUPYTER_PATH", "")
    try:
        kernels_dir = tmp_path / "jupyter" / "kernels"
        subprocess.run(
            [
                cluster.nbos,
                *cluster.nbos_tls_args,
                "install-kernelspec",
                "--name",
                "nbos-upgrade",
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
        os.environ["JUPYTER_PATH"] = str(tmp_path / "jupyter") + os.pathsep + old_path
        km = KernelManager(kernel_name="nbos-upgrade")
        km.start_kernel()
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=120)
        kernel_id = cluster.get(0, "/api/kernels")[0]["id"]
        assert replica_hosts(cluster, 0, kernel_id) == {1, 2, 3}

        cell = run_cell(kc, "history = ['old']\nimport hashlib\nblob = bytes(range(256)) * 4096")
        reply, _ = cell.reply, cell.stdout
        assert reply["status"] == "ok", reply
        for step in range(3):
            gone, added = step, step + 3  # host slots: old h1..h3 replaced by new h4..h6
            cluster.start(added)
            cluster.join(added, via=added - 1)
            cluster.leave(gone)
            cluster.stop_host(gone)
            expected = set(range(step + 2, step + 5))  # node ids: {2,3,4}, {3,4,5}, {4,5,6}
            wait_for(
                lambda: replica_hosts(cluster, added, kernel_id) == expected,
                120,
                f"the kernel's replicas on hosts {sorted(expected)}",
            )
            cell = run_cell(kc, f"history.append('step{step}')\nprint(history)")
            reply, out = cell.reply, cell.stdout
            assert reply["status"] == "ok", (reply, cluster.logs())
            assert out.strip() == str(["old"] + [f"step{s}" for s in range(step + 1)]), out

        # Only new hosts are left: the meta group is theirs and the namespace is whole.
        # A stopped host shows up until its record's TTL runs out (host_ttl): wait for that.
        def members_up():
            status = cluster.get(5, "/api/v1/cluster/status")
            return {m["node_id"] for m in status["members"] if m.get("up")}

        wait_for(lambda: members_up() == {4, 5, 6}, 60, "only the new hosts 4, 5, 6 up in the cluster")
        cell = run_cell(kc, "print(len(history), hashlib.sha256(blob).hexdigest())")
        reply, out = cell.reply, cell.stdout
        assert reply["status"] == "ok", reply
        assert out.split() == ["4", hashlib.sha256(bytes(range(256)) * 4096).hexdigest()], out
        kc.stop_channels()
    finally:
        if km is not None:
            km.shutdown_kernel(now=False)
        os.environ["JUPYTER_PATH"] = old_path
        cluster.stop()
