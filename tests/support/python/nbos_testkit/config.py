"""The one config builder, from Python: `nbos-test-cluster config` (tests/support) merges
the given sections over a test daemon's base config — state and runtime directories under
`directory`, a loopback port it picks — serialises the daemon's own config types with
`toml` and checks the result as the daemon does. Callers pass a dict, never TOML text."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from nbos_testkit.bins import bin_dir


def daemon_config(directory: Path, sections: dict) -> str:
    """The config text of a daemon in `directory` with `sections` merged over the base
    (e.g. `{"kernel": {"python": sys.executable}, "gpu": {"driver": "fake", "fake_gpus": 1}}`)."""
    r = subprocess.run(
        [str(bin_dir() / "nbos-test-cluster"), "config", "--dir", str(directory), "--json", json.dumps(sections)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise RuntimeError(f"nbos-test-cluster config: exit {r.returncode}\n{r.stderr}")
    return r.stdout


def write_config(path: Path, directory: Path, sections: dict) -> Path:
    """Writes [`daemon_config`] to `path`; returns `path`."""
    path.write_text(daemon_config(directory, sections))
    return path
