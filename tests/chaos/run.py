#!/usr/bin/env python3
"""The fault campaign of issue 16: `run.py --rounds N --seed S --hosts H [--json]`.

Starts H notebookosd hosts in network namespaces (netns.py), creates replicated kernels,
and runs N rounds. A round: client threads run cells on every kernel without pause; one
fault (chosen from the seed) is injected and held; the fault is healed; the round waits
for every kernel's next acknowledged cell (recovery time) and for the cluster to be whole
again; then it checks every kernel (workload.check_kernel) and the processes a killed
host left behind. Anomalies are printed with the round's seed and history; the exit
status is 1 when there was any. See docs/chaos.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from canary import CanaryWorkload  # noqa: E402
from netns import ChaosCluster, bin_dir  # noqa: E402
from workload import CHECK, INIT, RESET, KernelClient, check_kernel  # noqa: E402

FAULTS = [
    "kill_restart",   # kill -9 of a daemon and its kernels, restarted at healing
    "freeze",         # SIGSTOP of a daemon and its kernels, SIGCONT at healing
    "isolate",        # one host cut off from every other host (nftables, both ways)
    "isolate_all",    # every host cut off from every other (no majority anywhere)
    "minority",       # a minority of hosts cut off together (one host when H < 5)
    "split",          # the hosts split in two halves (symmetric; H=3: 1 | 2)
    "one_way",        # one host's packets to every other host are lost; the other way works
    "latency",        # 30-150 ms delay + jitter on every host's ingress (fault proxy)
    "lossy",          # 15% of chunks retransmitted (+200 ms) and jitter on every link
    "disk_full",      # one host's state file system full; freed, then the host restarted
    "cluster_restart",  # every daemon killed, then all started again
    "isolate_crash",  # a host cut off, then killed and restarted while still cut off (nested)
    "migrate",        # a replica moved to a host without one while cells run (needs H >= 4)
    "leave",          # a replica's host drained and removed (`nbos cluster leave`, scale-in) while
                      # cells run, then back as a new host (new node id, empty state, `cluster join`)
]
# Faults that need a host holding no replica of a kernel (3 replicas per kernel).
NEEDS_SPARE_HOST = {"migrate", "leave"}
LEAVE_TIMEOUT = 180     # `nbos cluster leave --timeout`: the drain's moves
LEFTOVER_BOUND = 15     # a removed host's kernel processes are gone within this after it left
ENOSPC_BOUND = 30       # a full host's first failed write (logged) comes within this of the fill
ENOSPC_MARKS = ("No space", "ENOSPC", "os error 28")
DISK_ROOM_BYTES = 64 << 20  # a state disk with less room left than this after a round is an anomaly

# Bounds (seconds), stated in docs/chaos.md.
CELL_TIMEOUT = 20       # one cell's reply; past it the client moves to another gateway
STOP_BOUND = 30         # a host that stops itself (a failed raft log write) has exited within this
AVAIL_BOUND = 60        # a kernel with a live majority answers a cell within this under the fault
RECOVERY_BOUND = 90     # every kernel answers a cell within this after healing
READY_BOUND = 120       # the cluster is whole again (every host up) within this after healing
DIGEST_BOUND = 60       # every replica's namespace digest is equal within this after the check cell


def log_time(line: str, default: float) -> float:
    """The time a daemon log line was written (its RFC 3339 UTC stamp), else `default`."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)Z", line)
    if not m:
        return default
    from datetime import datetime, timezone

    return datetime.fromisoformat(m.group(1)).replace(tzinfo=timezone.utc).timestamp()


