"""NotebookOS kernel helper.

Loaded into every ipykernel that notebookosd starts (``%load_ext nbos_kernel`` or the
kernel's ``exec_lines``). It tracks which parts of the user namespace a cell changed,
so that the executing replica can export only those to its followers
(``nbos_kernel.sync``: ``export_cell``, ``apply_cell``, ``namespace_digest``).
"""

from .namespace import NamespaceTracker, fingerprint
from .sync import (
    apply_cell,
    export_cell,
    mark_changed,
    namespace_digest,
    namespace_digests,
    namespace_report,
    restore_export,
    set_execution_count,
)

__all__ = [
    "NamespaceTracker",
    "apply_cell",
    "export_cell",
    "fingerprint",
    "load_ipython_extension",
    "mark_changed",
    "namespace_digest",
    "namespace_digests",
    "namespace_report",
    "restore_export",
    "set_execution_count",
]
__version__ = "0.1.0"


def load_ipython_extension(ipython):
    """IPython extension hook: start tracking the user namespace across cells."""
    tracker = NamespaceTracker(ipython.user_ns)
    ipython.user_ns_hidden["_nbos_tracker"] = tracker
    ipython.user_ns["_nbos_tracker"] = tracker
    tracker.hooked = True
    ipython.events.register("pre_run_cell", lambda info: tracker.cell_started())
    ipython.events.register("post_run_cell", lambda result: tracker.end_cell())
