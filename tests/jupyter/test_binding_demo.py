"""The `make demo` workload: examples/run_in_turns.py runs the shipped notebook in
three kernels at once on two simulated GPUs through nbclient and the gateway, and
its report shows every cell ran and GPUs were bound per cell."""

import os
import re
import subprocess
import sys

from nbos_harness import REPO, Daemon


def test_three_notebooks_train_in_turns_on_two_gpus():
    d = Daemon(fake_gpus=2, idle_release="30s")
    try:
        r = subprocess.run(
            [sys.executable, str(REPO / "examples" / "run_in_turns.py"), "--url", d.url, "--nbos", d.nbos,
             "--kernels", "3"],
            capture_output=True, text=True, timeout=300, env=dict(os.environ, NBOS_TOKEN=d.token),
        )
    finally:
        d.stop()
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    # Every notebook trained twice with the exact result the notebook asserts.
    assert len(re.findall(r"^notebook \d: 4 cells", out, re.M)) == 3, out
    assert out.count("epoch 2: sum of weights 262143.8") == 3, out
    assert "cells run: 12 " in out and "on 2 GPU(s)" in out, out
    bound, reserved = map(float, re.search(r"bound per cell: ([\d.]+); .*session: ([\d.]+)", out).groups())
    # Binding per cell never binds more than reserving for whole sessions would.
    assert 0 < bound <= reserved, out
    assert "interactivity delay" in out, out