class Campaign:
    def __init__(self, args) -> None:
        self.a = args
        self.rng = random.Random(args.seed)
        self.faults: dict[str, int] = {}
        self.anomalies: list[dict] = []
        self.recovery: list[float] = []
        self.rounds: list[dict] = []
        self.notes: list[str] = []
        self.keep = False
        self.orphaned = 0
        self.pending_orphans: dict[int, list[tuple[int, str]]] = {}
        self.seen_history: set[str] = set()
        self.c: ChaosCluster | None = None
        self.clients: list[KernelClient] = []
        self.canary_ops = 0
        self.canary_answered = 0
        self.min_free_mib = 1 << 30

    def log(self, *msg) -> None:
        if not self.a.json or self.a.verbose:
            print(time.strftime("%H:%M:%S"), *msg, file=sys.stderr if self.a.json else sys.stdout, flush=True)

    # ------------------------------------------------------------ set-up

    def setup(self) -> None:
        self.c = ChaosCluster(hosts=self.a.hosts, seed=self.a.seed, host_ttl=self.a.host_ttl)
        self.log(f"cluster of {self.a.hosts} hosts up in {self.c.root}")
        for k in range(self.a.kernels):
            model = None
            for _ in range(30):
                model = self.c.request(1 + k % self.a.hosts, "/api/kernels", "POST",
                                       {"name": "notebookos-python-1gpu"}, timeout=120)
                if model and "id" in model:
                    break
                time.sleep(1)
            if not model or "id" not in model:
                raise RuntimeError(f"could not create kernel {k + 1}\n{self.c.logs()}")
            cl = KernelClient(self.c, model["id"], k + 1, self.a.seed, gateway=1 + k % self.a.hosts, sticky=self.a.sticky)
            st, _, d = cl.run_code(INIT, 120)
            if st != "ok":
                raise RuntimeError(f"kernel {k + 1}: init cell failed: {d}")
            self.clients.append(cl)
            self.log(f"kernel {k + 1}: {model['id']} on hosts {[r['node_id'] for r in model['replicas']]}")

    # ------------------------------------------------------------ one round

    def replicas(self, cl: KernelClient) -> list[int]:
        for h in self.c.hosts:
            if h.alive and not h.frozen:
                m = self.c.request(h.n, f"/api/v1/cluster/kernels/{cl.kernel_id}", timeout=5)
                if m and "replicas" in m:
                    # Host numbers (a host that left and came back has a new node id).
                    return [i for r in m["replicas"] if (i := self.c.index(r["node_id"])) is not None]
        return []

    def choose(self, r: int) -> tuple[str, dict]:
        kinds = self.a.faults or [f for f in FAULTS if self.a.hosts >= 4 or f not in NEEDS_SPARE_HOST]
        kind = kinds[(r - 1) % len(kinds)] if self.a.cycle else self.rng.choice(kinds)
        H = self.a.hosts
        hosts = list(range(1, H + 1))
        target = self.rng.choice(hosts)
        hold = self.rng.uniform(self.a.hold_min, self.a.hold_max)
        p: dict = {"target": target, "hold_s": round(hold, 1)}
        if kind == "minority":
            size = max(1, (H - 1) // 2)
            p["group"] = sorted(self.rng.sample(hosts, size))
        elif kind == "split":
            shuffled = hosts[:]
            self.rng.shuffle(shuffled)
            p["groups"] = [sorted(shuffled[: H // 2]), sorted(shuffled[H // 2:])]
        elif kind == "latency":
            p["delay_ms"], p["jitter_ms"] = self.rng.randint(30, 150), self.rng.randint(0, 50)
        elif kind == "lossy":
            p["loss"], p["jitter_ms"] = 0.15, self.rng.randint(5, 30)
        elif kind in ("migrate", "leave"):
            p["kernel"] = self.rng.randint(1, len(self.clients))
        return kind, p

    def down_hosts(self, kind: str, p: dict) -> set[int]:
        """Hosts cut off from the majority side while the fault holds."""
        H = self.a.hosts
        if kind in ("kill_restart", "freeze", "isolate", "one_way", "disk_full", "leave", "isolate_crash"):
            return {p["target"]}
        if kind == "minority":
            return set(p["group"])
        if kind == "split":
            a, b = p["groups"]
            if len(a) == len(b):
                return set(range(1, H + 1))  # no side has a majority of the meta group
            return set(min(a, b, key=len))
        if kind in ("cluster_restart", "isolate_all"):
            return set(range(1, H + 1))
        return set()

    def inject(self, kind: str, p: dict) -> None:
        c, t = self.c, p["target"]
        if kind == "kill_restart":
            pgid = c.host(t).proc.pid if c.host(t).proc else None
            self.orphans(t, pgid, c.kill(t))
        elif kind == "freeze":
            c.freeze(t)
        elif kind == "isolate":
            c.partition([[t], [n for n in range(1, self.a.hosts + 1) if n != t]])
        elif kind == "isolate_crash":
            c.partition([[t], [n for n in range(1, self.a.hosts + 1) if n != t]])
            time.sleep(min(2.0, p["hold_s"] / 3))
            pgid = c.host(t).proc.pid if c.host(t).proc else None
            self.orphans(t, pgid, c.kill(t))
            time.sleep(min(2.0, p["hold_s"] / 3))
            c.start(t)  # back on its state, still cut off until the healing
        elif kind == "isolate_all":
            c.partition([])
        elif kind == "minority":
            rest = [n for n in range(1, self.a.hosts + 1) if n not in p["group"]]
            c.partition([p["group"], rest])
        elif kind == "split":
            c.partition(p["groups"])
        elif kind == "one_way":
            c.one_way(t, [n for n in range(1, self.a.hosts + 1) if n != t])
        elif kind == "latency":
            rule = {"delay_ms": p["delay_ms"], "jitter_ms": p["jitter_ms"]}
            for h in c.hosts:
                c.shape(h.n, {o.ip: rule for o in c.hosts if o.n != h.n})
        elif kind == "lossy":
            rule = {"loss": p["loss"], "jitter_ms": p["jitter_ms"]}
            for h in c.hosts:
                c.shape(h.n, {o.ip: rule for o in c.hosts if o.n != h.n})
        elif kind == "disk_full":
            # A host holding a replica: its next cell's namespace export or apply writes to the
            # state disk at once. (A host with only its meta replica writes raft log entries,
            # which raft-engine appends into space it fallocated 2 MiB at a time beforehand,
            # so it may write for minutes on a full disk before a write fails.)
            placed = sorted({n for cl in self.clients for n in self.replicas(cl)})
            t = p["target"] = self.rng.choice(placed) if placed else t
            p["log_offset"] = c.host(t).log.stat().st_size
            p["filled_bytes"] = c.fill_disk(t)
            p["filled_at"] = time.time()
        elif kind == "cluster_restart":
            for h in c.hosts:
                pgid = h.proc.pid if h.proc else None
                self.orphans(h.n, pgid, c.kill(h.n))
        elif kind == "migrate":
            cl = self.clients[p["kernel"] - 1]
            placed = self.replicas(cl)
            p["from"] = self.rng.choice(placed) if placed else None
            source = c.host(p["from"]).node_id if p["from"] else None
            answer = c.request(t, f"/api/v1/cluster/kernels/{cl.kernel_id}/migrate", "POST",
                               {"reason": "drain", "from": source}, timeout=30, operator=True)
            p["outcome"] = (answer or {}).get("outcome")
            if p["outcome"] != "moving":
                self.anomaly("migrate", f"kernel {cl.no}: moving its replica off host {p['from']} was not begun: {answer}")
        elif kind == "leave":
            self.leave(p)

    def heal(self, kind: str, p: dict) -> None:
        c, t = self.c, p["target"]
        if kind == "kill_restart":
            c.start(t)
        elif kind == "freeze":
            c.thaw(t)
        elif kind in ("isolate", "isolate_all", "minority", "split", "one_way", "isolate_crash"):
            c.heal_network()
        elif kind in ("latency", "lossy"):
            c.unshape()
        elif kind == "disk_full":
            lines = self.log_lines(t, p["log_offset"], ENOSPC_MARKS)
            while not lines and time.time() < p["filled_at"] + ENOSPC_BOUND:
                time.sleep(0.5)
                lines = self.log_lines(t, p["log_offset"], ENOSPC_MARKS)
            p["enospc_after_s"] = round(log_time(lines[0], time.time()) - p["filled_at"], 2) if lines else None
            p["enospc_log_lines"] = len(lines)
            p["enospc_first"] = lines[0][-300:] if lines else None
            # A host whose raft log write failed stops itself (fail-stop): its process may still
            # be shutting down (alive) while its listener is already closed, so "up" means it
            # answers /metrics; one that neither answers nor exits within the bound is hung.
            m = c.metrics(t)
            stop_by = time.time() + STOP_BOUND
            while not m and c.host(t).alive and time.time() < stop_by:
                time.sleep(0.5)
                m = c.metrics(t)
            p["host_alive_when_full"] = c.host(t).alive
            p["answered_when_full"] = bool(m)
            p["metrics"] = [ln for ln in m.splitlines() if ("fail" in ln or "stopped" in ln or "error" in ln) and not ln.startswith("#") and not ln.rstrip().endswith(" 0")][:20]
            st = c.status(t)
            p["self_status_registered"] = bool(st and st.get("registered"))
            if not lines:
                self.anomaly("disk_full", f"host {t}: no error naming ENOSPC in its log within {ENOSPC_BOUND}s of its state disk filling")
            elif not m and c.host(t).alive:
                self.anomaly("disk_full", f"host {t}: its process runs but it has not answered /metrics for {STOP_BOUND}s after ENOSPC ({p['enospc_first']})")
            elif m and not any(ln.startswith("notebookos_sync_failures_total") for ln in p["metrics"]):
                # Still up (no raft log write failed, which would have stopped it): the failed
                # namespace writes must show on /metrics.
                self.anomaly("disk_full", f"host {t}: its writes failed (ENOSPC: {p['enospc_first']}) but notebookos_sync_failures_total did not move: {p['metrics']}")
            c.free_disk(t)
            # The operations guide: free space, then restart the daemon.
            pgid = c.host(t).proc.pid if c.host(t).proc else None
            self.orphans(t, pgid, c.kill(t))
            c.start(t)
        elif kind == "cluster_restart":
            for h in c.hosts:
                c.start(h.n)
        elif kind == "leave" and p.get("left"):
            # Back as a new host (a node id belongs to one state directory for its life).
            try:
                p["new_node_id"] = c.replace(t, timeout=READY_BOUND)
            except Exception as e:  # noqa: BLE001 - reported as the round's anomaly
                self.anomaly("leave", f"host {t} could not come back as a new host: {str(e)[:1500]}")
        elif kind == "migrate" and p.get("outcome") == "moving":
            cl = self.clients[p["kernel"] - 1]
            deadline, record = time.time() + READY_BOUND, None
            while time.time() < deadline:
                record = c.request(t, f"/api/v1/cluster/kernels/{cl.kernel_id}", timeout=5)
                hosts = [c.index(r["node_id"]) for r in (record or {}).get("replicas", [])]
                if record and not record.get("moving") and p["from"] not in hosts and len(hosts) == 3:
                    p["to"] = sorted(hosts)
                    break
                time.sleep(0.5)
            else:
                aborted = [ln[-300:] for h in c.hosts for ln in self.log_lines(h.n, 0, ("replica move aborted",)) if cl.kernel_id in ln]
                self.anomaly("migrate", f"kernel {cl.no}: the move off host {p['from']} did not end within {READY_BOUND}s: {record}; "
                                        f"aborts logged: {aborted[-3:]}")

    def log_lines(self, n: int, offset: int, marks: tuple[str, ...]) -> list[str]:
        """Lines of host n's log after `offset` that hold one of `marks`."""
        try:
            raw = self.c.host(n).log.read_bytes()[offset:]
        except OSError:
            return []
        log = re.sub(r"\x1b\[[0-9;]*m", "", raw.decode(errors="replace"))
        return [ln for ln in log.splitlines() if any(m in ln for m in marks)]

    def leave(self, p: dict) -> None:
        """Scale-in as an operator or the autoscaler does it: a host holding a replica of the
        round's kernel leaves (its replicas move off, then it leaves the meta group) while
        cells run; once it left, no kernel process may remain on it."""
        c = self.c
        placed = self.replicas(self.clients[p["kernel"] - 1])
        t = p["target"] = self.rng.choice(placed) if placed else p["target"]
        h = c.host(t)
        p["node_id"] = h.node_id
        try:
            # Secrets through the environment: argv is readable by every local user.
            env = dict(os.environ, NBOS_TOKEN=c.token, NBOS_OPERATOR_TOKEN=c.operator_token)
            r = subprocess.run(
                [c.nbos, "--url", h.url, "--ca-cert", str(c.ca),
                 "cluster", "leave", "--timeout", f"{LEAVE_TIMEOUT}s", "--json"],
                capture_output=True, text=True, timeout=LEAVE_TIMEOUT + 60, env=env,
            )
            p["left"], why = r.returncode == 0, r.stderr[-1500:]
        except subprocess.TimeoutExpired:
            p["left"], why = False, f"no answer in {LEAVE_TIMEOUT + 60}s"
        if not p["left"]:
            self.anomaly("leave", f"host {t} (node {h.node_id}) could not leave: {why}")
            return
        deadline = time.time() + LEFTOVER_BOUND
        while c.kernel_processes(t) and time.time() < deadline:
            time.sleep(0.3)
        left = c.kernel_processes(t)
        if left:
            self.anomaly("leftover", f"host {t} (node {h.node_id}) left the cluster but {LEFTOVER_BOUND}s later "
                                     f"kernel processes still run on it: {c.describe(left)}")

    def orphans(self, n: int, pgid, left: list[tuple[int, str]]) -> None:
        """Kernel processes that outlived their killed daemon: its next start must kill
        them (checked in `reaped`, after the round)."""
        if left:
            self.orphaned += len(left)
            self.pending_orphans.setdefault(n, []).extend(left)
            self.log(f"host {n} killed (daemon pid = pgid {pgid}); {len(left)} kernel process(es) outlived it for now")

    def reaped(self) -> None:
        """Every kernel process a killed daemon left is gone once that host runs again."""
        for n, left in list(self.pending_orphans.items()):
            if not self.c.host(n).alive:
                continue
            alive = [pid for pid, start in left if self.c.start_time(pid) == start]
            del self.pending_orphans[n]
            if not alive:
                continue
            what = f"host {n} started again but its killed daemon's kernel processes still run: {self.c.describe(alive)}"
            if self.a.known_orphans:
                self.notes.append(what)
            else:
                self.anomaly("leftover", what)
            for pid in alive:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    def anomaly(self, kind: str, what: str) -> None:
        # A lost effect stays lost: the same finding in a later round's check is not new.
        if kind == "history" and what in self.seen_history:
            return
        self.seen_history.add(what)
        self.log(f"ANOMALY [{kind}] {what}")
        self.anomalies.append({"round": self.round_no, "seed": self.a.seed, "kind": kind, "what": what})

    def worker(self, cl: KernelClient, stop: threading.Event) -> None:
        while not stop.is_set():
            cell = cl.run_cell(CELL_TIMEOUT)
            if cell.status != "ok":
                time.sleep(0.5)
            else:
                time.sleep(self.a.pause)

    def first_ack_after(self, cl: KernelClient, t: float) -> float | None:
        for cell in list(cl.cells):
            if cell.status == "ok" and cell.replied and cell.replied >= t and cell.sent >= t - CELL_TIMEOUT:
                return cell.replied
        return None

    def run_round(self, r: int) -> None:
        self.round_no = r
        kind, p = self.choose(r)
        self.faults[kind] = self.faults.get(kind, 0) + 1
        first_anomaly = len(self.anomalies)
        marks = {cl.no: len(cl.cells) for cl in self.clients}
        self.log(f"round {r}: {kind} {json.dumps(p)}")
        stop = threading.Event()
        threads = [threading.Thread(target=self.worker, args=(cl, stop), daemon=True) for cl in self.clients]
        for th in threads:
            th.start()
        canary = CanaryWorkload(self.c, f"s{self.a.seed}-r{r}", self.a.seed * 1000 + r)
        canary.start()
        time.sleep(self.a.warm)
        placement = {cl.no: self.replicas(cl) for cl in self.clients}
        t_inject = time.time()
        self.inject(kind, p)
        down = self.down_hosts(kind, p)
        H = self.a.hosts
        meta_majority = (H - len(down)) * 2 > H
        # Kernels that must keep answering: a majority of their replicas' hosts and of the
        # meta group on the live side. (Latency and loss: every kernel.)
        must = [cl for cl in self.clients if meta_majority and sum(1 for n in placement[cl.no] if n not in down) * 2 > len(placement[cl.no] or [0])
                and not (self.a.sticky and cl.gateway in down)]
        if kind == "disk_full":
            must = []  # the full host may be the executor; its stop is what the check records
        deadline = t_inject + p["hold_s"]
        while time.time() < deadline or (
            time.time() < t_inject + AVAIL_BOUND and any(self.first_ack_after(cl, t_inject) is None for cl in must)
        ):
            time.sleep(0.2)
        for cl in must:
            if self.first_ack_after(cl, t_inject) is None:
                self.anomaly("availability", f"kernel {cl.no} (replicas on {placement[cl.no]}, hosts down {sorted(down)}) answered no cell within {AVAIL_BOUND}s of the fault")
        t_heal = time.time()
        drawn = set(p)
        self.heal(kind, p)
        t_healed = time.time()
        found = {k: p[k] for k in p if k not in drawn or k in ("target", "node_id", "left", "outcome", "from")}
        if kind in ("leave", "migrate"):
            self.log(f"round {r}: {kind}: {json.dumps(found)}")
        # Recovery: every kernel's next acknowledged cell.
        rec = {}
        while time.time() < t_healed + RECOVERY_BOUND:
            for cl in self.clients:
                if cl.no not in rec:
                    t = self.first_ack_after(cl, t_healed)
                    if t is not None:
                        rec[cl.no] = t - t_healed
            if len(rec) == len(self.clients):
                break
            time.sleep(0.2)
        for cl in self.clients:
            if cl.no not in rec:
                self.anomaly("recovery", f"kernel {cl.no} answered no cell within {RECOVERY_BOUND}s of healing {kind}")
        if len(rec) < len(self.clients):
            # Censored: a kernel did not answer within the bound (an anomaly above).
            self.recovery.append(float(RECOVERY_BOUND))
        elif rec:
            self.recovery.append(max(rec.values()))
        stop.set()
        canary.finish()
        for th in threads:
            th.join(timeout=CELL_TIMEOUT + 15)
        p["canary"] = self.check_canary(r, canary)
        try:
            self.c.wait_ready(READY_BOUND)
        except Exception as e:
            self.anomaly("ready", f"the cluster was not whole {READY_BOUND}s after healing: {str(e)[:300]}")
        self.check(r, kind)
        cells = {cl.no: [c.record() for c in cl.cells[marks[cl.no]:]] for cl in self.clients}
        summary = {"round": r, "fault": kind, "params": p, "inject_s": round(t_heal - t_inject, 2),
                   "recovery_s": {k: round(v, 2) for k, v in rec.items()},
                   "acked": sum(1 for v in cells.values() for c in v if c["status"] == "ok"),
                   "unknown": sum(1 for v in cells.values() for c in v if c["status"] not in ("ok", "unsent"))}
        self.rounds.append(summary)
        self.log(f"round {r}: done: {json.dumps({k: summary[k] for k in ('inject_s', 'recovery_s', 'acked', 'unknown')})}")
        if len(self.anomalies) > first_anomaly:
            self.keep = True
            hist = self.c.root / f"history-round-{r}.json"
            hist.write_text(json.dumps({"seed": self.a.seed, "round": r, "fault": kind, "params": p,
                                        "t_inject": t_inject, "t_heal": t_heal, "t_healed": t_healed,
                                        "anomalies": self.anomalies[first_anomaly:], "cells": cells,
                                        "events": {cl.no: cl.events for cl in self.clients}}, indent=1))
            odd = [c for v in cells.values() for c in v if c["status"] != "ok"]
            print(f"\nround {r} FAILED: seed {self.a.seed}, fault {kind} {json.dumps(p)}; replay: "
                  f"run.py --seed {self.a.seed} --hosts {H} --kernels {self.a.kernels} --rounds {r}"
                  f"{' --faults ' + ','.join(self.a.faults) if self.a.faults else ''}{' --cycle' if self.a.cycle else ''}\n"
                  f"  history: {hist}\n  cells not acknowledged this round: {json.dumps(odd)[:4000]}",
                  file=sys.stderr, flush=True)

    def check_canary(self, r: int, canary: CanaryWorkload) -> dict:
        """The meta store's history this round is linearizable (canary.py)."""
        out = self.c.root / f"canary-round-{r}.jsonl"
        summary, problems = canary.check(bin_dir() / "nbos", out)
        self.canary_ops += summary["operations"]
        self.canary_answered += summary["answered"]
        for what in problems:
            self.anomaly("linearizability", what)
        return summary

    def check(self, r: int, kind: str) -> None:
        for cl in self.clients:
            # A whole-cluster restart keeps every namespace too (durable raft logs): no exception.
            st, out, detail = cl.run_code(CHECK, 120)
            if st != "ok":
                self.anomaly("check", f"kernel {cl.no}: the check cell failed: {detail}")
                continue
            try:
                state = json.loads(out.strip().splitlines()[-1])
            except (ValueError, IndexError):
                self.anomaly("check", f"kernel {cl.no}: check output unreadable: {out[:300]!r}")
                continue
            reps = self.replicas(cl)
            digests: dict[int, str | None] = {}
            deadline = time.time() + DIGEST_BOUND
            while True:
                digests = {}
                for n in reps:
                    d = self.c.request(n, f"/api/v1/cluster/kernels/{cl.kernel_id}/digest", timeout=65)
                    digests[n] = d.get("digest") if d else None
                live = [d for d in digests.values() if d]
                if (len(set(live)) == 1 and len(live) == len(reps)) or time.time() > deadline:
                    break
                time.sleep(1)
            if len([d for d in digests.values() if d]) < len(reps):
                self.anomaly("digest", f"kernel {cl.no}: no digest from some replica hosts after healing: {digests}")
            elections = None
            for n in reps:
                elections = self.c.request(n, f"/api/v1/cluster/kernels/{cl.kernel_id}/elections", timeout=10)
                if elections:
                    break
            bads = check_kernel(cl, state, digests, elections)
            for bad in bads:
                if "digests differ" in bad:
                    lag = {}
                    for n in reps:
                        rows = self.c.request(n, "/api/v1/cluster/replicas", timeout=10) or []
                        lag[n] = [r for r in rows if isinstance(r, dict) and r.get("kernel_id", r.get("id")) == cl.kernel_id] or rows
                    bad += f" (after {DIGEST_BOUND}s; replicas as their hosts report them: {json.dumps(lag)[:1500]})"
                self.anomaly("history", bad)
            if bads:
                # Reported once: the kernel goes on from a clean slate (a new epoch).
                cl.epoch += 1
                st2, _, d2 = cl.run_code(RESET, 120)
                if st2 != "ok":
                    self.anomaly("check", f"kernel {cl.no}: reset after an anomaly failed: {d2}")
        # No kernel process without its daemon, nor one that its restarted daemon did not kill.
        self.reaped()
        self.check_disk_room()
        for h in self.c.hosts:
            if not h.alive:
                left = self.c.kernel_processes(h.n)
                if left:
                    self.anomaly("leftover", f"host {h.n} is down but kernel processes run in its namespace: {self.c.describe(left)}")

    def check_disk_room(self) -> None:
        """Outside a `disk_full` fault no host's state disk runs short: one that does fails
        its writes (a broken replica, a fail-stop) and every later check of the run would
        flag what is only a too-small image (raft-engine keeps up to `purge_threshold`,
        256 MiB, of log before it purges)."""
        for h in self.c.hosts:
            if not h.alive:
                continue
            m = re.search(r"^notebookos_state_dir_free_bytes (\d+)", self.c.metrics(h.n), re.M)
            if not m:
                continue
            free = int(m.group(1))
            self.min_free_mib = min(self.min_free_mib, free >> 20)
            if free < DISK_ROOM_BYTES:
                self.anomaly("disk_room", f"host {h.n}: {free >> 20} MiB left on its state disk outside a disk_full fault "
                                          f"(ChaosCluster disk_mib={self.c.disk_mib}); its writes will fail")

    # ------------------------------------------------------------ report

    def report(self, wall: float) -> dict:
        def pct(q):
            xs = sorted(self.recovery)
            if not xs:
                return None
            return round(xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))], 2)

        acked = sum(1 for cl in self.clients for c in cl.cells if c.status == "ok")
        return {
            "rounds": len(self.rounds),
            "seed": self.a.seed,
            "hosts": self.a.hosts,
            "kernels": self.a.kernels,
            "faults": dict(sorted(self.faults.items())),
            "cells_sent": sum(1 for cl in self.clients for c in cl.cells if c.status != "unsent"),
            "cells_acknowledged": acked,
            "cells_unknown": sum(1 for cl in self.clients for c in cl.cells if c.status in ("error", "timeout", "lost")),
            "anomalies": len(self.anomalies),
            "anomaly_list": self.anomalies,
            "recovery_p50_s": pct(0.5),
            "recovery_p99_s": pct(0.99),
            "recovery_max_s": round(max(self.recovery), 2) if self.recovery else None,
            "meta_store_operations": self.canary_ops,
            "meta_store_operations_answered": self.canary_answered,
            "orphaned_kernel_processes": self.orphaned,
            "state_disk_min_free_mib": self.min_free_mib if self.min_free_mib < 1 << 30 else None,
            "notes": self.notes,
            "wall_s": round(wall, 1),
            "round_details": self.rounds,
        }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--kernels", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    ap.add_argument("--verbose", action="store_true", help="progress on stderr with --json")
    ap.add_argument("--faults", type=lambda s: s.split(","), default=None, help=f"comma list of {FAULTS}")
    ap.add_argument("--cycle", action="store_true", help="take the faults in order instead of at random")
    ap.add_argument("--hold-min", type=float, default=4.0)
    ap.add_argument("--hold-max", type=float, default=10.0)
    ap.add_argument("--warm", type=float, default=2.0, help="seconds of cells before the fault")
    ap.add_argument("--pause", type=float, default=0.2, help="pause between a kernel's cells")
    ap.add_argument("--host-ttl", default="2s")
    ap.add_argument("--known-orphans", action="store_true",
                    help="kernel processes a restarted daemon did not kill are a note, not an anomaly (FINDINGS.md #1)")
    ap.add_argument("--sticky", action="store_true",
                    help="clients keep their gateway through timeouts (move only when the socket fails): "
                         "avoids FINDINGS.md #2's trigger to look for other faults' bugs")
    ap.add_argument("--keep", action="store_true", help="keep the logs' directory")
    a = ap.parse_args()
    if a.faults:
        unknown = set(a.faults) - set(FAULTS)
        if unknown:
            ap.error(f"unknown faults {sorted(unknown)}")
    camp = Campaign(a)
    t0 = time.time()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    interrupted = False
    try:
        camp.setup()
        for r in range(1, a.rounds + 1):
            camp.run_round(r)
    except KeyboardInterrupt:
        interrupted = True
        camp.notes.append("interrupted")
    except Exception as e:
        camp.anomalies.append({"round": getattr(camp, "round_no", 0), "seed": a.seed, "kind": "harness", "what": f"{type(e).__name__}: {e}"[:3000]})
    finally:
        keep = a.keep or camp.keep or bool(camp.anomalies)
        if camp.c is not None:
            for cl in camp.clients:
                cl.close()
            camp.c.destroy(keep=keep)
            if keep:
                print(f"logs kept in {camp.c.root}", file=sys.stderr)
    rep = camp.report(time.time() - t0)
    if a.json:
        print(json.dumps(rep, indent=1))
    else:
        print(f"\nchaos campaign: {rep['rounds']} rounds, seed {a.seed}, {a.hosts} hosts, {a.kernels} kernels, {rep['wall_s']} s")
        print(f"faults: {rep['faults']}")
        print(f"cells: {rep['cells_sent']} sent, {rep['cells_acknowledged']} acknowledged, {rep['cells_unknown']} unknown")
        print(f"meta store: {rep['meta_store_operations']} canary operations ({rep['meta_store_operations_answered']} answered), "
              f"every round's history checked for linearizability")
        print(f"recovery (healing -> next cell of every kernel): p50 {rep['recovery_p50_s']} s, p99 {rep['recovery_p99_s']} s, max {rep['recovery_max_s']} s")
        print(f"state disks: at least {rep['state_disk_min_free_mib']} MiB free after every round")
        print(f"anomalies: {rep['anomalies']}")
        for an in rep["anomaly_list"]:
            print(f"  round {an['round']} [{an['kind']}] {an['what']}")
    return 1 if rep["anomalies"] or interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
