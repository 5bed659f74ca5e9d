"""Jupyter clients that know only kernelspecs (nbclient, and papermill on top of it) on a
3-host cluster through the `nbos kernel-proxy` kernelspec that names one host's gateway, as
the packaged kernelspec names the local daemon's: the proxy learns the other hosts'
gateways from the cluster, its gateway host is killed (`kill -9` of the daemon and its
kernel processes) mid-notebook, between two cells, and the notebook completes with its
state: the later cells run on the surviving replicas of the same kernel, which the proxy
deletes through a survivor at the end."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import nbformat
import papermill
import pytest
from nbclient import NotebookClient
from nbos_testkit import Cluster
from nbos_harness import wait_for
from papermill.engines import NBClientEngine, papermill_engines

@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    yield c
    c.stop()


CELLS = [
    "x1 = 1",
    "x2 = 2",
    "x3 = 3",
    # After the kill:
    "print(x1 + x2 + x3)",
    "import os\nprint(os.environ['NOTEBOOKOS_KERNEL_ID'])",
]
KILL_AFTER = 2  # the third cell


def notebook() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in CELLS]
    nb.metadata["kernelspec"] = {"name": "nbos-cluster", "display_name": "NotebookOS", "language": "python"}
    return nb


def kill_the_kernelspecs_gateway(cluster: Cluster) -> str:
    """Host 1 (the one gateway the kernelspec names) dies with its replica; returns the
    kernel's id once the proxy has reconnected through a survivor."""
    kernels = cluster.get(0, "/api/kernels")
    assert len(kernels) == 1, kernels
    kernel_id = kernels[0]["id"]
    assert {r["node_id"] for r in kernels[0]["replicas"]} == {1, 2, 3}, kernels
    cluster.kill(0)
    wait_for(
        lambda: any((cluster.get(i, f"/api/kernels/{kernel_id}") or {}).get("connections", 0) >= 1 for i in (1, 2)),
        60,
        "the proxy to reconnect to a surviving gateway",
    )
    return kernel_id


class KillMidNotebook(NBClientEngine):
    """papermill's own engine, with host 1 killed once the third cell completed."""

    cluster: Cluster | None = None
    kernel_id: str | None = None

    @classmethod
    def execute_managed_notebook(cls, nb_man, kernel_name, **kwargs):
        complete = nb_man.cell_complete

        def cell_complete(cell, cell_index=None, **kw):
            complete(cell, cell_index=cell_index, **kw)
            if cell_index == KILL_AFTER and cls.cluster is not None:
                cls.kernel_id = kill_the_kernelspecs_gateway(cls.cluster)

        nb_man.cell_complete = cell_complete
        return super().execute_managed_notebook(nb_man, kernel_name, **kwargs)


papermill_engines.register("nbos-kill-mid-notebook", KillMidNotebook)


@pytest.mark.parametrize("client", ["nbclient", "papermill"])
def test_a_notebook_completes_when_the_one_gateway_its_kernelspec_names_dies(
    cluster: Cluster, tmp_path: Path, client: str
) -> None:
    if cluster.procs[0] is None:
        # The previous client killed it: back, so that the kernelspec's gateway answers.
        cluster.start(0)
        cluster.wait_ready()
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
            cluster.urls[0],
        ],
        check=True,
        capture_output=True,
    )
    old_path = os.environ.get("JUPYTER_PATH", "")
    os.environ["JUPYTER_PATH"] = str(tmp_path / "jupyter") + os.pathsep + old_path
    try:
        if client == "nbclient":
            nb = notebook()
            nbc = NotebookClient(nb, kernel_name="nbos-cluster", timeout=90, startup_timeout=90)
            with nbc.setup_kernel():
                for i, cell in enumerate(nb.cells):
                    nbc.execute_cell(cell, i)
                    if i == KILL_AFTER:
                        kernel_id = kill_the_kernelspecs_gateway(cluster)
        else:
            source, out = tmp_path / "in.ipynb", tmp_path / "out.ipynb"
            nbformat.write(notebook(), source)
            KillMidNotebook.cluster, KillMidNotebook.kernel_id = cluster, None
            papermill.execute_notebook(
                str(source),
                str(out),
                kernel_name="nbos-cluster",
                engine_name="nbos-kill-mid-notebook",
                execution_timeout=90,
                start_timeout=90,
                progress_bar=False,
            )
            assert KillMidNotebook.kernel_id is not None, "the engine killed host 1 mid-notebook"
            kernel_id = KillMidNotebook.kernel_id
            nb = nbformat.read(out, as_version=4)
    finally:
        os.environ["JUPYTER_PATH"] = old_path
    printed = ["".join(o.get("text", "") for o in c.outputs if o.get("output_type") == "stream").strip() for c in nb.cells]
    assert printed[3] == "6", (nb.cells[3].outputs, cluster.logs())
    assert printed[4] == kernel_id, "the same kernel, not a new one"
    # The proxy deleted its kernel through a surviving gateway.
    wait_for(lambda: cluster.get(1, "/api/kernels") == [], 30, "the kernel to be deleted")
