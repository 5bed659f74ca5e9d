"""The Python side of the test support crate (tests/support): one loopback-cluster launcher
(`Cluster`, whose directory, tokens, PKI and host configs `nbos-test-cluster prepare`
writes, from the same Rust code as the daemon's integration tests), and one `run_cell`.

Importable by every pytest suite through the repository's conftest.py; scripts add
`tests/support/python` to `sys.path` themselves."""

from nbos_testkit.bins import bin_dir
from nbos_testkit.cell import Cell, run_cell
from nbos_testkit.cluster import Cluster, prepare

__all__ = ["Cell", "Cluster", "bin_dir", "prepare", "run_cell"]
