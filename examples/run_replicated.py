"""Runs a notebook in several replicated NotebookOS kernels at once on a local cluster
(each kernel is three replicas on three hosts), shows which host executed each cell,
checks that every replica holds the same namespace, then kills the host that ran a
kernel's last cell (`kill -9` of its daemon and its kernel processes) and shows the
kernel carry on from a survivor with all its state, and the restarted host catch up.

    python examples/run_replicated.py --urls http://127.0.0.1:8881,... --nbos target/debug/nbos \
        --pidfiles .nbos/demo/host1/pid,... --restart "scripts/demo.sh restart-host {i}"

The client is jupyter_client (what nbclient and papermill use) through the
`nbos kernel-proxy` kernelspec, given every host's gateway.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The test kit's run_cell (tests/support/python).
sys.path.insert(0, str(HERE.parent / "tests" / "support" / "python"))
from nbos_testkit import run_cell as run_cell_on  # noqa: E402


def tls_context():
    """https:// hosts: trust the cluster CA in $NBOS_CA_CERT (what `nbos` reads too)."""
    ca = os.environ.get("NBOS_CA_CERT")
    return ssl.create_default_context(cafile=ca) if ca else None


def get(url: str):
    try:
        with urllib.request.urlopen(url, timeout=10, context=tls_context()) as r:
            return json.loads(r.read())
    except OSError:
        return None


def wait_for(what: str, cond, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.2)
    raise SystemExit(f"demo: timed out waiting for {what}")


def run_cell(kc, code: str, timeout: float) -> dict:
    """Executes `code` (the test kit's run_cell); returns status, stdout, stderr and errors,
    and the executor's host."""
    c = run_cell_on(kc, code, timeout)
    return {
        "status": c.status,
        "out": c.stdout.strip(),
        "err": "".join([c.stderr, *c.errors]).strip(),
        "host": c.host,
    }


def digests(urls: list[str], kernel_id: str) -> dict[int, str]:
    """Namespace digest of each replica, by host."""
    out = {}
    for u in urls:
        d = get(f"{u}/api/v1/cluster/kernels/{kernel_id}/digest")
        if d:
            out[d["node_id"]] = d["digest"]
    return out


