"""Runs a notebook in several NotebookOS kernels at once (nbclient, through the
daemon's gateway via the `nbos kernel-proxy` kernelspec) and prints what binding
GPUs per cell did: cells run, GPU-seconds bound against what reserving a GPU for
each whole session would have bound, and the interactivity delays.

    python examples/run_in_turns.py --url http://127.0.0.1:8888 --nbos target/debug/nbos
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent


def get(url: str, token: str | None) -> bytes:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"token {token}")
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read()


def metric_values(text: str, name: str) -> dict[str, float]:
    """`name` samples of a Prometheus text page, by label string."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name):
            key, value = line.rsplit(" ", 1)
            out[key[len(name) :]] = float(value)
    return out


def quantile_from_buckets(buckets: dict[str, float], q: float) -> float | None:
    """Upper bound of the histogram bucket holding quantile `q`."""
    les = sorted(
        (float("inf") if k.split('le="')[1].rstrip('"}') == "+Inf" else float(k.split('le="')[1].rstrip('"}')), v)
        for k, v in buckets.items()
        if 'le="' in k
    )
    if not les or les[-1][1] == 0:
        return None
    target = q * les[-1][1]
    for le, count in les:
        if count >= target:
            return le
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="the daemon's base URL")
    ap.add_argument("--nbos", required=True, help="path of the nbos CLI")
    ap.add_argument("--token-file", help="file holding the API token, if the daemon needs one (or set NBOS_TOKEN)")
    ap.add_argument("--notebook", default=str(HERE / "train_in_turns.ipynb"))
    ap.add_argument("--kernels", type=int, default=3)
    ap.add_argument("--gateway-kernel", default="notebookos-python-1gpu", help="gateway kernelspec each kernel runs")
    ap.add_argument("--timeout", type=int, default=300, help="seconds one cell may take")
    args = ap.parse_args()
    # Never from argv, which every local user can read.
    args.token = open(args.token_file).read().strip() if args.token_file else os.environ.get("NBOS_TOKEN")

    import nbformat
    from nbclient import NotebookClient

    jupyter_path = Path(tempfile.mkdtemp(prefix="nbos-demo-kernels-"))
    cmd = [args.nbos, "--url", args.url, "install-kernelspec", "--name", "notebookos-demo"]
    cmd += ["--kernel-name", args.gateway_kernel, "--kernels-dir", str(jupyter_path / "kernels")]
    if args.token:
        # The proxy reads the token from a file (it never goes into kernel.json).
        token_file = jupyter_path / "token"
        token_file.touch(mode=0o600)
        token_file.write_text(args.token + "\n")
        cmd += ["--token-file", str(token_file)]
    subprocess.run(cmd, check=True, capture_output=True)
    # The kernel-proxy processes log to this terminal through nbclient: warnings only.
    os.environ.setdefault("NBOS_LOG", "warn")
    os.environ["JUPYTER_PATH"] = str(jupyter_path) + os.pathsep + os.environ.get("JUPYTER_PATH", "")

    before = get(args.url + "/metrics", args.token).decode()
    results: list[dict] = []
    errors: list[str] = []

    def run(i: int) -> None:
        nb = nbformat.read(args.notebook, as_version=4)
        t0 = time.monotonic()
        try:
            NotebookClient(nb, timeout=args.timeout, kernel_name="notebookos-demo").execute()
        except Exception as e:  # reported with the notebook's number
            errors.append(f"notebook {i}: {e}")
            return
        cells = [c for c in nb.cells if c.cell_type == "code"]
        printed = "".join(o.get("text", "") for c in cells for o in c.get("outputs", []))
        results.append({"i": i, "cells": len(cells), "seconds": time.monotonic() - t0, "printed": printed})

    print(f"== running {Path(args.notebook).name} in {args.kernels} kernels at once (nbclient -> kernel-proxy -> gateway)")
    started = time.monotonic()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(args.kernels)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - started
    for r in sorted(results, key=lambda r: r["i"]):
        epochs = [line for line in r["printed"].splitlines() if line.startswith("epoch")]
        print(f"notebook {r['i']}: {r['cells']} cells in {r['seconds']:.1f} s; " + "; ".join(epochs))
    for e in errors:
        print("FAILED:", e)

    after = get(args.url + "/metrics", args.token).decode()
    gpus = json.loads(get(args.url + "/api/v1/gpus", args.token))
    cells = sum(metric_values(after, "notebookos_cells_total").values()) - sum(
        metric_values(before, "notebookos_cells_total").values()
    )
    delays = metric_values(after, "notebookos_interactivity_delay_seconds_bucket")
    count = metric_values(after, "notebookos_interactivity_delay_seconds_count").get("", 0.0)
    total = metric_values(after, "notebookos_interactivity_delay_seconds_sum").get("", 0.0)
    print()
    print("== report")
    print(f"cells run: {int(cells)} in {wall:.1f} s, {args.kernels} kernels on {gpus.get('total', '?')} GPU(s)")
    bound, reserved = gpus.get("gpu_seconds_bound"), gpus.get("gpu_seconds_reserved")
    if bound is not None and reserved:
        print(
            f"GPU-seconds bound per cell: {bound:.1f}; reserving each kernel's GPUs for its whole session: "
            f"{reserved:.1f} ({100 * bound / reserved:.0f}%)"
        )
    if count:
        p50, p99 = quantile_from_buckets(delays, 0.5), quantile_from_buckets(delays, 0.99)
        print(f"interactivity delay (submit -> execution starts): mean {1000 * total / count:.0f} ms, p50 <= {p50} s, p99 <= {p99} s over {int(count)} cells")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
