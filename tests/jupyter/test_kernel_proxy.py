"""jupyter_kernel_test through the `nbos kernel-proxy` kernelspec: a plain
jupyter_client KernelManager starts `nbos kernel-proxy`, which forwards to a
NotebookOS kernel behind the gateway."""

import jupyter_kernel_test
from kernel_samples import PythonSamples
from nbos_harness import daemon


class TestNotebookOSThroughKernelProxy(PythonSamples, jupyter_kernel_test.KernelTests):
    kernel_name = "notebookos-test"

    @classmethod
    def setUpClass(cls) -> None:
        daemon()
        super().setUpClass()
