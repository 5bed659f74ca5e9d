"""Where the binaries are: $NBOS_BIN_DIR, else what `cargo build` puts in target/debug."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]


def bin_dir() -> Path:
    """The directory holding notebookosd, nbos and nbos-test-cluster (built if unset)."""
    env = os.environ.get("NBOS_BIN_DIR")
    if env:
        return Path(env)
    subprocess.run(
        ["cargo", "build", "-q", "-p", "notebookosd", "-p", "nbos-cli", "-p", "nbos-test-support", "--bins"], cwd=REPO, check=True
    )
    return Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target") / "debug"