def metric_sum(urls: list[str], name: str) -> float:
    total = 0.0
    for u in urls:
        try:
            with urllib.request.urlopen(u + "/metrics", timeout=10, context=tls_context()) as r:
                text = r.read().decode()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--urls", required=True, help="every host's base URL, comma separated")
    ap.add_argument("--nbos", required=True, help="path of the nbos CLI")
    ap.add_argument("--pidfiles", required=True, help="each host's daemon pid file (process group leader), comma separated")
    ap.add_argument("--restart", required=True, help="command that restarts host {i} (1-based)")
    ap.add_argument("--notebook", default=str(HERE / "train_replicated.ipynb"))
    ap.add_argument("--kernels", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=120, help="seconds one cell may take")
    args = ap.parse_args()
    urls = args.urls.split(",")
    pidfiles = args.pidfiles.split(",")

    import nbformat
    from jupyter_client.manager import KernelManager

    jupyter_path = Path(tempfile.mkdtemp(prefix="nbos-demo-kernels-"))
    subprocess.run(
        [args.nbos, "install-kernelspec", "--name", "notebookos-demo-cluster", "--gpus", "1",
         "--kernels-dir", str(jupyter_path / "kernels"), "--gateway", ",".join(urls)],
        check=True,
        capture_output=True,
    )
    os.environ.setdefault("NBOS_LOG", "warn")
    os.environ["JUPYTER_PATH"] = str(jupyter_path) + os.pathsep + os.environ.get("JUPYTER_PATH", "")
    cells = [c.source for c in nbformat.read(args.notebook, as_version=4).cells if c.cell_type == "code"]

    kernels: list[tuple[KernelManager, object]] = []
    for _ in range(args.kernels):
        km = KernelManager(kernel_name="notebookos-demo-cluster")
        km.start_kernel()
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=120)
        kernels.append((km, kc))
    listed = get(urls[0] + "/api/kernels") or []
    ids = [k["id"] for k in sorted(listed, key=lambda k: k.get("last_activity", ""))]
    for k in listed:
        hosts = ", ".join(f"replica {r['replica']} on host {r['node_id']}" for r in k.get("replicas", []))
        print(f"kernel {k['id'][:8]}: {hosts}")

    results: dict[int, list[dict]] = {}
    failed: list[str] = []

    def run(i: int) -> None:
        _, kc = kernels[i]
        rows = []
        for code in cells:
            r = run_cell(kc, code, args.timeout)
            rows.append(r)
            if r["status"] != "ok":
                failed.append(f"notebook {i}: {r['err']}")
                break
        results[i] = rows

    print(f"\n== {Path(args.notebook).name} in {args.kernels} replicated kernels at once, 1 simulated GPU per host")
    started = time.monotonic()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(kernels))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - started
    for i in sorted(results):
        hosts = " ".join(str(r["host"]) for r in results[i])
        epochs = [r["out"] for r in results[i] if r["out"].startswith("epoch")]
        print(f"notebook {i}: cells ran on hosts [{hosts}]; " + "; ".join(epochs))
    for f in failed:
        print("FAILED:", f)

    print("\n== every replica holds the same namespace (nbos_kernel.namespace_digest on each host)")
    # A cell is acknowledged once its namespace changes are committed; followers apply
    # them right after, so give them a moment.
    for kid in ids:
        deadline = time.monotonic() + 30
        d = digests(urls, kid)
        while not (len(set(d.values())) == 1 and len(d) == len(urls)) and time.monotonic() < deadline:
            time.sleep(0.2)
            d = digests(urls, kid)
        same = len(set(d.values())) == 1 and len(d) == len(urls)
        print(f"kernel {kid[:8]}: " + ", ".join(f"host {h} {v[:12]}" for h, v in sorted(d.items())) + ("  equal" if same else "  DIFFERENT"))
        if not same:
            failed.append(f"kernel {kid}: replicas differ")

    # Read before the kill: a killed host's counters are gone with it.
    elections = metric_sum(urls, "notebookos_election_latency_seconds_count")
    election_s = metric_sum(urls, "notebookos_election_latency_seconds_sum")

    # Failover: the host that ran kernel 0's last cell dies with its kernel processes.
    km0, kc0 = kernels[0]
    victim = results[0][-1]["host"] if results.get(0) else None
    if victim:
        pid = int(Path(pidfiles[victim - 1]).read_text())
        print(f"\n== kill -9 host {victim} (daemon pid {pid} and its kernels), which ran kernel 0's last cell")
        os.killpg(pid, signal.SIGKILL)
        check = "print(f'{len(losses)} epochs so far; sum of weights {float(w.sum()):.1f}')"
        r = run_cell(kc0, check, args.timeout)
        if r["status"] != "ok" and ("GatewayConnectionLost" in r["err"] or "ExecutorHostDied" in r["err"]):
            # The cell was in flight on the dead host (as executor, or as the client's gateway):
            # it gets an error, never a hang, and the user runs it again.
            print(f"the cell in flight when host {victim} died got: {r['err'].splitlines()[0]}")
            r = run_cell(kc0, check, args.timeout)
        print(f"next cell ran on host {r['host']}: {r['out'] or r['err']}")
        r2 = run_cell(kc0, cells[-1], args.timeout)
        print(f"and trained on host {r2['host']}: {r2['out'] or r2['err']}")
        if r["status"] != "ok" or r2["status"] != "ok" or r["host"] == victim:
            failed.append("failover: the kernel did not carry on from a survivor")
        print(f"\n== restart host {victim} with its state directory: its replica comes back and catches up")
        subprocess.run(args.restart.format(i=victim), shell=True, check=True)
        kid0 = next((k for k in ids if k), None)
        try:
            wait_for("the restarted replica to catch up", lambda: len(set(digests(urls, kid0).values())) == 1
                     and len(digests(urls, kid0)) == len(urls), 120)
            d = digests(urls, kid0)
            print(f"kernel {kid0[:8]}: " + ", ".join(f"host {h} {v[:12]}" for h, v in sorted(d.items())) + "  equal")
        except SystemExit as e:
            failed.append(str(e))

    n_cells = sum(len(r) for r in results.values())
    print("\n== report")
    print(f"cells run: {n_cells} in {wall:.1f} s by {len(kernels)} kernels x 3 replicas on {len(urls)} hosts")
    print(f"executing hosts per notebook: " + "; ".join(
        f"{i}: {sorted({r['host'] for r in rows})}" for i, rows in sorted(results.items())))

    if elections:
        print(
            f"gateway -> first output: mean {1000 * election_s / elections:.1f} ms over the {int(elections)} cells "
            "before the kill (election and kernel start, plus waiting for a free GPU when every replica's host "
            "was busy)"
        )

    print("\n== nbos kernels (replicas, roles, lag)")
    subprocess.run([args.nbos, "--url", urls[0], "kernels"], check=False)
    for km, kc in kernels:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
