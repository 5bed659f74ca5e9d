"""The meta store's history under faults: one client per host reads, writes and
compares-and-swaps a canary register of the meta group (`POST /api/v1/cluster/canary`,
one register per round) while the round's fault holds; the history (call and answer
times on one monotonic clock) is checked for linearizability by raft-store's checker
(`nbos chaos check-history`). See docs/chaos.md.

What counts as an answer: HTTP 200 (the value read, the write done, the CAS's outcome).
A 503 is a refusal before anything was proposed (no leader, not ready): the operation
did not happen and is left out. Anything else (a timeout, a reset connection, 504, 500)
leaves the outcome unknown: the checker lets such a write or CAS take effect at any time
after its call, or never. A client stops for the round after its second unknown outcome,
which keeps the search small (each unknown write may be concurrent with everything after
it).
"""

from __future__ import annotations

import json
import random
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

OP_TIMEOUT = 5.0        # one operation's answer
MAX_UNKNOWN = 2         # per client and round
PAUSE = 0.05            # between a client's operations


class CanaryClient(threading.Thread):
    def __init__(self, cluster, host: int, name: str, seed: int, history: list, lock: threading.Lock,
                 stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.c, self.host, self.name = cluster, host, name
        self.rng = random.Random(seed * 1000 + host)
        self.history, self.lock, self.stop = history, lock, stop
        self.seen: str | None = None
        self.errors: list[str] = []

    def call(self, body: dict) -> tuple[str, dict | None]:
        """('ok', answer) | ('refused', None) | ('unknown', None) | ('error', None)."""
        req = urllib.request.Request(
            self.c.host(self.host).url + "/api/v1/cluster/canary", data=json.dumps(body).encode(), method="POST",
            headers={"Authorization": f"token {self.c.operator_token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=OP_TIMEOUT, context=self.c.ssl) as r:
                return "ok", json.loads(r.read())
        except urllib.error.HTTPError as e:
            if e.code == 503:
                return "refused", None
            if e.code in (400, 401, 403, 404, 405, 415, 422):
                self.errors.append(f"host {self.host}: HTTP {e.code} for {body}: {e.read()[:300]!r}")
                return "error", None
            return "unknown", None
        except (OSError, ValueError):
            return "unknown", None

    def run(self) -> None:
        unknown, i = 0, 0
        while not self.stop.is_set() and unknown < MAX_UNKNOWN:
            i += 1
            value = f"h{self.host}-{i}"
            roll = self.rng.random()
            if roll < 0.4:
                body = {"op": "read", "name": self.name}
            elif roll < 0.7:
                body = {"op": "write", "name": self.name, "value": value}
            else:
                body = {"op": "cas", "name": self.name, "expected": self.seen, "new": value}
            call = time.monotonic_ns()
            how, answer = self.call(body)
            ret = time.monotonic_ns()
            if how == "error":
                return
            line = {"name": self.name, "op": body["op"], "call": call}
            if body["op"] == "write":
                line["value"] = value
            elif body["op"] == "cas":
                line["expected"], line["new"] = body["expected"], value
            if how == "ok":
                line["ret"] = ret
                if body["op"] == "read":
                    line["value"] = answer.get("value")
                    self.seen = line["value"]
                elif body["op"] == "cas":
                    line["ok"] = bool(answer.get("ok"))
                    self.seen = answer.get("value")
                else:
                    self.seen = value
            elif how == "unknown":
                unknown += 1
                line["ret"] = None
                if body["op"] == "cas":
                    line["ok"] = None
            else:  # refused: never proposed
                line = None
            if line is not None and not (line["op"] == "read" and line.get("ret") is None):
                with self.lock:
                    self.history.append(line)
            if how != "ok":
                time.sleep(0.3)
            time.sleep(PAUSE)


class CanaryWorkload:
    """One round's register clients: `start()` before the fault, `finish()` after healing."""

    def __init__(self, cluster, name: str, seed: int) -> None:
        self.c, self.name = cluster, name
        self.history: list[dict] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.clients = [CanaryClient(cluster, h.n, name, seed, self.history, self.lock, self.stop) for h in cluster.hosts]

    def start(self) -> None:
        for cl in self.clients:
            cl.start()

    def finish(self) -> None:
        self.stop.set()
        for cl in self.clients:
            cl.join(timeout=OP_TIMEOUT + 5)

    def check(self, nbos: Path, out: Path) -> tuple[dict, list[str]]:
        """Writes the history to `out` and checks it: (summary, problems)."""
        with self.lock:
            lines = list(self.history)
        out.write_text("".join(json.dumps(x) + "\n" for x in lines))
        problems = [e for cl in self.clients for e in cl.errors]
        summary = {"operations": len(lines), "answered": sum(1 for x in lines if x.get("ret") is not None)}
        if not lines:
            problems.append(f"register {self.name}: no operation was answered or pending")
            return summary, problems
        try:
            r = subprocess.run([str(nbos), "chaos", "check-history", "--json", str(out)],
                               capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            problems.append(f"register {self.name}: the linearizability check did not end in 300 s ({out})")
            return summary, problems
        try:
            verdict = json.loads(r.stdout)
        except ValueError:
            problems.append(f"register {self.name}: nbos chaos check-history failed: {r.stderr[-500:]}")
            return summary, problems
        summary["linearizable"] = verdict["linearizable"]
        if not verdict["linearizable"]:
            problems.append(f"register {self.name}: the meta store's history is not linearizable (history: {out})")
        return summary, problems
