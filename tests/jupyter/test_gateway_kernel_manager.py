"""jupyter_kernel_test through jupyter_server's GatewayKernelManager, the code
path `jupyter lab --gateway-url` uses, with token auth on, over HTTPS. Its kernel client
opens the channels WebSocket without headers (no token): it authenticates with a client
certificate from the daemon's client CA (GatewayClient.client_cert/client_key)."""

from typing import Any

import jupyter_kernel_test
from jupyter_core.utils import run_sync
from kernel_samples import PythonSamples
from nbos_harness import gateway_client_over_tls

ASYNC_METHODS = {"get_shell_msg", "get_iopub_msg", "get_stdin_msg", "get_control_msg", "wait_for_ready"}


class SyncGatewayClient:
    """GatewayKernelClient is an AsyncKernelClient; KernelTests drives a blocking
    client. Awaitable getters are run to completion, everything else passes through."""

    def __init__(self, kc: Any) -> None:
        self._kc = kc

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._kc, name)
        if name in ASYNC_METHODS:
            return run_sync(attr)
        return attr


def start_gateway_kernel(kernel_name: str = "python3"):
    from jupyter_server.gateway.managers import GatewayKernelManager

    km = GatewayKernelManager()
    run_sync(km.start_kernel)(kernel_name=kernel_name)
    kc = km.client()
    run_sync(kc.start_channels)()
    client = SyncGatewayClient(kc)
    client.wait_for_ready(timeout=60)
    return km, client


class TestNotebookOSThroughGatewayKernelManager(PythonSamples, jupyter_kernel_test.KernelTests):
    @classmethod
    def setUpClass(cls) -> None:
        cls.gateway = gateway_client_over_tls()
        cls.gateway.__enter__()
        cls.km, cls.kc = start_gateway_kernel(cls.kernel_name)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.kc.stop_channels()
        run_sync(cls.km.shutdown_kernel)()
        cls.gateway.__exit__(None, None, None)
