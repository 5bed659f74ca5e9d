"""Whole notebooks through NotebookOS: nbclient (both through the kernel-proxy
kernelspec and through jupyter_server's GatewayKernelManager) and papermill."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbos_harness import REPO, daemon, gateway_client_over_tls

EXAMPLES = REPO / "examples"


def outputs_of(cell):
    return cell.get("outputs", [])


def run_tour(**client_args):
    nb = nbformat.read(EXAMPLES / "tour.ipynb", as_version=4)
    # The long cell is interrupted on timeout; every other cell is quick.
    client = NotebookClient(nb, timeout=10, interrupt_on_timeout=True, allow_errors=True, **client_args)
    client.execute()
    return nb


def check_tour(nb):
    code = [c for c in nb.cells if c.cell_type == "code"]
    hello, div, display, long, after = code
    assert any(o.get("name") == "stdout" and "hello from NotebookOS" in o["text"] for o in outputs_of(hello))
    assert [o.get("ename") for o in outputs_of(div)] == ["ZeroDivisionError"]
    assert any("text/html" in o.get("data", {}) for o in outputs_of(display))
    assert [o.get("ename") for o in outputs_of(long)] == ["KeyboardInterrupt"], outputs_of(long)
    # The kernel survived the interrupt with its state.
    assert outputs_of(after)[0]["data"]["text/plain"] == "42"


def test_nbclient_tour_through_kernel_proxy():
    daemon()
    check_tour(run_tour(kernel_name="notebookos-test"))


def test_nbclient_tour_through_gateway_kernel_manager():
    from jupyter_server.gateway.managers import GatewayKernelManager

    class NbclientGatewayKernelManager(GatewayKernelManager):
        """jupyter_server 2.x's GatewayKernelManager inherits a local-process
        `is_alive` that asserts a provisioner it never has, which nbclient calls
        while it waits for replies. Ask the gateway instead (GET /api/kernels/{id})."""

        async def _async_is_alive(self) -> bool:
            model = await self.refresh_model()
            return model is not None and model.get("execution_state") != "dead"

        is_alive = _async_is_alive

    with gateway_client_over_tls():
        check_tour(run_tour(km=NbclientGatewayKernelManager(kernel_name="python3")))


def test_papermill_parameterised_notebook(tmp_path: Path):
    import papermill  # requirements-dev.txt: part of what the suite checks
    daemon()
    out = tmp_path / "out.ipynb"
    papermill.execute_notebook(
        str(EXAMPLES / "parameterised.ipynb"),
        str(out),
        kernel_name="notebookos-test",
        parameters={"n": 5, "label": "five"},
    )
    nb = nbformat.read(out, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    printed = "".join(o.get("text", "") for c in code for o in c.get("outputs", []))
    assert "five [0, 1, 4, 9, 16]" in printed
    assert code[-1].outputs[0]["data"]["text/plain"] == "30"
