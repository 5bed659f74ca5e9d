#!/usr/bin/env python3
"""Reproducer of FINDINGS.md #2 without any fault: two clients of ONE kernel, connected
through two different hosts' gateways, each run `log.append(id)` cells at the same time.
Every cell is acknowledged `ok`; afterwards the kernel's `log` must hold every id once.
Usage: repro_two_gateways.py [--cells N]  (root; NBOS_BIN_DIR as for run.py)."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from netns import ChaosCluster  # noqa: E402
from workload import KernelClient  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", type=int, default=30)
    ap.add_argument("--same-gateway", action="store_true", help="both clients through host 1 (control)")
    a = ap.parse_args()
    c = ChaosCluster(hosts=3)
    try:
        m = c.request(1, "/api/kernels", "POST", {"name": "notebookos-python-1gpu"}, timeout=120)
        a1 = KernelClient(c, m["id"], 1, 1, gateway=1)
        a2 = KernelClient(c, m["id"], 2, 1, gateway=1 if a.same_gateway else 2)
        assert a1.run_code("log = []", 60)[0] == "ok"
        acked: dict[str, list] = {"1": [], "2": []}

        def run(cl: KernelClient, name: str) -> None:
            for i in range(a.cells):
                cid = f"g{name}-{i}"
                st, meta, _, detail = cl.execute(f"log.append({cid!r})", 60)
                if st == "ok":
                    acked[name].append((cid, (meta.get("nbos_election") or {}).get("node_id")))

        ts = [threading.Thread(target=run, args=(a1, "1")), threading.Thread(target=run, args=(a2, "2"))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        st, out, d = a1.run_code("print(__import__('json').dumps(log))", 60)
        log = json.loads(out)
        want = [cid for v in acked.values() for cid, _ in v]
        missing = [x for x in want if x not in log]
        dup = sorted({x for x in log if log.count(x) > 1})
        execs = sorted({n for v in acked.values() for _, n in v})
        digests = {r["node_id"]: (c.request(r["node_id"], f"/api/v1/cluster/kernels/{m['id']}/digest") or {}).get("digest", "?")[:12]
                   for r in c.request(1, f"/api/kernels/{m['id']}")["replicas"]}
        print(f"acknowledged {len(want)} cells (executors {execs}); the namespace's log holds {len(log)}; "
              f"missing {len(missing)}: {missing[:10]}; duplicated: {dup[:10]}; replica digests {digests}")
        return 1 if missing or dup else 0
    finally:
        c.destroy()


if __name__ == "__main__":
    sys.exit(main())
