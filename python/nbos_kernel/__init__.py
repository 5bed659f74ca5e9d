"""NotebookOS kernel helper.

Loaded into every ipykernel that notebookosd starts (``%load_ext nbos_kernel`` or the
kernel's ``exec_lines``). It tracks which parts of the user namespace a cell changed,
so that the executing replica can export only those to its followers.
"""

from .namespace import NamespaceTracker, fingerprint

__all__ = ["NamespaceTracker", "fingerprint", "load_ipython_extension"]
__version__ = "0.1.0"


def load_ipython_extension(ipython):
    """IPython extension hook: start tracking the user namespace across cells."""
    tracker = NamespaceTracker(ipython.user_ns)
    ipython.user_ns_hidden["_nbos_tracker"] = tracker
    ipython.user_ns["_nbos_tracker"] = tracker
    ipython.events.register("post_run_cell", lambda result: tracker.end_cell())
