"""The Python side of the test support crate (tests/support): one loopback-cluster launcher
(`Cluster`, whose directory, tokens, PKI and host configs `nbos-test-cluster prepare`
writes, from the same Rust code as the daemon's integration tests), one config builder
(`daemon_config`, through `nbos-test-cluster config`) and one `run_cell`.

Importable by the pytest suites through their conftest.py; scripts add
`tests/support/python` to `sys.path` themselves."""

from nbos_testkit.bins import bin_dir
from nbos_testkit.cell import Cell, run_cell
from nbos_testkit.cluster import Cluster, prepare, wait_for
from nbos_testkit.config import daemon_config, write_config

__all__ = ["Cell", "Cluster", "bin_dir", "daemon_config", "prepare", "run_cell", "wait_for", "write_config"]
